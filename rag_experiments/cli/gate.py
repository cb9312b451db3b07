"""Regression gate: a paired non-inferiority test per metric, in the metric's direction (docs/metrics.md).

    python -m rag_experiments.gate --baseline RUN --candidate RUN [--metric KEY ...] [--margin X]

Exit codes: 0 every gated metric passes, 1 some metric fails, 2 bad input.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from rag_experiments.analysis.checks import CheckFailure, critical_failures
from rag_experiments.analysis.comparability import comparable_defaults, human_lines
from rag_experiments.analysis.gate import GateResult, gate_power, non_inferiority, vacuous
from rag_experiments.analysis.verdict import GateVerdict, gate_verdict
from rag_experiments.cli.compare import text_table
from rag_experiments.core.formatting import fmt_num
from rag_experiments.evaluation.registry import higher_is_better
from rag_experiments.report.gate_summary import write_summary
from rag_experiments.tracking.errors import cli_main
from rag_experiments.tracking.judge_runs import (
    ALLOW_FLAG,
    ALLOW_INCOMPARABLE,
    check_comparable,
    check_same_judge,
)
from rag_experiments.tracking.run_reader import MlflowRunReader, RunReader
from rag_experiments.tracking.runs import RunInputError, check_same_evalset, run_label, tracking_uri

DEFAULT_METRICS = ("hit_at_5", "mrr", "faithfulness")
OPTIONAL_DEFAULTS = {"faithfulness"}  # gated only when both runs have it (retrieval-only runs do not)

HELP = f"""\
For each gated metric: delta = mean(candidate − baseline) over the eval ids present (non-NaN) in
both runs; bound = the one-sided 95 % confidence bound of that mean delta on the metric's worse
side, by the metric's declared value type (never the values seen): Tango's score test for paired
proportions on binary and proportion metrics (hit_at_5, rate_*, evidence recall), a paired bootstrap
over queries (percentile, seeded) on continuous ones (mrr) — the same two runs always get the same
verdict, and two runs identical on every item always pass. The direction comes from the metric registry: a higher-is-better metric (hit_at_5, mrr,
faithfulness, rate_ok) FAILS when its lower bound < −margin; a lower-is-better one
(rate_retrieval_failure, rate_generation_failure, latency_*) FAILS when its upper bound > +margin.
Metrics without a direction (n_queries) or not registered cannot be gated (exit 2).

Default margin (when --margin is not given): max(0.01, 1/sqrt(n)), n = number of paired queries
(0.10 at n=100, 0.05 at n=400, 0.014 at n=5000). 1/sqrt(n) is about the 95 % CI half-width of a
proportion measured on n queries, i.e. the eval set's own resolution: smaller drops are noise at
that size, larger ones are real. MDE printed per metric: the smallest true drop this eval set
detects with 80 % power, (z_0.95 + z_0.8)·sd(paired differences)/sqrt(n). When MDE > margin, or
the default margin is wider than 0.15 (n < 45), the output leads with UNDERPOWERED and the n
needed (analysis.power.n_for_margin: the figure select and plan print). A margin >= 1 on a metric
in [0, 1] (the default at n = 1) lets no candidate fail: refused, exit 2, naming the n needed.

Default metrics: {", ".join(DEFAULT_METRICS)} (faithfulness unless both runs are retrieval only;
a run whose faithfulness has no value, e.g. a dead judge, is refused, exit 2).
Exit codes: 0 pass, 1 some metric failed, 2 bad input (unknown run, different eval sets, missing
metric or per_query.parquet, runs scored by different judges without --allow-judge-change, a
metric not comparable across the two runs without --allow-incomparable: docs/metrics.md,
"Comparability"). When the runs' chunks differ, the default hit_at_5 and mrr are replaced by
evidence_recall_at_{{B}}tok (the smallest logged budget), said in the output.

