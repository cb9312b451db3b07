"""Human spot-check of the judge (DESIGN §6).

    python -m rag_experiments.spotcheck sample RUN -n 20 [--stratify] [--seed 0] [--out FILE.csv]
    python -m rag_experiments.spotcheck score RUN labels.csv [--no-log]

``sample`` writes a CSV of judged claims from the run's per-query table (one row per claim: the
query, the claim, the exact context the judge saw, the judge's verdict, score and rationale, the
answer) with an empty ``human_verdict`` column. Claims are drawn without replacement, seeded, with
weight ``1 + 3·exp(−|score − threshold| / s)`` (``s`` = the median distance of all claims' scores
to the judge's threshold) so that borderline verdicts are over-weighted when the judge gives
scores; ``--stratify`` splits n evenly across the verdict labels first.

``score`` reads the filled CSV (``human_verdict`` ∈ supported / unsupported, any case; blank rows
are skipped and counted), looks every ``item_id`` up in the run (the run, not the CSV, is the
source of the judge's verdict) and reports n, agreement, Cohen's κ with a bootstrap 95 % CI, the
confusion matrix, leniency = P(judge supported | human unsupported) and strictness = P(judge
unsupported | human supported). Claims the judge marked ``unparseable`` are counted separately and
left out of agreement and κ. Results are logged to the run (metrics ``spotcheck/*``, artifacts
``spotcheck/labels.csv`` and ``spotcheck/summary.md``). A label file with problems gets one
``FILE:LINE: field: what is wrong`` line per problem on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow.entities import Metric, Run
from mlflow.tracking import MlflowClient

from rag_experiments.tracking.runs import RunInputError, load_per_query, resolve_run, run_label, tracking_uri

COLUMNS = [
    "item_id",
    "query",
    "claim",
    "context",
    "judge_verdict",
    "judge_score",
    "judge_rationale",
    "answer",
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


def _json(s: Any, default: Any) -> Any:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return default
    try:
        return json.loads(s) if isinstance(s, str) else s
    except ValueError:
        return default


def item_id(query_id: str, index: int) -> str:
    return f"{query_id}#{index}"


def judged_claims(table: pd.DataFrame) -> pd.DataFrame:
    """One row per judged claim (columns of the CSV except ``human_verdict``), in table order."""
    if "verdicts" not in table.columns:
        raise RunInputError("the run has no judged claims (no 'verdicts' column: a retrieval-only run?)")
    rows = []
    for r in table.itertuples(index=False):
        rd = r._asdict()
        for i, v in enumerate(_json(rd.get("verdicts"), [])):
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
    return pd.DataFrame(rows, columns=COLUMNS[:-1])


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


def _weighted_pick(idx: np.ndarray, w: np.ndarray, n: int, rng: np.random.Generator) -> list[int]:
    if n >= len(idx):
        return list(idx)
    return list(rng.choice(idx, size=n, replace=False, p=w / w.sum()))


def sample_claims(
    claims: pd.DataFrame, n: int, stratify: bool = False, seed: int = 0, threshold: float | None = None
) -> pd.DataFrame:
    """n claims, seeded, borderline ones over-weighted; stratified by verdict when asked."""
    rng = np.random.default_rng(seed)
    w = sample_weights(claims["judge_score"].to_numpy(float), threshold)
    idx = np.arange(len(claims))
    if not stratify:
        chosen = _weighted_pick(idx, w, n, rng)
    else:
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
        chosen = []
        for lab in labels:
            g = groups[lab]
            chosen += _weighted_pick(g, w[g], quota[lab], rng)
    out = claims.iloc[sorted(chosen)].copy()
    out["human_verdict"] = ""
    return out.reset_index(drop=True)


# --------------------------------------------------------------------------------------------- scoring


def cohen_kappa(human: Sequence[str], judge: Sequence[str]) -> float:
    """κ = (p_o − p_e) / (1 − p_e); p_e from the two raters' marginals. NaN when p_e = 1."""
    h, j = np.asarray(human), np.asarray(judge)
    n = len(h)
    if n == 0:
        return float("nan")
    po = float(np.mean(h == j))
    cats = set(h) | set(j)
    pe = sum(float(np.mean(h == c)) * float(np.mean(j == c)) for c in cats)
    return float("nan") if pe >= 1 else (po - pe) / (1 - pe)


