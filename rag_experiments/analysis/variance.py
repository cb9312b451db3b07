"""Where the variance of a generation metric comes from: queries, generation samples, judge repeats.

The model (docs/metrics.md, "Variance decomposition"; docs/noise.md) is the nested random-effects model

    y_qrj = μ + a_q + b_qr + e_qrj,   a ~ (0, σ²_query), b ~ (0, σ²_generation), e ~ (0, σ²_judge)

for query q, replicate (generation sample) r and judge repeat j. The components are the
method-of-moments (ANOVA) estimates from the mean squares, negative estimates truncated at 0.
Pure functions on arrays; :func:`variance_metrics` reads a long per-query table.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from rag_experiments.evaluation.labels import as_thresholds
from rag_experiments.evaluation.registry import GENERATION_METRICS
from rag_experiments.evaluation.replicates import flip_rates
from rag_experiments.judge.repeats import REPEATED_METRICS, judge_repeat_long, n_judge_repeats

__all__ = [
    "COMPONENTS",
    "nested_components",
    "one_way_components",
    "pilot_components",
    "replicate_metrics",
    "shares",
    "variance_metrics",
]

COMPONENTS = ("query", "generation", "judge")


def one_way_components(groups: list[np.ndarray]) -> tuple[float, float]:
    """(σ²_between, σ²_within) of a one-way random-effects layout with unequal group sizes.

    With N values in Q groups of sizes n_i:
    MSB = Σ n_i (ȳ_i − ȳ)² / (Q − 1),  MSW = Σ_i Σ_j (y_ij − ȳ_i)² / (N − Q),
    n0 = (N − Σ n_i² / N) / (Q − 1),
    σ²_within = MSW,  σ²_between = max(0, (MSB − MSW) / n0).
    NaN values are dropped; groups left empty are ignored. NaN when Q < 2 or N − Q < 1.
    """
    gs = [g[~np.isnan(g)] for g in (np.asarray(x, dtype=float) for x in groups)]
    gs = [g for g in gs if g.size]
    q = len(gs)
    n_i = np.array([g.size for g in gs], dtype=float)
    n = float(n_i.sum())
    if q < 2 or n - q < 1:
        return math.nan, math.nan
    means = np.array([g.mean() for g in gs])
    grand = float(np.concatenate(gs).mean())
    msb = float((n_i * (means - grand) ** 2).sum() / (q - 1))
    msw = float(sum(((g - g.mean()) ** 2).sum() for g in gs) / (n - q))
    n0 = (n - float((n_i**2).sum()) / n) / (q - 1)
    return max(0.0, (msb - msw) / n0), msw


def nested_components(y: np.ndarray) -> dict[str, float]:
    """σ² of queries, generation samples and judge repeats from ``y[q, r, j]`` (NaN = missing).

    J = 1 (no judge repeats): the one-way estimates of :func:`one_way_components` over each query's
    replicates (unbalanced allowed); ``judge`` is absent, and judge noise on different answers is
    inside ``generation``. R = 1 (judge repeats only): the same over judge repeats, ``generation``
    absent. R, J > 1: the balanced nested ANOVA over the queries with every (r, j) present:

        MS_Q = R·J·Σ_q (ȳ_q − ȳ)² / (Q − 1)
        MS_G = J·Σ_q Σ_r (ȳ_qr − ȳ_q)² / (Q·(R − 1))
        MS_J = Σ_q Σ_r Σ_j (y_qrj − ȳ_qr)² / (Q·R·(J − 1))
        σ²_judge = MS_J,  σ²_generation = max(0, (MS_G − MS_J) / J),
        σ²_query = max(0, (MS_Q − MS_G) / (R·J))

    (E[MS_J] = σ²_j, E[MS_G] = σ²_j + J·σ²_g, E[MS_Q] = σ²_j + J·σ²_g + R·J·σ²_q).
    """
    y = np.asarray(y, dtype=float)
    if y.ndim == 2:
        y = y[:, :, None]
    q_, r_, j_ = y.shape
    if j_ == 1 or r_ == 1:
        between, within = one_way_components([row.ravel() for row in y])
        return {"query": between, ("generation" if j_ == 1 else "judge"): within}
    full = y[~np.isnan(y).any(axis=(1, 2))]
    q = full.shape[0]
    if q < 2:
        return {c: math.nan for c in COMPONENTS}
    m_qr, m_q, m = full.mean(axis=2), full.mean(axis=(1, 2)), full.mean()
    ms_q = r_ * j_ * float(((m_q - m) ** 2).sum()) / (q - 1)
    ms_g = j_ * float(((m_qr - m_q[:, None]) ** 2).sum()) / (q * (r_ - 1))
    ms_j = float(((full - m_qr[:, :, None]) ** 2).sum()) / (q * r_ * (j_ - 1))
    return {
        "query": max(0.0, (ms_q - ms_g) / (r_ * j_)),
        "generation": max(0.0, (ms_g - ms_j) / j_),
        "judge": ms_j,
    }


def shares(components: dict[str, float]) -> dict[str, float]:
    """Each component over their sum (NaN when the sum is 0 or a component is NaN)."""
    vals = list(components.values())
    total = float(sum(vals))
    if any(math.isnan(v) for v in vals) or total <= 0:
        return {c: math.nan for c in components}
    return {c: v / total for c, v in components.items()}


def _cube(df: pd.DataFrame, col: str) -> np.ndarray:
    """``y[q, r, j]`` of one metric from a per-query table: replicates from the ``replicate`` column,
    judge repeats from ``judge.repeats.judge_repeat_long`` (the one long view of the
    repeats kept in each row); missing cells NaN."""
    long = judge_repeat_long(df, col)
    s = long.set_index(["id", "replicate", "judge_repeat"])[col].astype(float)
    wide = s.unstack(["replicate", "judge_repeat"]).sort_index(axis=1)
    reps, jr = wide.columns.levels
    return (
        wide.reindex(columns=pd.MultiIndex.from_product([reps, jr]))
        .to_numpy()
        .reshape(len(wide), len(reps), len(jr))
    )


def variance_metrics(df: pd.DataFrame) -> dict[str, float]:
    """``var_share/{metric}/{component}`` for each generation metric of a per-query table with
    replicates (a ``replicate`` column) and/or judge repeats (``judge_repeat_labels``).

    Only generated rows whose generation succeeded count. Components the table cannot separate are
    not logged (see :func:`nested_components`): no judge share without judge repeats, and none for
    a metric the repeats do not re-score (``judge_repeats.REPEATED_METRICS``: faithfulness); no
    generation share without replicates. A table with neither gives {}.
    """
    replicated = "replicate" in df.columns
    if not replicated and n_judge_repeats(df) < 2:
        return {}
    rows = df[df["generated"].astype(bool)] if "generated" in df else df
    if "error" in rows:
        rows = rows[rows["error"].isna()]
    out: dict[str, float] = {}
    for m in GENERATION_METRICS:
        if m not in rows or rows[m].notna().sum() < 2:
            continue
        if not replicated and m not in REPEATED_METRICS:
            continue  # one value per query: nothing to split
        for comp, share in shares(nested_components(_cube(rows, m))).items():
            out[f"var_share/{m}/{comp}"] = share
    return out


def pilot_components(df: pd.DataFrame, metric: str) -> tuple[int, int, float, float]:
    """(queries scored, replicates, σ²_query, σ²_generation) of one metric from a pilot run's table.

    Replicated (a ``replicate`` column): the one-way components of :func:`nested_components`.
    Unreplicated (no column, or one replicate per query): σ²_query is the sample variance (ddof 1) of the per-query values, which then
    includes any generation noise, and σ²_generation is NaN (not measured).
    """
    rows = df[df[metric].notna()] if metric in df else df.iloc[0:0]
    if "error" in rows:
        rows = rows[rows["error"].isna()]
    n = int(rows["id"].nunique()) if "id" in rows else len(rows)
    reps = int(rows.groupby("id").size().max()) if "replicate" in rows.columns and not rows.empty else 1
    if reps == 1:  # one replicate (with or without the column): no within-query component
        v = rows[metric].to_numpy(dtype=float) if metric in rows else np.array([])
        return n, 1, (float(np.var(v, ddof=1)) if v.size >= 2 else math.nan), math.nan
    # repeat 0 only: the run's metric is judged once, so its within-query noise is generation + judge
    comps = nested_components(_cube(rows, metric)[:, :, :1])
    return n, reps, comps["query"], comps.get("generation", math.nan)


def replicate_metrics(df: pd.DataFrame, thresholds=None) -> dict[str, float]:
    """The run-level metrics of a replicated table: flip rates (``evaluation.replicates.flip_rates``,
    correct = correctness >= the attribution threshold) and :func:`variance_metrics`."""

    return {**flip_rates(df, as_thresholds(thresholds).correct), **variance_metrics(df)}
