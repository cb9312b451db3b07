"""Compare two runs query by query, or attribute a sweep's effects to its factors (docs/metrics.md).

    python -m rag_experiments.compare RUN_A RUN_B [--all | --metric KEY ...] [--out FILE.md] [--log]
    python -m rag_experiments.compare --sweep SWEEP_ID [--baseline RUN] [--out FILE.md] [--long]

``RUN_A RUN_B`` tests the headline family of the config diff (``evaluation.headline.change_family``),
Holm over it; ``--all``: every common metric. ``--sweep`` without ``--baseline`` uses the default
baseline (``analysis.baseline``, as ``report`` does), printed with why; one row per level, the
swept factors' headline metrics as columns (``evaluation.headline.table_metrics``); ``--long``:
every (level, metric) comparison with CI and p-values, marginal means and noise floor.

Exit codes: 0 ok, 2 bad input (unknown run, missing per_query.parquet, different eval sets, runs
scored by different judges without --allow-judge-change: docs/judges.md).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rag_experiments.analysis.attribution import SweepAttribution, config_diff, factor_effects, infer_factors
from rag_experiments.analysis.baseline import BaselineChoice, context_k, levels_label, sweep_baseline
from rag_experiments.analysis.interactions import sweep_interactions
from rag_experiments.analysis.judge_trust import generation_marker, is_generation_metric
from rag_experiments.analysis.racing import split_stopped
from rag_experiments.analysis.stats import PairedResult, flips, holm, paired_deltas, transition_matrix
from rag_experiments.core.formatting import fmt_num as _f
from rag_experiments.core.formatting import fmt_p as _p
from rag_experiments.core.formatting import md_table, text_blocks, text_table
from rag_experiments.core.run_record import RunData
from rag_experiments.evaluation.aggregate import metric_columns
from rag_experiments.evaluation.headline import change_family, sweep_metrics, table_metrics
from rag_experiments.evaluation.registry import higher_is_better, parse, render_key
from rag_experiments.report.tables import (
    EFFECT_HEADERS,
    NOISE_HEADERS,
    effect_rows,
    marginal_headers,
    marginal_rows,
    noise_rows,
)
from rag_experiments.report.wide import sweep_head, wide_sweep_lines
from rag_experiments.run.defaults import default_levels
from rag_experiments.tracking import annotate
from rag_experiments.tracking.errors import cli_main
from rag_experiments.tracking.judge_runs import ALLOW_FLAG, check_same_judge
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
) -> Comparison:
    """The paired comparison of two runs on ``metrics`` if given, else on every common metric
    (``every_metric``), else on the headline family of the keys their configs differ in
    (:func:`headline_family`). Holm adjusts over exactly the metrics tested."""
    warnings = [w for w in [check_same_evalset(run_a, run_b), check_same_judge([run_a, run_b], allow_judge_change)] if w]
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
        chosen = list(metrics)
        family = f"Metrics: the {len(chosen)} given with --metric."
    elif every_metric:
        chosen = available
        family = f"Metrics: every common metric ({len(chosen)}, --all)."
    else:
        chosen, family = headline_family(run_a, run_b, available)
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
    if any(is_generation_metric(r.metric) for r in results):  # human κ < 0.4 (analysis.judge_trust)
        warnings += [f"warning: {m}" for m in [generation_marker(_trust([run_a, run_b]))] if m]
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
    )


def headline_family(run_a: RunData, run_b: RunData, available: Sequence[str]) -> tuple[list[str], str]:
    """``evaluation.headline.change_family`` of the keys the two configs differ in, at the context
    k of the two (the sweep's rule: a tie goes to the larger)."""
    k = context_k([run_a.params, run_b.params])
    return change_family(list(config_diff(run_a.params, run_b.params)), available, k)


def _trust(runs: Sequence[RunData]) -> list[tuple[dict[str, float], dict[str, str]]]:
    """``(metrics, tags)`` per run: what ``analysis.judge_trust`` reads."""
    return [(r.metrics, r.tags) for r in runs]


# --------------------------------------------------------------------------------------------- rendering


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
        table(RESULT_HEADERS, _result_rows(comp.results)),
        "",
        METHOD_NOTE,
    ]
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
    if not comp.transitions.empty:
        out += ["", h("Failure-label transitions (rows A, columns B)")]
        out.append(table(*_matrix_rows(comp.transitions)))
    return "\n".join(out) + "\n"


