"""Human spot-check of the judge.

    python -m rag_experiments.spotcheck sample RUN -n 20 [--stratify] [--seed 0] [--out FILE.csv]
    python -m rag_experiments.spotcheck score RUN labels.csv [--no-log]

``sample`` writes a CSV of judged claims from the run's per-query table (one row per claim: the
query, the claim, the exact context the judge saw, the judge's verdict, score and rationale, the
answer) with an empty ``human_verdict`` column. Claims are drawn without replacement, seeded, by
systematic πps with size ``1 + 3·exp(−|score − threshold| / s)`` (``s`` = the median distance of
all claims' scores to the judge's threshold) so that borderline verdicts are over-weighted when the
judge gives scores; ``--stratify`` splits n evenly across the verdict labels first. Each row
records its exact ``inclusion_prob``.

``score`` reads the filled CSV (``human_verdict`` supported / unsupported, any case; blank rows
skipped and counted), takes each claim's judge verdict from the run, and reports agreement,
Cohen's κ (bootstrap 95 % CI), the confusion matrix, leniency P(judge supported | human
unsupported) and strictness. They are weighted by 1 / ``inclusion_prob`` (Horvitz–Thompson), so
they estimate the run's judged claims, with the labelled sample's own figures beside them; without
``inclusion_prob`` they describe the sample only, and the summary says which. Claims the judge left
``unparseable`` are counted apart. ``score`` also prints the judge-corrected faithfulness: the
prediction-powered (PPI) estimate of the share of the run's judged claims a human would call
supported, with its 95 % CI, beside the judge-only share (:mod:`rag_experiments.analysis.ppi`,
``docs/spotcheck.md``). Logged to the run as ``spotcheck/*`` metrics and artifacts; a
bad label file gets ``FILE:LINE: field: what is wrong`` lines on stderr and exit 2.

(Slightly over 500 lines: sampling, reading labels and scoring share the CSV's column contract.)
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from mlflow.entities import Metric, Run
from mlflow.tracking import MlflowClient

from rag_experiments.analysis.agreement import (
    agreement_figures,
    inclusion_probabilities,
    kappa_ci,
    systematic_pps,
)
from rag_experiments.analysis.ppi import Estimate, judge_only, ppi_mean
from rag_experiments.tracking.runs import (
    RunInputError,
    load_per_query,
    parse_json,
    resolve_run,
    run_label,
    tracking_uri,
)

COLUMNS = [
    "item_id",
    "query",
    "claim",
    "context",
    "judge_verdict",
    "judge_score",
    "judge_rationale",
    "answer",
    "inclusion_prob",
    "human_verdict",
]
REQUIRED = ("item_id", "claim", "human_verdict")
HUMAN_LABELS = ("supported", "unsupported")
BORDERLINE_BOOST = 3.0


class LabelFileError(Exception):
    """A malformed label file; ``problems`` are ``FILE:LINE: field: what is wrong`` lines."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


# --------------------------------------------------------------------------------------------- claims


def item_id(query_id: str, index: int) -> str:
    return f"{query_id}#{index}"


def judged_claims(table: pd.DataFrame) -> pd.DataFrame:
    """One row per judged claim (columns of the CSV except ``human_verdict``), in table order."""
    if "verdicts" not in table.columns:
        raise RunInputError("the run has no judged claims (no 'verdicts' column: a retrieval-only run?)")
    rows = []
    for r in table.itertuples(index=False):
        rd = r._asdict()
        for i, v in enumerate(parse_json(rd.get("verdicts"), [])):
            score = v.get("score")
            rows.append(
                {
                    "item_id": item_id(str(rd["id"]), i),
                    "query": rd.get("query", ""),
                    "claim": v.get("claim", ""),
                    "context": rd.get("context", "") or "",
                    "judge_verdict": v.get("label", ""),
                    "judge_score": float(score) if score is not None else float("nan"),
                    "judge_rationale": v.get("rationale", "") or "",
                    "answer": rd.get("answer", "") or "",
                }
            )
    return pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("inclusion_prob", "human_verdict")])