Per-item assertions: a check with "critical": true in an eval item's "assert" list that fails for
the candidate fails the gate whatever the metrics (exit 1); the output lists such checks first,
each with whether the baseline fails it too (docs/metrics.md, "Per-item assertions")."""


def _parse_margins(values: Sequence[str] | None) -> tuple[float | None, dict[str, float]]:
    default: float | None = None
    per_metric: dict[str, float] = {}
    for v in values or []:
        try:
            if "=" in v:
                k, x = v.split("=", 1)
                per_metric[k] = float(x)
            else:
                default = float(v)
        except ValueError:
            raise RunInputError(f"--margin {v!r}: expected a number or KEY=NUMBER") from None
    for k, x in [("", default)] + list(per_metric.items()):
        if x is not None and (x < 0 or math.isnan(x)):
            raise RunInputError(f"--margin {k + '=' if k else ''}{x}: must be >= 0")
    return default, per_metric


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rag_experiments.gate",
        description="Non-inferiority gate of a candidate run against a baseline run.",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--baseline", required=True, metavar="RUN", help="run id or run name")
    p.add_argument("--candidate", required=True, metavar="RUN", help="run id or run name")
    p.add_argument(
        "--metric",
        action="append",
        metavar="KEY",
        help=f"gated metric (repeatable; default {DEFAULT_METRICS})",
    )
    p.add_argument(
        "--margin",
        action="append",
        metavar="X|KEY=X",
        help="non-inferiority margin for every metric, or for one metric (repeatable); default max(0.01, 1/sqrt(n))",
    )
    p.add_argument(
        "--alpha", type=float, default=0.05, help="one-sided level (default 0.05: a 95%% confidence bound)"
    )
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--experiment", metavar="NAME", help="look run names up in this experiment only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resamples", type=int, default=9999)
    p.add_argument(ALLOW_FLAG, action="store_true", help="gate runs scored by different judges (noted in the output)")
    p.add_argument(
        "--summary-md",
        metavar="FILE",
        help="also write the verdict as Markdown for a pull request ($GITHUB_STEP_SUMMARY, a PR comment; docs/ci.md)",
    )
    p.add_argument(
        ALLOW_INCOMPARABLE,
        action="store_true",
        help="gate a metric that is not comparable across the two runs (noted in the output)",
    )
    return p


def _direction(metric: str) -> bool:
    try:
        hib = higher_is_better(metric)
    except KeyError:
        raise RunInputError(
            f"metric {metric!r} is not registered (rag_experiments.evaluation.registry): its direction is unknown"
        ) from None
    if hib is None:
        raise RunInputError(
            f"metric {metric!r} has no better direction (a descriptive count): cannot gate it"
        )
    return hib


def run_gate(
    reader: RunReader,
    baseline: str,
    candidate: str,
    metrics: Sequence[str] | None = None,
    margins: Sequence[str] | None = None,
    alpha: float = 0.05,
    experiment: str | None = None,
    seed: int = 0,
    n_resamples: int = 9999,
    allow_judge_change: bool = False,
    allow_incomparable: bool = False,
) -> tuple[list[GateResult], list[str]]:
    default_m, per_metric = _parse_margins(margins)
    rb = reader.resolve(baseline, experiment)
    rc = reader.resolve(candidate, experiment)
    notes = [w for w in [check_same_evalset(rb, rc), check_same_judge([rb, rc], allow_judge_change)] if w]
    notes.insert(0, f"baseline  {run_label(rb)}\ncandidate {run_label(rc)}")
    tb, tc = reader.per_query(rb), reader.per_query(rc)

    def present(m: str) -> bool:
        return all(m in t.columns and t[m].notna().any() for t in (tb, tc))

    available = sorted(set(tb.columns) & set(tc.columns))
    if metrics:
        missing = [m for m in metrics if not present(m)]
        if missing:
            raise RunInputError(f"metric(s) {', '.join(missing)} missing from a run's per_query.parquet")
        gated = list(metrics)
        notes += check_comparable(gated, [rb, rc], allow_incomparable, available)
    else:
        # an optional default is left out only when neither run has its column (both retrieval
        # only); one run without values (a dead judge: all NaN) is refused, never dropped
        gated = [m for m in DEFAULT_METRICS if m not in OPTIONAL_DEFAULTS or m in tb or m in tc]
        gated, swapped = comparable_defaults(gated, [rb, rc], available)
        notes += swapped
        notes += check_comparable(gated, [rb, rc], allow_incomparable, available)  # different corpora
        missing = [
            f"{m} (no values in {run_label(r)})"
            for m in gated
            for r, t in ((rb, tb), (rc, tc))
            if not (m in t.columns and t[m].notna().any())
        ]
        if missing:
            raise RunInputError(
                f"default metric(s) missing: {'; '.join(missing)}; gate the rest only by naming "
                "them with --metric KEY"
            )
    unknown = set(per_metric) - set(gated)
    if unknown:
        raise RunInputError(f"--margin given for metric(s) not gated: {', '.join(sorted(unknown))}")
    directions = {m: _direction(m) for m in gated}
    results = []
    for m in gated:
        margin = per_metric.get(m, default_m)
        res = non_inferiority(
            tb.set_index("id")[m],
            tc.set_index("id")[m],
            margin=margin,
            alpha=alpha,
            seed=seed,
            n_resamples=n_resamples,
            metric=m,
            higher_is_better=directions[m],
        )
        if res.n_pairs == 0:
            raise RunInputError(f"metric {m}: no eval id has a value in both runs")
        if vacuous(res):  # a verdict that cannot be FAIL is no verdict
            need = gate_power(res, margin is None)
            raise RunInputError(
                f"metric {m}: the margin {res.margin:.3g} spans the metric's whole range [0, 1] at "
                f"n = {res.n_pairs}: no candidate could fail. "
                + (need.need() if need else "Pass a margin below 1 or evaluate on more queries")
            )
        results.append(res)
    return results, notes


def gate_verdict_of(reader: RunReader, args: argparse.Namespace) -> tuple[GateVerdict, str]:
    """The gate's verdict (``analysis.verdict.gate_verdict``) and the two runs' header lines: what
    the console, ``--summary-md`` and the tags render."""
    results, notes = run_gate(
        reader,
        args.baseline,
        args.candidate,
        args.metric,
        args.margin,
        alpha=args.alpha,
        experiment=args.experiment,
        seed=args.seed,
        n_resamples=args.resamples,
        allow_judge_change=args.allow_judge_change,
        allow_incomparable=args.allow_incomparable,
    )
    rb, rc = reader.resolve(args.baseline, args.experiment), reader.resolve(args.candidate, args.experiment)
    dm, pm = _parse_margins(args.margin)
    swapped = {
        n.split(" → ")[1].split(":")[0]: n.removeprefix("default metric ")
        for n in notes
        if n.startswith("default metric ")
    }
    whys = {
        r.metric: "named with --metric" if args.metric
        else f"a default metric, replacing {swapped[r.metric]}" if r.metric in swapped
        else "a default metric"
        for r in results
    }  # fmt: skip
    verdict = gate_verdict(
        rb, rc, results, notes[1:], {r.metric: dm is None and r.metric not in pm for r in results}, whys,
        human_lines([r.metric for r in results], [rb, rc]), args.alpha,
        critical_failures(reader.per_query(rb), reader.per_query(rc)),  # the items' critical checks
    )  # fmt: skip
    return verdict, notes[0]


def critical_lines(critical: Sequence[CheckFailure]) -> list[str]:
    """What gate prints first: each critical check failing for the candidate, and the baseline's result."""
    if not critical:
        return []
    out = [f"CRITICAL CHECKS FAILED: {len(critical)} (the gate fails whatever the metrics)"]
    for f in critical:
        out.append(f"  {f.item_id} assert[{f.index}] {f.check}: {f.detail}; baseline {f.baseline}")
    return out


