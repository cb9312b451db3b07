"""From per-query columns to logged aggregates: means with bootstrap CIs, per-tag means, counts.

Which columns are metrics, and in which order they are shown, comes from the metric registry
(:mod:`rag_experiments.evaluation.registry`). :func:`mean_ci` is the one bootstrap confidence
interval of the project: the aggregates and the paired statistics (``analysis.stats``) both use it.
A replicated table (``replicates: R``, one row per item and replicate) is first collapsed to one row
per query (``evaluation.replicates.collapse_replicates``), so every CI is a cluster bootstrap over
queries of the replicate means (:func:`cluster_mean_ci`, docs/metrics.md).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from rag_experiments.core.query_table import cell
from rag_experiments.evaluation.registry import REGISTRY, parse, render_key
from rag_experiments.evaluation.replicates import collapse_replicates

__all__ = ["aggregate", "cluster_mean_ci", "mean_ci", "metric_columns", "resampled_means"]

log = logging.getLogger(__name__)

#: Per-query columns that are never metrics (identity, text, labels).
_NOT_METRICS = frozenset({"id", "query", "tags", "failure_label", "error"})


def mean_ci(
    values: Sequence[float] | np.ndarray,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    alternative: str = "two-sided",
) -> tuple[float, float, float, int]:
    """Mean over the non-NaN values with a percentile bootstrap confidence interval.

    Returns ``(mean, low, high, n)``: the values are resampled with replacement ``n_resamples``
    times (numpy Generator seeded with ``seed``, so the CI is reproducible) and the bounds are
    quantiles of the resampled means: ``(1 - confidence)/2`` and ``(1 + confidence)/2`` for
    ``alternative="two-sided"``; for ``"greater"`` the one-sided lower bound, the
    ``1 - confidence`` quantile, with ``high = +inf``; for ``"less"`` the ``confidence`` quantile
    as ``high`` with ``low = -inf``. NaN values (e.g. retrieval metrics of unanswerable queries)
    are dropped; ``n`` counts the rest. All NaN or empty: ``(nan, nan, nan, 0)``. One value v:
    ``(v, v, v, 1)`` (two-sided).
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be two-sided, greater or less, got {alternative!r}")
    v = np.asarray(values, dtype=float).ravel()
    v = v[~np.isnan(v)]
    n = int(v.size)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), 0
    mean = float(v.mean())
    if n == 1 or n_resamples <= 0:
        low, high = mean, mean
    else:
        means = _resampled_means(v, n_resamples, seed)
        if alternative == "two-sided":
            alpha = (1.0 - confidence) / 2.0
            low, high = np.quantile(means, [alpha, 1.0 - alpha])
        elif alternative == "greater":
            low, high = np.quantile(means, 1.0 - confidence), mean
        else:
            low, high = mean, np.quantile(means, confidence)
        # Float noise can put a bound a hair past the mean when all values are equal.
        low, high = float(min(low, mean)), float(max(high, mean))
    if alternative == "greater":
        high = math.inf
    elif alternative == "less":
        low = -math.inf
    return mean, low, high, n


def cluster_mean_ci(
    values: Sequence[float] | np.ndarray,
    clusters: Sequence | np.ndarray,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float, int]:
    """Two-level (cluster) bootstrap: average the values within each cluster (a query's replicates,
    NaN left out), then :func:`mean_ci` over the cluster means. Returns ``(mean, low, high, n)``
    with n the number of clusters with a value.

    Resampling whole queries keeps the replicate noise in the interval: a query mean of R replicates
    varies by σ²_between + σ²_within/R, so Var(grand mean) = σ²_between/n + σ²_within/(n·R), which
    is what resampling the n query means estimates. Resampling the replicates again inside each
    drawn query would count σ²_within/R twice (Davison & Hinkley 1997, §3.8).
    """
    frame = pd.DataFrame({"c": np.asarray(clusters), "v": np.asarray(values, dtype=float)})
    means = frame.groupby("c", sort=False)["v"].mean().to_numpy()
    return mean_ci(means, n_resamples=n_resamples, seed=seed, confidence=confidence)


