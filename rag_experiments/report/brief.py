"""The short answer under the report's question: a few lines of "In brief", then one compact
levels × metrics table of the one-factor-at-a-time deltas (sign, size, Holm significance) instead
of a sentence listing every significant (level, metric) pair.
"""

from __future__ import annotations

from collections.abc import Sequence

from rag_experiments.analysis.attribution import SweepAttribution
from rag_experiments.evaluation.headline import CHUNKING_REASON, GENERATION_HEADLINE, GENERATION_REASON
from rag_experiments.evaluation.registry import higher_is_better
from rag_experiments.report.load import Config
from rag_experiments.report.model import Block, Paragraph, Text, bold, code, f3, table, text, with_ci
from rag_experiments.report.tables import fmt_p, level_key, metric_header, wide_rows

ALPHA = 0.05  # Holm-adjusted significance level of every mark in the report


def _better(metric: str, delta: float) -> bool:
    """A positive change in the metric's own direction (failure rates are better lower)."""
    try:
        return (delta > 0) == (higher_is_better(metric) is not False)
    except KeyError:
        return delta > 0


def _effect_text(r) -> str:
    return f"{f3(r.delta, signed=True)} [{f3(r.ci_low, signed=True)}, {f3(r.ci_high, signed=True)}]"


def in_brief(
    base: Config, primary: str, att: SweepAttribution | None, why: str = "", also: Sequence[str] = ()
) -> list[Text]:
    """At most four lines: the baseline on the primary metric (and on ``also``, the rest of the
    generation headline when a generation metric leads) with ``why`` it is the baseline, why that
    metric (budgeted or generation), what differs significantly on it, and how many comparisons are
    significant (the table has them all)."""
    shown = [primary, *(m for m in also if m != primary and m in base.metrics)]
    values = "; ".join(f"{m} = {with_ci(base.metrics, m)}" for m in shown)
    out = [text("Baseline ", bold(base.label), f" ({why})" if why else "", f": {values}.")]
    if primary.endswith("tok"):
        out.append(
            text(
                f"Primary metric {primary}: {CHUNKING_REASON} (the context holds the same number of tokens)."
            )
        )
    elif primary in GENERATION_HEADLINE:
        out.append(text(f"Primary metric {primary}: {GENERATION_REASON} (docs/metrics.md)."))
    if att is None or att.effects.empty:
        return out
    eff = att.effects
    on_primary = eff[eff["metric"] == primary]
    sig = on_primary[on_primary["p_holm"] < ALPHA]
    if not on_primary.empty and sig.empty and not (on_primary["delta"].abs() > 0).any():
        out.append(text(f"On {primary} every level equals the baseline on every query pair (no difference)."))
    elif not on_primary.empty and sig.empty:
        top = on_primary.loc[on_primary["delta"].abs().idxmax()]
        out.append(
            text(
                f"On {primary} no level differs significantly from the baseline (largest difference: "
                f"{level_key(top)} {_effect_text(top)}, p_holm {fmt_p(top.p_holm)}, Holm over {att.holm_n})."
            )
        )
    elif not sig.empty:
        parts = [
            f"{level_key(r)} {'better' if _better(primary, r.delta) else 'worse'} {_effect_text(r)}"
            for r in sig.itertuples()
        ]
        out.append(text(f"On {primary}, significant after Holm: " + "; ".join(parts) + "."))
    every = eff[eff["p_holm"] < ALPHA]
    if every.empty:
        out.append(
            text("No one-factor-at-a-time difference is significant after Holm correction (p_holm < 0.05).")
        )
    else:
        n_better = sum(_better(r.metric, r.delta) for r in every.itertuples())
        out.append(
            text(
                f"Significant after Holm (p_holm < 0.05): {len(every)} of {len(eff)} (level, metric) "
                f"comparisons, {n_better} better and {len(every) - n_better} worse than the baseline "
                "(the table below)."
            )
        )
    return out


def _cell(r) -> Text:
    cell = f3(round(r.delta, 3) + 0.0, signed=True)  # no -0.000
    return text(bold(cell), " *") if r.p_holm < ALPHA else text(cell)  # a lone "*": no emphasis


def levels_table(base: Config, att: SweepAttribution | None) -> list[Block]:
    """Levels × metrics: each level's delta vs the baseline (one factor at a time), bold with ``*``
    when p_holm < 0.05; empty when there is nothing to compare."""
    if att is None or att.effects.empty:
        return []
    metrics = list(dict.fromkeys(att.effects["metric"]))
    note = text(
        "Each level against the baseline ",
        bold(base.label),
        ": delta of the mean (",
        code("*"),
        f": p_holm < 0.05, Holm over the {att.holm_n} comparisons; (↓): lower is better). CIs and p-values: "
        "the Attribution section.",
    )
    rows = wide_rows(att.effects, metrics, _cell)
    return [Paragraph(note), table(["level", *map(metric_header, metrics)], rows)]
