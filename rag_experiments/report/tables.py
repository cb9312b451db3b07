"""Table rows shared by the report and ``compare``: number formats, effect / noise / marginal rows.

A table is headers plus rows of strings; :func:`md_table` and :func:`text_table` lay one out for a
Markdown file or a terminal. The report lays its tables out with templates (``report/render.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from rag_experiments.core.formatting import (  # noqa: F401  (report modules import them here)
    TEXT_WIDTH,
    fmt_num,
    fmt_p,
    md_table,
    text_blocks,
    text_table,
)
from rag_experiments.evaluation.registry import higher_is_better

Fmt = Callable[..., str]


EFFECT_HEADERS = ["level", "metric", "baseline", "level mean", "delta", "95% CI", "p", "p_holm", "test", "n"]


def holm_header(n: int) -> str:
    """The p_holm column's header, naming its family's size."""
    return f"p_holm (Holm over {n})"


def effect_headers(n: int) -> list[str]:
    """:data:`EFFECT_HEADERS` with the Holm family's size in the p_holm header."""
    return [holm_header(n) if h == "p_holm" else h for h in EFFECT_HEADERS]


def effect_rows(effects: pd.DataFrame, f: Fmt = fmt_num, p: Fmt = fmt_p) -> list[list[str]]:
    """One table row per one-factor-at-a-time comparison (``*``: p_holm < 0.05)."""
    return [
        [
            f"{r.factor}={r.level}",
            r.metric,
            f(r.mean_a),
            f(r.mean_b),
            f(r.delta, signed=True),
            f"[{f(r.ci_low, signed=True)}, {f(r.ci_high, signed=True)}]",
            p(r.p_value),
            p(r.p_holm) + (" *" if r.p_holm < 0.05 else ""),
            r.test,
            str(r.n_pairs),
        ]
        for r in effects.itertuples()
    ]


NOISE_HEADERS = ["metric", "method", "delta", "95% interval", "n"]


def noise_rows(noise: pd.DataFrame, f: Fmt = fmt_num) -> list[list[str]]:
    """One table row per metric of the A/A noise floor."""
    return [
        [
            r.metric,
            r.method,
            f(r.delta, signed=True),
            f"[{f(r.low, signed=True)}, {f(r.high, signed=True)}]",
            str(r.n),
        ]
        for r in noise.itertuples()
    ]


def marginal_headers(with_p_value: bool = True, n: int | None = None) -> list[str]:
    p = ["p"] if with_p_value else []
    return ["level", "metric", "runs", "mean", "95% CI", "vs baseline level", *p, "p_holm" if n is None else holm_header(n)]


def marginal_rows(
    marginals: pd.DataFrame, f: Fmt = fmt_num, p: Fmt = fmt_p, with_p_value: bool = True
) -> list[list[str]]:
    """One table row per (factor level, metric) marginal mean over the grid."""
    rows = []
    for r in marginals.itertuples():
        row = [
            f"{r.factor}={r.level}" + (" (baseline)" if r.is_baseline_level else ""),
            r.metric,
            str(r.n_runs),
            f(r.mean),
            f"[{f(r.ci_low)}, {f(r.ci_high)}]",
            f(r.delta_vs_baseline_level, signed=True),
        ]
        rows.append(row + ([p(r.p_value)] if with_p_value else []) + [p(r.p_holm)])
    return rows


def level_key(r) -> str:
    """``factor=level``, the label of a level in every attribution table."""
    return f"{r.factor}={r.level}"


def wide_rows(df: pd.DataFrame, metrics: Sequence[str], cell: Callable[..., str]) -> list[list[str]]:
    """One row per (factor, level) of ``df`` (first-seen order) with one column per metric:
    ``cell(row)`` for that (level, metric), ``–`` where the level has none."""
    by_level: dict[str, dict[str, str]] = {}
    for r in df.itertuples():
        by_level.setdefault(level_key(r), {})[r.metric] = cell(r)
    return [[lev, *(cells.get(m, "–") for m in metrics)] for lev, cells in by_level.items()]


def metric_header(metric: str) -> str:
    """The metric key, with ``(↓)`` when lower is better (failure rates, latencies): a + delta is worse."""
    try:
        return metric + (" (↓)" if higher_is_better(metric) is False else "")
    except KeyError:
        return metric