def render(v: GateVerdict, header: str) -> str:
    """The console: the runs, the caveats in the verdict's order, the table, the tests, the verdict."""
    conf = f"{100 * (1 - v.alpha):g}%"
    headers = ["metric", "better", "baseline", "candidate", "delta", f"{conf} bound", "limit", "MDE", "n",
               "verdict"]  # fmt: skip
    rows = []
    for m in v.metrics:
        e, pw = m.estimate, m.power
        rows.append(
            [
                m.metric,
                "higher" if e.higher_is_better else "lower",
                fmt_num(e.baseline),
                fmt_num(e.candidate),
                fmt_num(e.delta, signed=True),
                ("≥ " if e.higher_is_better else "≤ ") + fmt_num(e.bound, signed=True),
                fmt_num(-pw.margin if e.higher_is_better else pw.margin, signed=True)
                + (" (default)" if pw.default_margin else ""),
                fmt_num(pw.mde),
                str(pw.n),
                m.verdict,
            ]
        )
    by_test: dict[str, list[str]] = {}
    for m in v.metrics:
        by_test.setdefault(m.test.label, []).append(m.metric)
    lines = [*critical_lines(v.critical), *v.caveat_lines(), header, text_table(headers, rows)]  # warnings first
    lines.append("bounds: " + "; ".join(f"{name} for {', '.join(ms)}" for name, ms in by_test.items()))
    failed = [m.metric for m in v.metrics if not m.passed]
    if failed:
        lines.append(
            f"GATE FAILED: {', '.join(failed)} (one-sided {conf} bound of candidate − baseline past the "
            "margin on the metric's worse side)"
        )
    if v.critical:
        lines.append(f"GATE FAILED: {len(v.critical)} critical check(s) fail for the candidate (the eval items' assert lists)")
    if not failed and not v.critical:
        lines.append(f"GATE PASSED ({len(v.metrics)} metric(s); default margin = max(0.01, 1/sqrt(n)))")
    return "\n".join(lines)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reader = MlflowRunReader(tracking_uri(args.tracking_uri))
    try:
        verdict, header = gate_verdict_of(reader, args)
    except RunInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_summary(args, reader, verdict)  # --summary-md FILE: Markdown for a pull request (docs/ci.md)
    print(render(verdict, header))
    return 0 if verdict.verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