def judge_threshold(run: Run) -> float | None:
    """The score threshold the judge decides at (LLM judges: ``judge.threshold``; heuristic:
    ``judge.sim_threshold``), from the run's params."""
    params = run.data.params
    for key in ("judge.threshold", "judge.sim_threshold"):
        try:
            return float(params[key])
        except (KeyError, TypeError, ValueError):
            continue
    return None


def sample_weights(scores: np.ndarray, threshold: float | None) -> np.ndarray:
    """``1 + 3·exp(−|score − threshold| / s)``; all ones without scores or threshold."""
    w = np.ones(len(scores))
    if threshold is None:
        return w
    d = np.abs(np.asarray(scores, float) - threshold)
    ok = ~np.isnan(d)
    if not ok.any():
        return w
    scale = float(np.median(d[ok])) or 1e-9
    w[ok] += BORDERLINE_BOOST * np.exp(-d[ok] / scale)
    return w


def sample_claims(
    claims: pd.DataFrame, n: int, stratify: bool = False, seed: int = 0, threshold: float | None = None
) -> pd.DataFrame:
    """n claims, seeded, borderline ones over-weighted; stratified by verdict when asked.

    Within the population (or each verdict stratum with its quota q) claim i is drawn with
    probability π_i = min(1, c·w_i), Σπ = q (:func:`inclusion_probabilities`, systematic πps);
    π_i is recorded as ``inclusion_prob`` so that scores can be weighted back to the run.
    """
    rng = np.random.default_rng(seed)
    w = sample_weights(claims["judge_score"].to_numpy(float), threshold)
    idx = np.arange(len(claims))
    groups, quota = {"all": idx}, {"all": n}
    if stratify:
        labels = sorted(claims["judge_verdict"].unique())
        groups = {lab: idx[(claims["judge_verdict"] == lab).to_numpy()] for lab in labels}
        quota = dict.fromkeys(labels, 0)
        left = n
        while left > 0:  # even split; a label with too few claims passes its share on
            open_ = [lab for lab in labels if quota[lab] < len(groups[lab])]
            if not open_:
                break
            for lab in open_:
                if left == 0:
                    break
                quota[lab] += 1
                left -= 1
    pi = np.zeros(len(claims))
    chosen: list[int] = []
    for lab, g in groups.items():
        pi[g] = inclusion_probabilities(w[g], quota[lab])
        chosen += list(g[systematic_pps(pi[g], rng)]) if quota[lab] else []
    out = claims.iloc[sorted(chosen)].copy()
    out["inclusion_prob"] = pi[sorted(chosen)]
    out["human_verdict"] = ""
    return out.reset_index(drop=True)


# --------------------------------------------------------------------------------------------- scoring


@dataclass
class Labels:
    rows: pd.DataFrame  # item_id, claim, human (lower-case), judge (the run's verdict), score, pi
    n_blank: int
    path: Path
    weighted: bool = False  # the file has inclusion probabilities (rows' ``pi``)
    n_population: int = 0  # the run's judged claims with a parseable verdict


def _inclusion_prob(raw: str | None, where: str) -> tuple[float, str | None]:
    """(π, problem): π must be a number in (0, 1]; NaN when the file has no such column."""
    if raw is None:
        return float("nan"), None
    try:
        pi = float(raw)
    except ValueError:
        pi = float("nan")
    if not 0 < pi <= 1:
        return pi, f"{where}: inclusion_prob: {raw!r} is not a probability in (0, 1] (keep the sampled value)"
    return pi, None


def _ws(text: str) -> str:
    return " ".join(text.split())  # spreadsheets re-wrap long cells


