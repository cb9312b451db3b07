"""``compare --sweep``'s default form: one row per level with the headline metrics as columns.

The long form (one row per level and metric, with CIs and p-values) is ``cli.compare_sweep.render_sweep``
(``--long``); both show the same :class:`~rag_experiments.analysis.attribution.SweepAttribution`,
so a ``*`` here is a p_holm < 0.05 there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from rag_experiments.analysis.attribution import SweepAttribution
from rag_experiments.analysis.attribution import _level as level_of  # the level the effects rows name
from rag_experiments.evaluation.headline import generates, headline_reason
from rag_experiments.report.tables import fmt_num as _f
from rag_experiments.report.tables import metric_header, wide_rows

WIDE_NOTE = (
    "Cell: the level's mean, then its delta vs the baseline (one factor at a time, the other factors "
    "at the baseline's values); * = p_holm < 0.05 (Holm over the {n} comparisons; --long shows the "
    "CIs and p-values); (↓): lower is better. A/A noise: the 95 % range of a no-change delta ({method})."
)


def constant_columns(att: SweepAttribution, columns: Sequence[str]) -> dict[str, float]:
    """The ``columns`` whose mean is the same for the baseline and every level (nothing to read)."""
    base = att.baseline.table if att.baseline.table is not None else pd.DataFrame()
    out = {}
    for m in columns:
        if m not in base:
            continue
        vals = {round(float(base[m].mean()), 12)}
        for df, col in ((att.effects, "mean_b"), (att.marginals, "mean")):
            if not df.empty and col in df:
                vals |= {round(float(v), 12) for v in df.loc[df["metric"] == m, col]}
        if len(vals) == 1:
            out[m] = vals.pop()
    return out


def sweep_head(att: SweepAttribution, sweep_id: str, markdown: bool, why: str = "") -> list[str]:
    """The first lines of every ``compare --sweep`` form: title, baseline (and why), the factors."""
    return [
        (f"# Sweep attribution: {sweep_id}" if markdown else f"Sweep attribution  {sweep_id}"),
        "",
        f"Baseline: {att.baseline.name} ({att.baseline.run_id[:8]})" + (f": {why}" if why else ""),
        "Factors: "
        + ("; ".join(f"{f} ∈ {{{', '.join(v)}}}" for f, v in att.factors.items()) or "(none vary)"),
    ]


def wide_sweep_lines(
    att: SweepAttribution,
    sweep_id: str,
    markdown: bool,
    columns: Sequence[str],
    table: Callable,
    h: Callable,
    why: str = "",
) -> list[str]:
    """The head of ``compare --sweep`` and one row per level (the baseline first) with ``columns``
    (the headline metrics) as columns; ``table`` lays a table out, ``h`` a heading."""
    base = att.baseline
    cols = [
        m for m in columns if m in set(att.effects.get("metric", [])) | set(att.marginals.get("metric", []))
    ]
    same = constant_columns(att, cols)
    cols = [m for m in cols if m not in same]
    reason = headline_reason(att.factors, generates(columns))
    out = [
        *sweep_head(att, sweep_id, markdown, why),
        "Columns: the headline metrics of the swept factors" + (f" ({reason})" if reason else "") + ".",
    ]
    if att.skipped:
        out.append("Not in the grid (one-factor-at-a-time comparison skipped): " + "; ".join(att.skipped))
    headers = ["level", *map(metric_header, cols)]
    table_ = base.table if base.table is not None else pd.DataFrame()
    base_label = ", ".join(f"{f}={level_of(base, f)}" for f in att.factors) or base.name
    rows = [[f"{base_label} (baseline)", *(_f(table_[m].mean(), 3) if m in table_ else "–" for m in cols)]]
    rows += wide_rows(att.effects, cols, _wide_cell) if not att.effects.empty else []
    method = "none"
    if not att.noise_floor.empty:
        noise = {r.metric: f"±{_f(max(abs(r.low), abs(r.high)), 3)}" for r in att.noise_floor.itertuples()}
        method = str(att.noise_floor["method"].iloc[0])
        rows.append([f"A/A noise (95 %, {method})", *(noise.get(m, "–") for m in cols)])
    out += ["", h("Levels vs the baseline"), table(headers, rows), ""]
    if same:
        out += ["Constant across the configs (not in the table): " + ", ".join(f"{m} = {_f(v, 3)}" for m, v in same.items()), ""]
    detail = att.noise_floor["detail"].iloc[0] if not att.noise_floor.empty else "no noise floor"
    out.append(WIDE_NOTE.format(n=att.holm_n, method=f"{method}: {detail}"))
    if len(att.factors) > 1 and not att.marginals.empty:
        out += ["", h("Marginal means over the grid (level mean, delta vs the baseline's level)")]
        marg = att.marginals.assign(
            level=[
                f"{r.level} (baseline)" if r.is_baseline_level else str(r.level)
                for r in att.marginals.itertuples()
            ]
        )
        out.append(table(headers, wide_rows(marg, cols, _marginal_cell)))
    return out


def _wide_cell(r) -> str:
    star = "*" if r.p_holm is not None and r.p_holm < 0.05 else ""
    return f"{_f(r.mean_b, 3)} {_f(r.delta, 3, signed=True)}{star}"


def _marginal_cell(r) -> str:
    if r.is_baseline_level:
        return _f(r.mean, 3)
    star = "*" if r.p_holm is not None and r.p_holm < 0.05 else ""
    return f"{_f(r.mean, 3)} {_f(r.delta_vs_baseline_level, 3, signed=True)}{star}"