def render_sweep(
    att: SweepAttribution,
    sweep_id: str,
    markdown: bool,
    interactions=None,
    stopped: Sequence = (),
    why: str = "",
) -> str:
    table = md_table if markdown else text_table
    h = (lambda s: f"## {s}") if markdown else (lambda s: f"\n== {s} ==")
    out = sweep_head(att, sweep_id, markdown, why)
    if att.skipped:
        out.append("Not in the grid (one-factor-at-a-time comparison skipped): " + "; ".join(att.skipped))
    out += ["", h("One factor at a time: level vs baseline (others at the baseline's values)")]
    if att.effects.empty:
        out.append("(no comparisons)")
    else:
        out.append(table(EFFECT_HEADERS, effect_rows(att.effects)))
    out += ["", h("Marginal means over the grid")]
    if not att.marginals.empty:
        out.append(table(marginal_headers(), marginal_rows(att.marginals)))
        out.append(
            "Marginal mean: each query averaged over the level's runs, then over queries; CI: percentile "
            "bootstrap over queries. p_holm: Holm across every comparison above and below."
        )
    out += ["", h("A/A noise floor (what 'no change' looks like)")]
    if not att.noise_floor.empty:
        out.append(table(NOISE_HEADERS, noise_rows(att.noise_floor)))
        out.append(f"Method: {att.noise_floor['detail'].iloc[0]}")
    out += _sweep_extras(table, h, att, interactions, stopped)
    return "\n".join(out) + "\n"


def render_sweep_wide(
    att: SweepAttribution,
    sweep_id: str,
    markdown: bool,
    columns: Sequence[str],
    interactions=None,
    stopped: Sequence = (),
    why: str = "",
) -> str:
    """One row per level (the baseline first) with ``columns`` (the headline metrics) as columns."""
    table = md_table if markdown else (lambda hs, rs: text_blocks(hs, rs))
    h = (lambda s: f"## {s}") if markdown else (lambda s: f"\n== {s} ==")
    out = wide_sweep_lines(att, sweep_id, markdown, columns, table, h, why)
    out += _sweep_extras(table, h, att, interactions, stopped)
    return "\n".join(out) + "\n"


def _sweep_extras(table, h, att: SweepAttribution, interactions, stopped: Sequence) -> list[str]:
    """Interactions (full-factorial sweeps) and the configs racing stopped (docs/racing.md)."""
    from rag_experiments.analysis.interactions import INTERACTION_HEADERS, interaction_rows
    from rag_experiments.analysis.racing import STOPPED_HEADERS, STOPPED_NOTE, stopped_rows

    out = []
    if interactions is not None and not interactions.terms.empty:
        out += ["", h("Main effects and two-way interactions (full-factorial grid)")]
        out += [table(INTERACTION_HEADERS, interaction_rows(interactions)), *interactions.lines]
        out.append(f"Method: {interactions.method}.")
    elif len(att.factors) > 1:
        out += ["", "Interactions: not a full-factorial grid, so only the one-factor-at-a-time view above."]
    if stopped:
        out += ["", h(f"Stopped by racing ({len(stopped)})"), table(STOPPED_HEADERS, stopped_rows(stopped))]
        out.append(STOPPED_NOTE)
    return out


# --------------------------------------------------------------------------------------------- CLI


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s)