def read_labels(path: Path, claims: pd.DataFrame) -> Labels:
    """Parse and validate the filled CSV against the run's judged claims."""
    problems: list[str] = []
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise LabelFileError([f"{name}:0: file: cannot read ({e.strerror})"]) from None
    try:
        f = io.StringIO(raw.decode("utf-8-sig"), newline="")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise LabelFileError(
            [f"{name}:{line}: file: not valid UTF-8 ({e.reason} at byte {e.start})"]
        ) from None
    by_id = claims.set_index("item_id")
    rows, n_blank, seen = [], 0, {}
    with f:
        reader = csv.reader(f, strict=True)  # an unclosed quote is an error, not a field to EOF
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise LabelFileError(
                [
                    f"{name}:1: {c}: missing column (the header has: {', '.join(header) or 'nothing'})"
                    for c in missing
                ]
            )
        while True:
            line = reader.line_num + 1  # where the next record starts (a quoted field may span lines)
            try:
                values = next(reader, None)
            except csv.Error as e:
                raise LabelFileError([*problems, f"{name}:{line}: row: not valid CSV ({e})"]) from None
            if values is None:
                break
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) > len(header):
                problems.append(f"{name}:{line}: row: {len(values)} fields, the header has {len(header)}")
                continue
            rec = dict(zip(header, values, strict=False))
            iid = (rec.get("item_id") or "").strip()
            human = (rec.get("human_verdict") or "").strip().lower()
            if not human:
                n_blank += 1
                continue
            if human not in HUMAN_LABELS:
                problems.append(
                    f"{name}:{line}: human_verdict: {rec.get('human_verdict')!r} is not one of "
                    f"{', '.join(HUMAN_LABELS)}"
                )
                continue
            if iid not in by_id.index:
                problems.append(f"{name}:{line}: item_id: {iid!r} is not a judged claim of the run")
                continue
            if _ws(rec.get("claim") or "") != _ws(str(by_id.at[iid, "claim"])):
                problems.append(
                    f"{name}:{line}: claim: does not match the run's claim {iid} "
                    f"({str(by_id.at[iid, 'claim'])[:80]!r})"
                )
                continue
            if iid in seen:
                problems.append(f"{name}:{line}: item_id: {iid!r} already labelled on line {seen[iid]}")
                continue
            pi, problem = _inclusion_prob(rec.get("inclusion_prob"), f"{name}:{line}")
            if problem:
                problems.append(problem)
                continue
            seen[iid] = line
            rows.append(
                {
                    "item_id": iid,
                    "claim": by_id.at[iid, "claim"],
                    "human": human,
                    "judge": str(by_id.at[iid, "judge_verdict"]),
                    "score": by_id.at[iid, "judge_score"],
                    "pi": pi,
                }
            )
    if problems:
        raise LabelFileError(problems)
    if not rows:  # scoring nothing is not a result: say so and fail
        raise LabelFileError(
            [
                f"{name}: human_verdict: no claim labelled ({n_blank} blank rows); fill in supported / unsupported"
            ]
        )
    df = pd.DataFrame(rows, columns=["item_id", "claim", "human", "judge", "score", "pi"])
    n_pop = int(claims["judge_verdict"].isin(HUMAN_LABELS).sum())
    return Labels(df, n_blank, path, weighted="inclusion_prob" in header, n_population=n_pop)


@dataclass
class Agreement:
    """Headline figures estimate the run's claims when ``weighted``, else describe the sample."""

    n: int  # labelled claims with a parseable judge verdict (the ones agreement and κ are on)
    n_blank: int
    n_judge_unparseable: int
    agreement: float
    kappa: float
    kappa_ci: tuple[float, float]
    confusion: pd.DataFrame  # rows human, columns judge (sample counts)
    leniency: float  # P(judge supported | human unsupported)
    strictness: float  # P(judge unsupported | human supported)
    weighted: bool = False  # headline figures weighted by 1/inclusion_prob
    n_population: int = 0  # the run's judged claims with a parseable verdict
    sample: dict[str, float] = field(default_factory=dict)  # unweighted figures of the labelled claims
    unparseable_by_human: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    ppi: Estimate | None = None  # judge-corrected claim-level supported rate of the run
    judge_only: Estimate | None = None  # the judge's own supported rate over the same claims


