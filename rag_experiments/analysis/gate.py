"""Gate decisions: paired non-inferiority of a candidate against a baseline, per metric.

The direction of each metric comes from the caller (the CLI reads it from the metric registry):
for a higher-is-better metric the candidate may not *drop* by more than the margin, for a
lower-is-better one (a failure rate, a latency) it may not *rise* by more than the margin.
No MLflow, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rag_experiments.analysis.power import mde
from rag_experiments.analysis.stats import as_series, pair
from rag_experiments.evaluation.aggregate import mean_ci

__all__ = ["GateResult", "default_margin", "min_detectable_effect", "non_inferiority"]


def default_margin(n: int) -> float:
    """Default non-inferiority margin: ``max(0.01, 1 / sqrt(n))`` for n paired queries.

    1/√n is (≈) the 95 % CI half-width of a proportion near 0.5 measured on n queries (1.96·0.5/√n):
    the resolution of the eval set itself. A change for the worse smaller than that is not a claim
    the eval set can support, a larger one is. It shrinks with n — 0.10 at 100 queries, 0.05 at
    400, 0.014 at 5,000 — with a floor of one point. It is data-independent on purpose: a margin
    derived from the observed paired SD would grow with the candidate's own churn.
    """
    if n <= 0:
        return float("nan")
    return max(0.01, 1.0 / math.sqrt(n))


@dataclass
class GateResult:
    metric: str
    baseline: float
    candidate: float
    delta: float  # mean(candidate - baseline)
    lower: float  # one-sided (1 - alpha) lower bound of delta; -inf when lower is better
    margin: float
    mde: float
    n_pairs: int
    alpha: float
    passed: bool
    higher_is_better: bool = True
    upper: float = math.inf  # one-sided (1 - alpha) upper bound of delta when lower is better

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"

    @property
    def bound(self) -> float:
        """The confidence bound on the worse side: ``lower`` (higher is better) or ``upper``."""
        return self.lower if self.higher_is_better else self.upper


def non_inferiority(
    a: pd.Series,
    b: pd.Series,
    margin: float | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    n_resamples: int = 9999,
    metric: str = "",
    higher_is_better: bool = True,
) -> GateResult:
    """Is candidate ``b`` no worse than baseline ``a`` by more than ``margin``?

    d = b − a per paired query. Higher is better: lower = the one-sided (1 − alpha) lower bound of
    mean(d) (seeded percentile paired bootstrap, ``evaluation.aggregate.mean_ci``); PASS iff
    lower >= −margin. Lower is better: upper = the one-sided (1 − alpha) upper bound of mean(d);
    PASS iff upper <= +margin. ``margin=None`` uses ``default_margin(n_pairs)``.
    """
    xa, xb, _ = pair(as_series(a), as_series(b))
    n = int(xa.size)
    m = default_margin(n) if margin is None else float(margin)
    nan = float("nan")
    if n == 0:
        return GateResult(metric, nan, nan, nan, nan, m, nan, 0, alpha, False, higher_is_better, nan)
    d = xb - xa
    alternative = "greater" if higher_is_better else "less"
    _, lower, upper, _ = mean_ci(
        d, n_resamples=n_resamples, seed=seed, confidence=1 - alpha, alternative=alternative
    )
    passed = lower >= -m - 1e-12 if higher_is_better else upper <= m + 1e-12
    return GateResult(
        metric=metric,
        baseline=float(xa.mean()),
        candidate=float(xb.mean()),
        delta=float(d.mean()),
        lower=lower,
        margin=m,
        mde=min_detectable_effect(xa, xb, alpha=alpha),
        n_pairs=n,
        alpha=alpha,
        passed=bool(passed),
        higher_is_better=higher_is_better,
        upper=upper,
    )


def min_detectable_effect(
    a: pd.Series | np.ndarray, b: pd.Series | np.ndarray, alpha: float = 0.05, power: float = 0.8
) -> float:
    """Smallest true mean shift the one-sided test detects with ``power``: normal approximation
    ``(z_{1−α} + z_{power}) · sd(b − a) / √n`` from the observed paired SD (``analysis.power.mde``
    with σ²_between = the paired variance, replicates already averaged into it)."""
    if isinstance(a, pd.Series) and isinstance(b, pd.Series):
        xa, xb, _ = pair(as_series(a), as_series(b))
    else:
        xa, xb = np.asarray(a, float), np.asarray(b, float)
        keep = ~(np.isnan(xa) | np.isnan(xb))
        xa, xb = xa[keep], xb[keep]
    n = xa.size
    if n < 2:
        return float("nan")
    var = float(np.var(xb - xa, ddof=1))
    return mde(var, n, alpha=alpha, power=power, sides=1)