def kappa_ci(
    human: Sequence[str],
    judge: Sequence[str],
    seed: int = 0,
    n_resamples: int = 2000,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of κ over labelled claims (resamples with undefined κ are dropped)."""
    h, j = np.asarray(human), np.asarray(judge)
    n = len(h)
    if n < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    ks = []
    for _ in range(n_resamples):
        i = rng.integers(0, n, n)
        k = cohen_kappa(h[i], j[i])
        if not math.isnan(k):
            ks.append(k)
    if not ks:
        return float("nan"), float("nan")
    a = (1 - confidence) / 2
    lo, hi = np.quantile(ks, [a, 1 - a])
    return float(lo), float(hi)


@dataclass
class Labels:
    rows: pd.DataFrame  # item_id, claim, human (lower-case), judge (the run's verdict), score
    n_blank: int
    path: Path


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
            seen[iid] = line
            rows.append(
                {
                    "item_id": iid,
                    "claim": by_id.at[iid, "claim"],
                    "human": human,
                    "judge": str(by_id.at[iid, "judge_verdict"]),
                    "score": by_id.at[iid, "judge_score"],
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
    return Labels(pd.DataFrame(rows, columns=["item_id", "claim", "human", "judge", "score"]), n_blank, path)


@dataclass
class Agreement:
    n: int  # labelled claims with a parseable judge verdict (the ones agreement and κ are on)
    n_blank: int
    n_judge_unparseable: int
    agreement: float
    kappa: float
    kappa_ci: tuple[float, float]
    confusion: pd.DataFrame  # rows human, columns judge
    leniency: float  # P(judge supported | human unsupported)
    strictness: float  # P(judge unsupported | human supported)
    unparseable_by_human: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def score_labels(labels: Labels, seed: int = 0, n_resamples: int = 2000) -> Agreement:
    df = labels.rows
    unp = df[~df["judge"].isin(HUMAN_LABELS)]
    ok = df[df["judge"].isin(HUMAN_LABELS)]
    h, j = ok["human"].to_numpy(), ok["judge"].to_numpy()
    conf = pd.crosstab(pd.Categorical(h, HUMAN_LABELS), pd.Categorical(j, HUMAN_LABELS), dropna=False)
    conf.index = [f"human {x}" for x in HUMAN_LABELS]
    conf.columns = [f"judge {x}" for x in HUMAN_LABELS]

    def cond(human: str, judge: str) -> float:
        m = h == human
        return float(np.mean(j[m] == judge)) if m.any() else float("nan")

    return Agreement(
        n=len(ok),
        n_blank=labels.n_blank,
        n_judge_unparseable=len(unp),
        agreement=float(np.mean(h == j)) if len(ok) else float("nan"),
        kappa=cohen_kappa(h, j),
        kappa_ci=kappa_ci(h, j, seed=seed, n_resamples=n_resamples),
        confusion=conf.astype(int),
        leniency=cond("unsupported", "supported"),
        strictness=cond("supported", "unsupported"),
        unparseable_by_human=unp["human"].value_counts().to_dict(),
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
    lines += [
        "| statistic | value |",
        "|---|---|",
        f"| labelled claims scored (n) | {ag.n} |",
        f"| blank human_verdict rows (skipped) | {ag.n_blank} |",
        f"| judge verdict unparseable (not scored) | {ag.n_judge_unparseable} |",
        f"| agreement | {_f(ag.agreement)} |",
        f"| Cohen's κ (95 % bootstrap CI) | {_f(ag.kappa)} [{_f(lo)}, {_f(hi)}] |",
        f"| leniency P(judge supported \\| human unsupported) | {_f(ag.leniency)} |",
        f"| strictness P(judge unsupported \\| human supported) | {_f(ag.strictness)} |",
        "",
        "Confusion matrix (rows: human, columns: judge):",
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
        "κ = (p_o − p_e) / (1 − p_e) over claims with a human label and a parseable judge verdict; "
        "CI: percentile bootstrap over those claims (seeded).",
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
    }
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
