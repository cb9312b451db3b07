"""Agreement of a judge with human labels, and the sampling design that makes it estimable.

One definition of Cohen's κ for the project (the spot-check and ``scripts/judge_agreement.py``),
with optional weights and cross-checked against scikit-learn in the tests; and a sample design whose inclusion probabilities
are known exactly (systematic πps), so statistics on a boosted or stratified sample can be
weighted back to the population they were drawn from (Horvitz–Thompson: weight = 1/π).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def cohen_kappa(a: Sequence[str], b: Sequence[str], weights: Sequence[float] | None = None) -> float:
    """κ = (p_o − p_e) / (1 − p_e) of two raters over the same items.

    With weights w (default 1): p_o = Σ w·[a = b] / Σ w and p_e = Σ_c P_w(a = c)·P_w(b = c), the
    weighted marginals of each rater. NaN with no items, or when p_e = 1 (both raters used one and
    the same category: κ is undefined, not 0 or 1). Equals scikit-learn's
    ``cohen_kappa_score(a, b, sample_weight=w)`` (cross-checked in tests); numpy here because the
    bootstrap calls it thousands of times.
    """
    a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
    if len(a) == 0:
        return float("nan")
    w = np.ones(len(a)) if weights is None else np.asarray(weights, float)
    cats, codes = np.unique(np.concatenate([a, b]).astype(str), return_inverse=True)
    conf = np.zeros((len(cats), len(cats)))
    np.add.at(conf, (codes[: len(a)], codes[len(a) :]), w)
    return float(kappa_of_confusion(conf))


def kappa_of_confusion(conf: np.ndarray) -> np.ndarray:
    """κ of a confusion matrix ``conf[a_category, b_category]`` (weighted counts), or of a stack of
    them (shape ``(..., K, K)``: one κ per matrix, so a bootstrap computes all its resamples at
    once); NaN where the total is 0 or p_e = 1 (:func:`cohen_kappa`)."""
    conf = np.asarray(conf, float)
    total = conf.sum(axis=(-2, -1))
    with np.errstate(divide="ignore", invalid="ignore"):
        po = np.trace(conf, axis1=-2, axis2=-1) / total
        pe = np.einsum("...i,...i->...", conf.sum(axis=-1), conf.sum(axis=-2)) / total**2
        return np.where((total > 0) & (pe < 1 - 1e-12), (po - pe) / (1 - pe), np.nan)


def _bootstrap(n: int, stat, seed: int, n_resamples: int, confidence: float) -> tuple[float, float]:
    """Percentile CI of ``stat(indices)`` over item resamples; undefined (NaN) resamples dropped."""
    rng = np.random.default_rng(seed)
    vals = [v for _ in range(n_resamples) if not math.isnan(v := stat(rng.integers(0, n, n)))]
    if not vals:
        return float("nan"), float("nan")
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(vals, [alpha, 1 - alpha])
    return float(lo), float(hi)


def kappa_ci(
    a: Sequence[str],
    b: Sequence[str],
    weights: Sequence[float] | None = None,
    seed: int = 0,
    n_resamples: int = 2000,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of (weighted) κ: items resampled with their weights; resamples with
    undefined κ are dropped. (NaN, NaN) with fewer than 2 items or no defined resample."""
    a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
    w = np.ones(len(a)) if weights is None else np.asarray(weights, float)
    if len(a) < 2:
        return float("nan"), float("nan")
    return _bootstrap(len(a), lambda i: cohen_kappa(a[i], b[i], w[i]), seed, n_resamples, confidence)


def kappa_delta_ci(
    human: Sequence[str],
    a: Sequence[str],
    b: Sequence[str],
    seed: int = 0,
    n_resamples: int = 2000,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """κ(b, human) − κ(a, human) on the same items, and its paired percentile-bootstrap CI (the
    items resampled once for both raters, so what they share cancels); resamples with an undefined
    κ are dropped. NaNs with fewer than 2 items."""
    h, a, b = (np.asarray(x, dtype=object) for x in (human, a, b))
    if len(h) < 2:
        return float("nan"), float("nan"), float("nan")

    def delta(i) -> float:
        return cohen_kappa(h[i], b[i]) - cohen_kappa(h[i], a[i])

    return (delta(np.arange(len(h))), *_bootstrap(len(h), delta, seed, n_resamples, confidence))


def weighted_share(event: np.ndarray, given: np.ndarray, weights: np.ndarray | None = None) -> float:
    """P_w(event | given) = Σ w·[given ∧ event] / Σ w·[given]; NaN when nothing is ``given``."""
    w = np.ones(len(event)) if weights is None else np.asarray(weights, float)
    den = float(w[given].sum())
    return float(w[given & event].sum()) / den if den > 0 else float("nan")


def agreement_figures(human: np.ndarray, judge: np.ndarray, weights: np.ndarray | None = None) -> dict:
    """A judge against human labels (``supported``/``unsupported``), weighted by ``weights``:
    agreement = P_w(judge = human); κ (:func:`cohen_kappa`); leniency = P_w(judge supported |
    human unsupported); strictness = P_w(judge unsupported | human supported)."""
    h, j = np.asarray(human, dtype=object), np.asarray(judge, dtype=object)
    return {
        "agreement": weighted_share(h == j, np.ones(len(h), bool), weights),
        "kappa": cohen_kappa(h, j, weights),
        "leniency": weighted_share(j == "supported", h == "unsupported", weights),
        "strictness": weighted_share(j == "unsupported", h == "supported", weights),
    }


def inclusion_probabilities(weights: Sequence[float], n: int) -> np.ndarray:
    """π_i = min(1, c·w_i) with c chosen so that Σ π_i = min(n, N).

    Units whose share would exceed 1 are taken with certainty (π = 1) and the rest rescaled, until
    no π exceeds 1. Weights must be positive.
    """
    w = np.asarray(weights, float)
    n = min(int(n), len(w))
    pi = np.zeros(len(w))
    certain = np.zeros(len(w), dtype=bool)
    while True:
        rest = ~certain
        left = n - int(certain.sum())
        pi[certain] = 1.0
        pi[rest] = left * w[rest] / w[rest].sum() if left > 0 and rest.any() else 0.0
        over = rest & (pi >= 1.0)
        if not over.any():
            return pi
        certain |= over


def systematic_pps(pi: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices drawn by systematic πps over a random order: unit i is in the sample with
    probability exactly π_i, and the sample size is round(Σ π).

    The units' π are laid end to end (in a random order) on [0, Σπ); the points u, u+1, u+2, …
    (u uniform on [0, 1)) pick the units whose interval they fall in. As no π exceeds 1, no unit
    is picked twice.
    """
    pi = np.asarray(pi, float)
    order = rng.permutation(len(pi))
    cum = np.cumsum(pi[order])
    n = int(round(cum[-1])) if len(cum) else 0
    points = rng.uniform() + np.arange(n)
    hit = np.minimum(np.searchsorted(cum, points, side="right"), len(pi) - 1)
    return np.sort(order[hit])
