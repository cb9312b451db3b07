"""``compare --sweep``: attribute a sweep's effects to its factors against a baseline, and render
them (docs/metrics.md). The pairwise comparison of two runs is :mod:`rag_experiments.cli.compare`,
which calls :func:`main_sweep` for ``--sweep``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rag_experiments.analysis.attribution import SweepAttribution, factor_effects, infer_factors
from rag_experiments.analysis.baseline import BaselineChoice, levels_label, sweep_baseline
from rag_experiments.analysis.comparability import comparable_only, label_evidence_notes
from rag_experiments.analysis.interactions import sweep_interactions
from rag_experiments.analysis.judge_trust import generation_marker, is_generation_metric
from rag_experiments.analysis.racing import split_stopped
from rag_experiments.core.formatting import md_table, text_blocks, text_table
from rag_experiments.core.run_record import RunData
from rag_experiments.evaluation.aggregate import metric_columns
from rag_experiments.evaluation.headline import sweep_metrics, table_metrics
from rag_experiments.report.tables import (
    NOISE_HEADERS,
    effect_headers,
    effect_rows,
    marginal_headers,
    marginal_rows,
    noise_rows,
)
from rag_experiments.report.wide import sweep_head, wide_sweep_lines
from rag_experiments.run.defaults import default_levels
from rag_experiments.tracking import annotate
from rag_experiments.tracking.judge_runs import check_comparable, check_same_judge
from rag_experiments.tracking.run_reader import RunReader
from rag_experiments.tracking.runs import RunInputError, check_same_evalset, is_id_prefix, pick_by_prefix


def trust_inputs(runs: Sequence[RunData]) -> list[tuple[dict[str, float], dict[str, str]]]:
    """``(metrics, tags)`` per run: what ``analysis.judge_trust`` reads."""
    return [(r.metrics, r.tags) for r in runs]


def safe_name(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s)


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
        out.append(table(effect_headers(att.holm_n), effect_rows(att.effects)))
    out += ["", h("Marginal means over the grid")]
    if not att.marginals.empty:
        out.append(table(marginal_headers(n=att.holm_n), marginal_rows(att.marginals)))
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
    from rag_experiments.analysis.interactions import interaction_headers, interaction_rows
    from rag_experiments.analysis.racing import STOPPED_HEADERS, STOPPED_NOTE, stopped_rows

    out = []
    if interactions is not None and not interactions.terms.empty:
        out += ["", h("Main effects and two-way interactions (full-factorial grid)")]
        out += [table(interaction_headers(interactions), interaction_rows(interactions)), *interactions.lines]
        out.append(f"Method: {interactions.method}.")
    elif len(att.factors) > 1:
        out += ["", "Interactions: not a full-factorial grid, so only the one-factor-at-a-time view above."]
    if stopped:
        out += ["", h(f"Stopped by racing ({len(stopped)})"), table(STOPPED_HEADERS, stopped_rows(stopped))]
        out.append(STOPPED_NOTE)
    return out


def _given_baseline(
    reader: RunReader, children: Sequence[RunData], baseline: str, experiment: str | None
) -> RunData:
    """The run ``--baseline`` names: a child's id, unique id prefix or name, else any run
    (``RunReader.resolve``)."""
    by_id = {r.run_id: r for r in children}
    named = [r for r in children if r.run_name == baseline]
    if baseline in by_id:
        return by_id[baseline]
    if is_id_prefix(baseline) and (rid := pick_by_prefix(baseline, [(r.run_id, r.name) for r in children])):
        return by_id[rid]
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
    allow_incomparable: bool = False,
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
        choice = sweep_baseline(
            data, factors, metrics[0] if metrics else None, defaults=default_levels(factors)
        )
        base_run = next(r for r in children if r.run_id == data[choice.index].run_id)
    for r in children:
        check_same_evalset(base_run, r)
    notes = [n for n in [check_same_judge([base_run, *children], allow_judge_change)] if n]
    if any(d.run_id == base_run.run_id for d in stopped):
        raise RunInputError(
            f"baseline {baseline!r} was stopped early by racing; choose a config that finished"
        )
    base = next((d for d in data if d.run_id == base_run.run_id), None) or reader.with_table(base_run)
    tables = [d.table for d in data if d.table is not None]
    available = metric_columns(*tables)
    if metrics:  # a named metric the configs cannot be compared on is refused (exit 2)
        chosen = list(metrics)
        notes += check_comparable(chosen, data, allow_incomparable, available)
    elif allow_incomparable:
        chosen = sweep_metrics(available, factors)
        notes += check_comparable(chosen, data, True, available)
    else:  # the default: only what is comparable across the configs (docs/metrics.md, "Comparability")
        chosen, left_out = comparable_only(sweep_metrics(available, factors), data, available)
        notes += check_comparable(chosen, data, False, available)  # different corpora: refused
        notes += [f"note: {n}" for n in left_out]
    if any(map(is_generation_metric, chosen)) and (marker := generation_marker(trust_inputs(children))):
        notes.append(f"warning: {marker}")  # human κ < 0.4 (analysis.judge_trust)
    notes += label_evidence_notes(data)  # judge=none runs: labels from correctness only
    att = factor_effects(data, base, chosen, seed=seed, n_resamples=min(n_resamples, 4999))
    inter = sweep_interactions(data, factors, chosen)
    return SweepComparison(children, data, stopped, factors, base, choice, chosen, att, inter, notes)


def main_sweep(reader: RunReader, args: argparse.Namespace) -> int:
    sc = build_sweep_comparison(
        reader,
        args.sweep,
        args.baseline,
        args.metric,
        args.experiment,
        args.seed,
        args.resamples,
        args.allow_judge_change,
        args.allow_incomparable,
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
        path = f"compare/sweep_{safe_name(args.sweep)}_baseline_{safe_name(sc.base.run_id)}.md"
        annotate.log_text(reader.uri, parent, md, path)
        print(f"logged {path} on the sweep's parent run {parent}")
    return 0
