"""Compare two runs query by query, or attribute a sweep's effects to its factors (docs/metrics.md).

    python -m rag_experiments.compare RUN_A RUN_B [--all | --metric KEY ...] [--out FILE.md] [--log]
    python -m rag_experiments.compare --sweep SWEEP_ID [--baseline RUN] [--out FILE.md] [--long]

``RUN_A RUN_B`` tests the headline family of the config diff (``evaluation.headline.change_family``),
Holm over it; ``--all``: every common metric. ``--sweep`` without ``--baseline`` uses the default
baseline (``analysis.baseline``, as ``report`` does), printed with why; one row per level, the
swept factors' headline metrics as columns (``evaluation.headline.table_metrics``); ``--long``:
every (level, metric) comparison with CI and p-values, marginal means and noise floor.

A metric not comparable across the runs (docs/metrics.md, "Comparability": hit@k when the chunks
differ, a judge metric across judges) is left out of a default family with a note, and refused
when named with --metric; --allow-incomparable tests it anyway and says so.

Exit codes: 0 ok, 2 bad input (unknown run, missing per_query.parquet, different eval sets, runs
scored by different judges without --allow-judge-change, an incomparable --metric without
--allow-incomparable: docs/judges.md).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rag_experiments.analysis.attribution import config_diff
from rag_experiments.analysis.baseline import context_k
from rag_experiments.analysis.checks import CheckFailure, newly_failing
from rag_experiments.analysis.comparability import comparable_only, human_lines, label_evidence_notes
from rag_experiments.analysis.judge_trust import generation_marker, is_generation_metric
from rag_experiments.analysis.stats import (
    PairedResult,
    first_stage_deltas,
    flips,
    holm,
    paired_deltas,
    transition_matrix,
)
from rag_experiments.cli.compare_sweep import main_sweep, safe_name, trust_inputs
from rag_experiments.core.formatting import fmt_num as _f
from rag_experiments.core.formatting import fmt_p as _p
from rag_experiments.core.formatting import md_table, text_table
from rag_experiments.core.run_record import RunData
from rag_experiments.evaluation.aggregate import metric_columns
from rag_experiments.evaluation.headline import change_family
from rag_experiments.evaluation.registry import higher_is_better, parse, render_key
from rag_experiments.tracking import annotate
from rag_experiments.tracking.errors import cli_main
from rag_experiments.tracking.judge_runs import (
    ALLOW_FLAG,
    ALLOW_INCOMPARABLE,
    check_comparable,
    check_same_judge,
)
from rag_experiments.tracking.run_reader import MlflowRunReader, RunReader
from rag_experiments.tracking.runs import RunInputError, check_same_evalset, run_label, tracking_uri

METHOD_NOTE = (
    "delta = mean(B) − mean(A) over eval ids with a value in both runs (n). 95 % CI: paired "
    "bootstrap of the mean delta over queries, percentile method, seeded. p: exact McNemar "
    "(binomial test on discordant pairs) for binary metrics, paired sign-flip permutation test of "
    "the mean difference otherwise; p_holm: Holm-adjusted across the metrics shown (the family). "
    "change: better / worse in the metric's own direction (the registry's higher_is_better: "
    "failure rates and latencies are better lower) when p_holm < 0.05, else n.s. "
    "rate_<label> rows are the per-query failure-label indicators."
)
MAX_TERMINAL_FLIPS = 15


@dataclass
class Comparison:
    run_a: RunData
    run_b: RunData
    diff: dict[str, tuple]
    results: list[PairedResult]
    flips: dict[str, pd.DataFrame]  # section title -> flips table
    transitions: pd.DataFrame
    n_a: int
    n_b: int
    n_common: int
    warnings: list[str] = field(default_factory=list)
    family: str = ""  # which metrics were tested (the Holm family), one line
    # per run with a reranker ("A", "B"): its final list against its own first stage (first_stage/*)
    first_stage: dict[str, list[PairedResult]] = field(default_factory=dict)
    # checks of the items' assert lists that B fails and A passes (analysis.checks.newly_failing)
    new_check_failures: list[CheckFailure] = field(default_factory=list)


def _with_label_rates(df: pd.DataFrame, labels: Sequence[str]) -> pd.DataFrame:
    out = df.copy()
    # the sweep logs rate_<label> itself (only the meaningful ones for retrieval-only runs)
    if "failure_label" in out.columns and not any(c.startswith("rate_") for c in out.columns):
        lab = out["failure_label"].astype("string")
        for lb in labels:
            out[f"rate_{lb}"] = (lab == lb).astype(float).where(lab.notna())
    return out


def _is_hit_at_k(col: str) -> bool:
    got = parse(col)
    return got is not None and got[0].pattern == "hit_at_{k}" and got[1]["form"] == "mean"


def _context_hit_column(run: RunData, table: pd.DataFrame) -> str | None:
    k = run.params.get("retriever.k")
    if k is not None and str(k).isdigit() and render_key("hit_at_{k}", k=int(k)) in table.columns:
        return render_key("hit_at_{k}", k=int(k))
    hits = [c for c in table.columns if _is_hit_at_k(c)]
    return "hit_at_5" if "hit_at_5" in hits else (hits[-1] if hits else None)


def change(metric: str, delta: float, p: float | None, alpha: float = 0.05) -> str:
    """``better`` / ``worse`` in the metric's registered direction when the paired test is
    significant (``p < alpha``), ``n.s.`` otherwise; ``–`` for a metric without a direction."""
    try:
        hib = higher_is_better(metric)
    except KeyError:
        hib = None
    if hib is None or delta is None or math.isnan(delta):
        return "–"
    if p is None or math.isnan(p) or p >= alpha or delta == 0:
        return "n.s."
    return "better" if (delta > 0) == hib else "worse"


def build_comparison(
    reader: RunReader,
    run_a: RunData,
    run_b: RunData,
    metrics: Sequence[str] | None = None,
    seed: int = 0,
    n_resamples: int = 9999,
    allow_judge_change: bool = False,
    every_metric: bool = False,
    allow_incomparable: bool = False,
) -> Comparison:
    """The paired comparison of two runs on ``metrics`` if given, else on every common metric
    (``every_metric``), else on the headline family of the keys their configs differ in
    (:func:`headline_family`). Holm adjusts over exactly the metrics tested."""
    warnings = [
        w
        for w in [check_same_evalset(run_a, run_b), check_same_judge([run_a, run_b], allow_judge_change)]
        if w
    ]
    ta, tb = reader.per_query(run_a), reader.per_query(run_b)
    labels: list[str] = []
    if "failure_label" in ta.columns and "failure_label" in tb.columns:
        seen = set(ta["failure_label"].dropna().astype(str)) | set(tb["failure_label"].dropna().astype(str))
        labels = sorted(seen)
    ta, tb = _with_label_rates(ta, labels), _with_label_rates(tb, labels)
    available = metric_columns(ta, tb)
    if metrics:
        missing = [m for m in metrics if m not in ta.columns or m not in tb.columns]
        if missing:
            raise RunInputError(
                f"metric(s) {', '.join(missing)} not in both per-query tables; "
                f"available: {', '.join(metric_columns(ta, tb, known_only=False))}"
            )
    chosen, family, notes = choose_family(run_a, run_b, available, metrics, every_metric, allow_incomparable)
    warnings += notes
    # all metrics at once, vectorised (two 20k-item runs compare in seconds, docs/scale.md)
    results = [r for r in paired_deltas(ta, tb, chosen, seed=seed, n_resamples=n_resamples) if r.n_pairs]
    for res, p in zip(results, holm([r.p_value for r in results]), strict=True):
        res.p_holm = float(p)

    flip_tables: dict[str, pd.DataFrame] = {}
    ha, hb = _context_hit_column(run_a, ta), _context_hit_column(run_b, tb)
    if ha and hb:
        title = f"{ha} (context hit)" if ha == hb else f"context hit ({ha} in A → {hb} in B)"
        flip_tables[title] = flips(ta, tb, ha, metric_b=hb)
    if labels:
        flip_tables["failure_label"] = flips(ta, tb, "failure_label")
    warnings += human_lines([r.metric for r in results], [run_a, run_b])  # labels lead
    if labels:  # judge=none: the failure label rests on correctness only (run tag failure_label_evidence)
        warnings += label_evidence_notes([run_a, run_b])
    if any(is_generation_metric(r.metric) for r in results):  # human κ < 0.4 (analysis.judge_trust)
        warnings += [f"warning: {m}" for m in [generation_marker(trust_inputs([run_a, run_b]))] if m]
    ids_a, ids_b = set(ta["id"]), set(tb["id"])
    if ids_a != ids_b:
        warnings.append(
            f"warning: the runs' eval ids differ ({len(ids_a - ids_b)} only in A, {len(ids_b - ids_a)} only in B); "
            "only common ids are paired"
        )
    return Comparison(
        run_a=run_a,
        run_b=run_b,
        diff=config_diff(run_a.params, run_b.params),
        results=results,
        flips=flip_tables,
        transitions=transition_matrix(ta, tb),
        n_a=len(ta),
        n_b=len(tb),
        n_common=len(ids_a & ids_b),
        warnings=warnings,
        family=family,
        first_stage={
            side: res for side, t in (("A", ta), ("B", tb))
            if (res := first_stage_deltas(t, chosen, seed=seed, n_resamples=n_resamples))
        },
        new_check_failures=newly_failing(ta, tb),
    )


def choose_family(
    run_a: RunData,
    run_b: RunData,
    available: Sequence[str],
    metrics: Sequence[str] | None,
    every_metric: bool,
    allow_incomparable: bool,
) -> tuple[list[str], str, list[str]]:
    """(the metrics tested, the line naming them, notes): ``metrics`` as given (refused when one is
    not comparable across the runs, unless ``allow_incomparable``), every common metric, or the
    headline family; a default family keeps only comparable metrics and names the rest."""
    if metrics:
        chosen = list(metrics)
        notes = check_comparable(chosen, [run_a, run_b], allow_incomparable, available)
        return chosen, f"Metrics: the {len(chosen)} given with --metric.", notes
    if every_metric:
        chosen, family = list(available), f"Metrics: every common metric ({len(available)}, --all)."
    else:
        chosen, family = headline_family(run_a, run_b, available)
    if allow_incomparable:
        return chosen, family, check_comparable(chosen, [run_a, run_b], True, available)
    chosen, left_out = comparable_only(chosen, [run_a, run_b], available)
    corpus = check_comparable(chosen, [run_a, run_b], False, available)  # different corpora: refused
    return chosen, family, corpus + [f"note: {n}" for n in left_out]


def headline_family(run_a: RunData, run_b: RunData, available: Sequence[str]) -> tuple[list[str], str]:
    """``evaluation.headline.change_family`` of the keys the two configs differ in, at the context
    k of the two (the sweep's rule: a tie goes to the larger)."""
    k = context_k([run_a.params, run_b.params])
    return change_family(list(config_diff(run_a.params, run_b.params)), available, k)


# --------------------------------------------------------------------------------------------- rendering


def result_headers(n: int) -> list[str]:
    """The metric table's headers; the p_holm column names its family's size."""
    return [*RESULT_HEADERS[:6], f"p_holm (Holm over {n})", *RESULT_HEADERS[7:]]


def _result_rows(results: Sequence[PairedResult]) -> list[list[str]]:
    return [
        [
            r.metric,
            _f(r.mean_a),
            _f(r.mean_b),
            _f(r.delta, signed=True),
            f"[{_f(r.ci_low, signed=True)}, {_f(r.ci_high, signed=True)}]",
            _p(r.p_value),
            _p(r.p_holm) + (" *" if r.p_holm is not None and r.p_holm < 0.05 else ""),
            r.test,
            str(r.n_pairs),
            change(r.metric, r.delta, r.p_holm),
        ]
        for r in results
    ]


RESULT_HEADERS = ["metric", "mean A", "mean B", "delta", "95% CI", "p", "p_holm", "test", "n", "change"]


def _flip_rows(df: pd.DataFrame, limit: int | None = None) -> list[list[str]]:
    rows = []
    for _, r in df.iterrows():
        tags = r["tags"]
        tags = ", ".join(tags) if isinstance(tags, list | tuple) else ("" if tags is None else str(tags))
        rows.append([r["change"], str(r["id"]), str(r["query"]), tags])
    return rows[:limit] if limit else rows


def _diff_rows(diff: dict[str, tuple]) -> list[list[str]]:
    return [[k, "–" if a is None else str(a), "–" if b is None else str(b)] for k, (a, b) in diff.items()]


def _matrix_rows(m: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    headers = ["A \\ B"] + list(m.columns)
    return headers, [[str(i)] + [str(v) for v in row] for i, row in zip(m.index, m.to_numpy(), strict=True)]


def render(comp: Comparison, markdown: bool) -> str:
    table = md_table if markdown else text_table
    a, b = run_label(comp.run_a), run_label(comp.run_b)
    h = (lambda s: f"## {s}") if markdown else (lambda s: f"\n== {s} ==")
    out = [
        f"# Compare: A = {a} vs B = {b}" if markdown else f"Compare  A = {a}   B = {b}",
        "",
        f"Eval items: A {comp.n_a}, B {comp.n_b}, paired {comp.n_common}. "
        f"evalset_digest {comp.run_b.tags.get('evalset_digest', '?')[:12]}",
    ]
    out += comp.warnings
    out += ["", h("Config diff (the factor under test)")]
    out += [table(["param", "A", "B"], _diff_rows(comp.diff)) if comp.diff else "(identical configs)"]
    out += [
        "",
        h("Metrics (paired, B − A)"),
        *([comp.family] if comp.family else []),
        table(result_headers(len(comp.results)), _result_rows(comp.results)),
        "",
        METHOD_NOTE,
    ]
    for side, res in comp.first_stage.items():  # what each run's reranker added (docs/stages.md)
        out += ["", h(f"Reranker of {side}: first stage (mean A) → final list (mean B), paired within the run")]
        out.append(table(result_headers(len(res)), _result_rows(res)))
    for title, df in comp.flips.items():
        out += ["", h(f"Flipped queries: {title} ({len(df)})")]
        if df.empty:
            out.append("(none)")
            continue
        counts = df["change"].value_counts()
        out.append(", ".join(f"{k}: {v}" for k, v in counts.items()))
        limit = None if markdown else MAX_TERMINAL_FLIPS
        out.append(table(["change", "id", "query", "tags"], _flip_rows(df, limit)))
        if limit and len(df) > limit:
            out.append(f"… {len(df) - limit} more (see --out)")
    if comp.new_check_failures:  # per-item assertions B breaks (docs/metrics.md, "Per-item assertions")
        out += ["", h(f"Checks newly failing in B ({len(comp.new_check_failures)})")]
        rows = [
            [f.item_id, f"assert[{f.index}] {f.check}", "yes" if f.critical else "", f.detail]
            for f in comp.new_check_failures
        ]
        out.append(table(["id", "check", "critical", "B"], rows))
    if not comp.transitions.empty:
        out += ["", h("Failure-label transitions (rows A, columns B)")]
        out.append(table(*_matrix_rows(comp.transitions)))
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------- CLI


def log_comparison(uri: str, comp: Comparison, markdown: str) -> str:
    """The Markdown and ``compare/<metric>/{delta,ci_low,ci_high,p_value}`` on run B."""
    a, b = comp.run_a.run_id, comp.run_b.run_id
    path = f"compare/{safe_name(a)}_vs_{safe_name(b)}.md"
    annotate.log_text(uri, b, markdown, path)
    values = {
        f"compare/{r.metric}/{name}": v
        for r in comp.results
        for name, v in (
            ("delta", r.delta),
            ("ci_low", r.ci_low),
            ("ci_high", r.ci_high),
            ("p_value", r.p_value),
        )
    }
    annotate.log_metrics(uri, b, values)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rag_experiments.compare",
        description=(
            "Paired, per-query comparison of two runs (config diff, per-metric delta with 95% bootstrap "
            "CI and McNemar / sign-flip p, flipped queries, failure-label transitions), or with --sweep "
            "the factor attribution of a sweep against a baseline run. Exit 0 ok, 2 bad input."
        ),
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="RUN_A RUN_B: run ids or run names")
    p.add_argument("--sweep", metavar="SWEEP_ID", help="attribute the sweep's effects to its factors")
    p.add_argument("--baseline", metavar="RUN", help="--sweep: baseline run (default: as report, printed)")
    p.add_argument("--all", dest="every_metric", action="store_true", help="test every common metric")
    p.add_argument(
        "--long",
        action="store_true",
        help="--sweep: every (level, metric) comparison, one per row, with CIs and p",
    )
    p.add_argument(
        "--metric", action="append", metavar="KEY", help="metric(s) to compare (default: headline)"
    )
    p.add_argument("--out", type=Path, metavar="FILE.md", help="also write the report as Markdown")
    p.add_argument(
        "--log", action="store_true", help="log the Markdown and compare/<metric>/* metrics on run B"
    )
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--experiment", metavar="NAME", help="look run names up in this experiment only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resamples", type=int, default=9999, help="bootstrap / permutation resamples")
    p.add_argument(
        ALLOW_FLAG, action="store_true", help="compare runs scored by different judges (noted in the output)"
    )
    p.add_argument(
        ALLOW_INCOMPARABLE,
        action="store_true",
        help="test metrics that are not comparable across the runs (noted in the output)",
    )
    return p


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reader = MlflowRunReader(tracking_uri(args.tracking_uri))
    try:
        if args.sweep:
            return main_sweep(reader, args)
        if len(args.runs) != 2:
            raise RunInputError("give exactly two runs (RUN_A RUN_B), or --sweep SWEEP_ID [--baseline RUN]")
        run_a = reader.resolve(args.runs[0], args.experiment)
        run_b = reader.resolve(args.runs[1], args.experiment)
        comp = build_comparison(
            reader,
            run_a,
            run_b,
            args.metric,
            args.seed,
            args.resamples,
            args.allow_judge_change,
            args.every_metric,
            args.allow_incomparable,
        )
    except RunInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(comp, markdown=False))
    md = render(comp, markdown=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)
        print(f"wrote {args.out}")
    if args.log:
        print(
            f"logged {log_comparison(reader.uri, comp, md)} and compare/* metrics on run {run_label(run_b)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