def faithfulness_estimates(labels: Labels, claims: pd.DataFrame) -> tuple[Estimate, Estimate]:
    """(PPI, judge-only) share of the run's parseable judged claims that are supported.

    f = judge says supported over all those claims; Y − f on the labelled ones, weighted by
    1 / inclusion_prob when the file has it, else taken as a simple random sample.
    """
    pop = claims[claims["judge_verdict"].isin(HUMAN_LABELS)]
    f_all = (pop["judge_verdict"] == "supported").to_numpy(float)
    ok = labels.rows[labels.rows["judge"].isin(HUMAN_LABELS)]
    y, f = (ok["human"] == "supported").to_numpy(float), (ok["judge"] == "supported").to_numpy(float)
    pi = ok["pi"].to_numpy(float) if labels.weighted else None
    return ppi_mean(f_all, y, f, pi), judge_only(f_all)


def score_labels(labels: Labels, seed: int = 0, n_resamples: int = 2000) -> Agreement:
    df = labels.rows
    unp = df[~df["judge"].isin(HUMAN_LABELS)]
    ok = df[df["judge"].isin(HUMAN_LABELS)]
    h, j = ok["human"].to_numpy(), ok["judge"].to_numpy()
    w = 1.0 / ok["pi"].to_numpy(float) if labels.weighted else None  # Horvitz–Thompson weights
    conf = pd.crosstab(pd.Categorical(h, HUMAN_LABELS), pd.Categorical(j, HUMAN_LABELS), dropna=False)
    conf.index = [f"human {x}" for x in HUMAN_LABELS]
    conf.columns = [f"judge {x}" for x in HUMAN_LABELS]
    head = agreement_figures(h, j, w)
    return Agreement(
        n=len(ok),
        n_blank=labels.n_blank,
        n_judge_unparseable=len(unp),
        kappa_ci=kappa_ci(h, j, w, seed=seed, n_resamples=n_resamples),
        confusion=conf.astype(int),
        weighted=labels.weighted,
        n_population=labels.n_population,
        sample=agreement_figures(h, j, None),
        unparseable_by_human=unp["human"].value_counts().to_dict(),
        **head,
    )


def self_preference_warning(run: Run) -> str | None:
    tags = run.data.tags
    gen, judge = tags.get("generator_model"), tags.get("judge_model")
    same = tags.get("judge_is_generator") == "true" or (
        gen and judge and gen not in ("None", "") and gen == judge
    )
    if same:
        return (
            f"warning: the judge model equals the generator model ({judge or gen}): the judge grades its own "
            "answers (self-preference bias); read its faithfulness with care"
        )
    return None