def log_comparison(uri: str, comp: Comparison, markdown: str) -> str:
    """The Markdown and ``compare/<metric>/{delta,ci_low,ci_high,p_value}`` on run B."""
    a, b = comp.run_a.run_id, comp.run_b.run_id
    path = f"compare/{_safe(a)}_vs_{_safe(b)}.md"
    annotate.log_text(uri, b, markdown, path)
    values = {
        f"compare/{r.metric}/{name}": v
        for r in comp.results
        for name, v in (("delta", r.delta), ("ci_low", r.ci_low), ("ci_high", r.ci_high), ("p_value", r.p_value))
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
        "--long", action="store_true", help="--sweep: every (level, metric) comparison, one per row, with CIs and p"
    )
    p.add_argument("--metric", action="append", metavar="KEY", help="metric(s) to compare (default: headline)")
    p.add_argument("--out", type=Path, metavar="FILE.md", help="also write the report as Markdown")
    p.add_argument(
        "--log", action="store_true", help="log the Markdown and compare/<metric>/* metrics on run B"
    )
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--experiment", metavar="NAME", help="look run names up in this experiment only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resamples", type=int, default=9999, help="bootstrap / permutation resamples")
    p.add_argument(ALLOW_FLAG, action="store_true", help="compare runs scored by different judges (noted in the output)")
    return p


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reader = MlflowRunReader(tracking_uri(args.tracking_uri))
    try:
        if args.sweep:
            return _main_sweep(reader, args)
        if len(args.runs) != 2:
            raise RunInputError("give exactly two runs (RUN_A RUN_B), or --sweep SWEEP_ID [--baseline RUN]")
        run_a = reader.resolve(args.runs[0], args.experiment)
        run_b = reader.resolve(args.runs[1], args.experiment)
        comp = build_comparison(
            reader, run_a, run_b, args.metric, args.seed, args.resamples, args.allow_judge_change, args.every_metric
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
        print(f"logged {log_comparison(reader.uri, comp, md)} and compare/* metrics on run {run_label(run_b)}")
    return 0


def _given_baseline(reader: RunReader, children: Sequence[RunData], baseline: str, experiment: str | None) -> RunData:
    """The run ``--baseline`` names: a child's id or name, else any run (``RunReader.resolve``)."""
    by_id = {r.run_id: r for r in children}
    named = [r for r in children if r.run_name == baseline]
    if baseline in by_id:
        return by_id[baseline]
    if len(named) == 1:
        return named[0]
    if len(named) > 1:
        ids = ", ".join(r.run_id for r in named)
        raise RunInputError(f"baseline name {baseline!r} is ambiguous in the sweep: {ids}")
    return reader.resolve(baseline, experiment)


@dataclass
class SweepComparison:
    """``compare --sweep``'s result: the attribution against the baseline, before rendering."""

    children: list[RunData]
    data: list[RunData]  # the configs that covered the eval set, with their tables
    stopped: list[RunData]  # stopped early by racing (docs/racing.md)
    factors: list[str]
    base: RunData
    choice: BaselineChoice | None  # None: given with --baseline
    metrics: list[str]
    attribution: SweepAttribution
    interactions: object
    notes: list[str] = field(default_factory=list)  # printed before the tables

    @property
    def why(self) -> str:
        return self.choice.why if self.choice else "given with --baseline"


def build_sweep_comparison(
    reader: RunReader,
    sweep_id: str,
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    experiment: str | None = None,
    seed: int = 0,
    n_resamples: int = 4999,
    allow_judge_change: bool = False,
) -> SweepComparison:
    """The factor attribution of a sweep (``analysis.attribution.factor_effects``) against
    ``baseline`` (a run id or name), else the default baseline (``analysis.baseline``)."""
    children = reader.sweep_children(sweep_id, experiment)
    if not children:
        raise RunInputError(f"no child runs with sweep_id {sweep_id!r}")
    data, stopped = split_stopped([reader.with_table(r) for r in children])  # racing: docs/racing.md
    factors = infer_factors(data)
    choice: BaselineChoice | None = None
    if baseline:
        base_run = _given_baseline(reader, children, baseline, experiment)
    else:  # the report's rule (analysis.baseline), on the configs that finished
        choice = sweep_baseline(data, factors, metrics[0] if metrics else None, defaults=default_levels(factors))
        base_run = next(r for r in children if r.run_id == data[choice.index].run_id)
    for r in children:
        check_same_evalset(base_run, r)
    notes = [n for n in [check_same_judge([base_run, *children], allow_judge_change)] if n]
    if any(d.run_id == base_run.run_id for d in stopped):
        raise RunInputError(f"baseline {baseline!r} was stopped early by racing; choose a config that finished")
    base = next((d for d in data if d.run_id == base_run.run_id), None) or reader.with_table(base_run)
    tables = [d.table for d in data if d.table is not None]
    chosen = list(metrics) if metrics else sweep_metrics(metric_columns(*tables), factors)
    if any(map(is_generation_metric, chosen)) and (marker := generation_marker(_trust(children))):
        notes.append(f"warning: {marker}")  # human κ < 0.4 (analysis.judge_trust)
    att = factor_effects(data, base, chosen, seed=seed, n_resamples=min(n_resamples, 4999))
    inter = sweep_interactions(data, factors, chosen)
    return SweepComparison(children, data, stopped, factors, base, choice, chosen, att, inter, notes)


def _main_sweep(reader: RunReader, args: argparse.Namespace) -> int:
    sc = build_sweep_comparison(
        reader,
        args.sweep,
        args.baseline,
        args.metric,
        args.experiment,
        args.seed,
        args.resamples,
        args.allow_judge_change,
    )
    judge_notes = [n for n in sc.notes if not n.startswith("warning: ")]
    for n in judge_notes:
        print(n)
    print(sc.choice.line() if sc.choice else f"baseline: {levels_label(sc.base, sc.factors)} ({sc.why})")
    for n in sc.notes:
        if n not in judge_notes:
            print(n)
    att, inter, stopped, why = sc.attribution, sc.interactions, sc.stopped, sc.why
    if args.long:
        print(render_sweep(att, args.sweep, False, inter, stopped, why))
        md = render_sweep(att, args.sweep, True, inter, stopped, why)
    else:  # one row per level: the headline metrics (or the --metric keys) as columns
        cols = list(args.metric) if args.metric else table_metrics(sc.metrics, sc.factors)
        print(render_sweep_wide(att, args.sweep, False, cols, inter, stopped, why))
        md = render_sweep_wide(att, args.sweep, True, cols, inter, stopped, why)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(md)
        print(f"wrote {args.out}")
    if args.log:
        parent = sc.children[0].parent_id or sc.base.run_id
        path = f"compare/sweep_{_safe(args.sweep)}_baseline_{_safe(sc.base.run_id)}.md"
        annotate.log_text(reader.uri, parent, md, path)
        print(f"logged {path} on the sweep's parent run {parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