def resampled_means(v: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """The ``n_resamples`` bootstrap means :func:`mean_ci` takes its quantiles of (same seed, same
    draws), for a test that needs the distribution itself (``analysis.gate``)."""
    return _resampled_means(np.asarray(v, float), n_resamples, seed)


def _resampled_means(v: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    n = v.size
    rng = np.random.default_rng(seed)
    # Resample in blocks to bound memory (n_resamples x n indices); the block size depends only
    # on n, so a given input always draws the same indices.
    block = max(1, min(n_resamples, 4_000_000 // n))
    means = np.empty(n_resamples)
    for lo in range(0, n_resamples, block):
        hi = min(lo + block, n_resamples)
        means[lo:hi] = v[rng.integers(0, n, size=(hi - lo, n))].mean(axis=1)
    return means


def _order(col: str) -> tuple[int, tuple, str]:
    got = parse(col)
    if got is None:
        return (len(REGISTRY), (), col)
    s, params = got
    return (REGISTRY.index(s), tuple(str(params[p]).zfill(8) for p in s.params), col)


def metric_columns(*tables: pd.DataFrame, known_only: bool = True) -> list[str]:
    """Numeric per-query metric columns common to all tables, in registry order.

    ``known_only``: only registered per-query metrics (the registry's ``per_query`` specs; latencies
    and counts are compared only when asked for by name). Otherwise every common numeric column.
    """
    common = [
        c for c in tables[0].columns if c not in _NOT_METRICS and all(c in t.columns for t in tables[1:])
    ]
    num = [
        c
        for c in common
        if all(pd.api.types.is_numeric_dtype(t[c]) and not pd.api.types.is_bool_dtype(t[c]) for t in tables)
    ]
    if known_only:
        known = []
        for c in num:
            got = parse(c)
            if got is not None and got[0].per_query and got[1]["form"] == "mean":
                known.append(c)
            elif got is None and all(pd.api.types.is_float_dtype(t[c]) for t in tables):
                log.warning("per-query column %r is not a registered metric: not aggregated or compared", c)
        num = known
    return sorted(num, key=_order)


def aggregate(df: pd.DataFrame, n_resamples: int = 1000, seed: int = 0) -> dict[str, float]:
    """Means with bootstrap CIs (:func:`mean_ci`), per-tag means and counts; keys as registered.

    NaN values (undefined for that query, e.g. retrieval metrics of unanswerable items) are not
    averaged in; how many queries each mean covers is logged as ``n_scored/{key}``. A replicated
    table is collapsed to its query means first (:func:`cluster_mean_ci`'s cluster bootstrap);
    ``n_unparseable_verdicts`` still counts every replicate's verdicts.
    """
    long, df = df, collapse_replicates(df)
    out: dict[str, float] = {}
    tags = sorted({t for ts in df["tags"] for t in ts})
    masks = {tag: df["tags"].map(lambda ts, tag=tag: tag in ts).to_numpy() for tag in tags}
    for col in metric_columns(df):
        s, params = parse(col)
        p = {n: params[n] for n in s.params}
        mean, lo, hi, n = mean_ci(df[col].to_numpy(dtype=float), n_resamples=n_resamples, seed=seed)
        out[col] = mean
        out[render_key(s.pattern, "ci_low", **p)] = lo
        out[render_key(s.pattern, "ci_high", **p)] = hi
        out[render_key(s.pattern, "n_scored", **p)] = n
        for tag in tags:
            vals = df.loc[masks[tag], col].to_numpy(dtype=float)
            if np.isfinite(vals).any():
                out[render_key(s.pattern, "by_tag", tag=tag, **p)] = float(np.nanmean(vals))
    out["n_queries"] = len(df)
    out["n_errors"] = int(df["error"].notna().sum()) if "error" in df else 0
    out["n_unparseable_verdicts"] = int(long["n_unparseable"].sum()) if "n_unparseable" in long else 0
    out["n_unanswerable"] = sum(not cell("gold_spans", v) for v in df["gold_spans"])
    return out