def _f(x: float, nd: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _ppi_lines(ag: Agreement) -> list[str]:
    if ag.ppi is None or ag.judge_only is None:
        return []
    p, j = ag.ppi, ag.judge_only
    design = "1 / inclusion_prob weights" if ag.weighted else "labelled rows taken as a simple random sample"
    return [
        f"Faithfulness = share of the run's {j.n} judged claims (parseable verdicts) a human would call "
        "supported (claim-level, pooled over queries):",
        "",
        "| estimate | value | 95 % CI |",
        "|---|---|---|",
        f"| judge-corrected (PPI, {p.n} labels, {design}) | {_f(p.value)} | [{_f(p.ci_low)}, {_f(p.ci_high)}] |",
        f"| judge only (binomial CI, ignores judge error) | {_f(j.value)} | [{_f(j.ci_low)}, {_f(j.ci_high)}] |",
        "",
    ]


def render_summary(run: Run, ag: Agreement, labels_path: Path) -> str:
    lo, hi = ag.kappa_ci
    lines = [
        f"# Judge spot-check: {run_label(run)}",
        "",
        f"Labels: `{labels_path.name}`; judge `{run.data.tags.get('judge_model', '?')}` "
        f"({run.data.params.get('judge', '?')}), generator `{run.data.tags.get('generator_model', '?')}`.",
        "",
    ]
    if ag.warnings:
        lines += [*(f"**{w}**" for w in ag.warnings), ""]
    if ag.weighted:
        lines.append(
            f"**Population: the run's {ag.n_population} judged claims (parseable verdicts), estimated** "
            f"from {ag.n} labelled claims, each weighted by 1 / its inclusion probability (the sample "
            "over-weights borderline claims and strata). The last column describes the labelled sample only."
        )
    else:
        lines.append(
            f"**Population: the {ag.n} labelled claims only.** The label file has no inclusion_prob column, "
            "so the figures are not weighted back to the run's claims and a borderline-boosted or "
            "stratified sample over-represents hard claims."
        )
    sa = ag.sample
    head = "run's claims (estimated)" if ag.weighted else "labelled sample"
    lines += [
        "",
        f"| statistic | {head} | labelled sample |",
        "|---|---|---|",
        f"| labelled claims scored (n) | | {ag.n} |",
        f"| blank human_verdict rows (skipped) | | {ag.n_blank} |",
        f"| judge verdict unparseable (not scored) | | {ag.n_judge_unparseable} |",
        f"| agreement | {_f(ag.agreement)} | {_f(sa['agreement'])} |",
        f"| Cohen's κ (95 % bootstrap CI) | {_f(ag.kappa)} [{_f(lo)}, {_f(hi)}] | {_f(sa['kappa'])} |",
        f"| leniency P(judge supported \\| human unsupported) | {_f(ag.leniency)} | {_f(sa['leniency'])} |",
        f"| strictness P(judge unsupported \\| human supported) | {_f(ag.strictness)} | {_f(sa['strictness'])} |",
        "",
        *_ppi_lines(ag),
        "Confusion matrix of the labelled sample (rows: human, columns: judge):",
        "",
        "| | " + " | ".join(ag.confusion.columns) + " |",
        "|---|" + "---|" * len(ag.confusion.columns),
    ]
    for idx, row in ag.confusion.iterrows():
        lines.append(f"| {idx} | " + " | ".join(str(int(v)) for v in row) + " |")
    if ag.n_judge_unparseable:
        lines += [
            "",
            "Human labels of the claims the judge left unparseable: "
            + ", ".join(f"{k}: {v}" for k, v in sorted(ag.unparseable_by_human.items())),
        ]
    lines += [
        "",
        "κ = (p_o − p_e) / (1 − p_e) over claims with a human label and a parseable judge verdict, "
        "p_o and p_e from counts weighted by 1 / inclusion probability when the file has them; "
        "CI: percentile bootstrap over those claims with their weights (seeded). Blank rows are assumed "
        "missing at random.",
    ]
    return "\n".join(lines) + "\n"


def log_spotcheck(client: MlflowClient, run: Run, ag: Agreement, labels_path: Path, summary: str) -> None:
    rid = run.info.run_id
    now = int(time.time() * 1000)
    vals = {
        "spotcheck/n": ag.n,
        "spotcheck/n_blank": ag.n_blank,
        "spotcheck/n_judge_unparseable": ag.n_judge_unparseable,
        "spotcheck/agreement": ag.agreement,
        "spotcheck/kappa": ag.kappa,
        "spotcheck/kappa_ci_low": ag.kappa_ci[0],
        "spotcheck/kappa_ci_high": ag.kappa_ci[1],
        "spotcheck/leniency": ag.leniency,
        "spotcheck/strictness": ag.strictness,
        "spotcheck/weighted": float(ag.weighted),  # 1: figures estimate the run's claims
        **{f"spotcheck/sample_{k}": v for k, v in ag.sample.items()},
    }
    for name, est in (("ppi_faithfulness", ag.ppi), ("judge_faithfulness", ag.judge_only)):
        if est is not None:
            vals |= {f"spotcheck/{name}": est.value, f"spotcheck/{name}_ci_low": est.ci_low}
            vals[f"spotcheck/{name}_ci_high"] = est.ci_high
    for hl in HUMAN_LABELS:
        for jl in HUMAN_LABELS:
            vals[f"spotcheck/confusion/human_{hl}/judge_{jl}"] = int(
                ag.confusion.at[f"human {hl}", f"judge {jl}"]
            )
    metrics = [Metric(k, float(v), now, 0) for k, v in vals.items() if not math.isnan(float(v))]
    client.log_batch(rid, metrics=metrics)
    with tempfile.TemporaryDirectory() as tmp:  # stored under a fixed name, whatever the file was called
        copy = Path(tmp) / "labels.csv"
        shutil.copyfile(labels_path, copy)
        client.log_artifact(rid, str(copy), artifact_path="spotcheck")
    client.log_text(rid, summary, "spotcheck/summary.md")


# --------------------------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rag_experiments.spotcheck",
        description="Human spot-check of the judge. Exit 0 ok, 2 bad input.",
    )
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--experiment", metavar="NAME", help="look run names up in this experiment only")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="write a CSV of judged claims with an empty human_verdict column")
    s.add_argument("run", metavar="RUN")
    s.add_argument("-n", type=int, default=20, help="claims to sample (default 20)")
    s.add_argument("--stratify", action="store_true", help="split n evenly across the judge's verdicts")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threshold", type=float, help="judge score threshold (default: from the run's params)")
    s.add_argument("--out", type=Path, help="default: spotcheck_<run>.csv")
    c = sub.add_parser("score", help="score a filled label CSV against the judge and log the result")
    c.add_argument("run", metavar="RUN")
    c.add_argument("labels", type=Path, metavar="labels.csv")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples for the κ CI")
    c.add_argument("--no-log", action="store_true", help="do not log to the run")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    client = MlflowClient(tracking_uri=tracking_uri(args.tracking_uri))
    try:
        run = resolve_run(client, args.run, args.experiment)
        claims = judged_claims(load_per_query(client, run))
        if claims.empty:
            raise RunInputError(f"run {run_label(run)} has no judged claims")
        warn = self_preference_warning(run)
        if args.cmd == "sample":
            if args.n < 1:
                raise RunInputError("-n must be >= 1")
            th = args.threshold if args.threshold is not None else judge_threshold(run)
            out = sample_claims(claims, args.n, stratify=args.stratify, seed=args.seed, threshold=th)
            path = args.out or Path(f"spotcheck_{run.info.run_id[:8]}.csv")
            path.parent.mkdir(parents=True, exist_ok=True)
            out.to_csv(path, index=False, columns=COLUMNS)
            counts = out["judge_verdict"].value_counts().to_dict()
            print(
                f"wrote {len(out)} claims ({', '.join(f'{k}: {v}' for k, v in sorted(counts.items()))}) to {path}"
                + (f"; borderline over-weighted around score threshold {th}" if th is not None else "")
            )
            print(
                "fill human_verdict with supported / unsupported, then: python -m rag_experiments.spotcheck "
                f"score {run.info.run_id} {path}"
            )
            if warn:
                print(warn, file=sys.stderr)
            return 0
        labels = read_labels(args.labels, claims)
        ag = score_labels(labels, seed=args.seed, n_resamples=args.resamples)
        ag.ppi, ag.judge_only = faithfulness_estimates(labels, claims)
        if warn:
            ag.warnings.append(warn)
    except LabelFileError as e:
        for line in e.problems:
            print(line, file=sys.stderr)
        return 2
    except RunInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = render_summary(run, ag, args.labels)
    print(summary)
    if warn:
        print(warn, file=sys.stderr)
    if not args.no_log:
        log_spotcheck(client, run, ag, args.labels, summary)
        print(
            f"logged spotcheck/* metrics and spotcheck/labels.csv, spotcheck/summary.md on run {run.info.run_id}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
