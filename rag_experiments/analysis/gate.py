"""Gate decisions: paired non-inferiority of a candidate against a baseline, per metric.

The direction of each metric comes from the caller (the CLI reads it from the metric registry):
for a higher-is-better metric the candidate may not *drop* by more than the margin, for a
lower-is-better one (a failure rate, a latency) it may not *rise* by more than the margin.

The test: Tango's score test for paired proportions when both columns are 0/1 (hit@k, the
failure-label rates, exact match), a seeded percentile paired bootstrap otherwise. The bootstrap
is anti-conservative on 0/1 metrics (a candidate exactly a margin worse passed 7–8 % of the time
at α = 0.05 for n = 30–100, docs/metrics.md "Calibration"); the score test holds the level there.
No MLflow, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from rag_experiments.analysis.checks import CheckFailure
from rag_experiments.analysis.power import WIDE_DEFAULT_MARGIN, Underpowered, mde, n_for_margin
from rag_experiments.analysis.stats import as_series, holm, is_binary, pair
from rag_experiments.evaluation.aggregate import resampled_means

__all__ = [
    "GateResult",
    "default_margin",
    "gate_passed",
    "gate_power",
    "vacuous",
    "min_detectable_effect",
    "non_inferiority",
    "non_inferiority_family",
    "non_inferiority_p",
    "score_bound",
    "score_p",
    "tango_z",
]


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
    p_value: float = math.nan  # non-inferiority p: passed iff p_value <= alpha (non_inferiority_p)
    p_holm: float = math.nan  # Holm over the family tested together (= p_value for one test)
    test: str = "bootstrap"  # "score" (Tango, 0/1 metrics) or "bootstrap" (percentile)
    var_d: float = math.nan  # sample variance (ddof 1) of the paired differences
    unit_range: bool = False  # every value of both runs lies in [0, 1]: no mean delta exceeds 1

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"

    @property
    def bound(self) -> float:
        """The confidence bound on the worse side: ``lower`` (higher is better) or ``upper``."""
        return self.lower if self.higher_is_better else self.upper


def non_inferiority_p(boot: np.ndarray, mean: float, margin: float) -> float:
    """Non-inferiority p-value of one percentile bootstrap, oriented so that higher is better.

    ``boot``: the bootstrap means of the oriented difference w (w = b − a when higher is better,
    a − b otherwise), ``mean`` = mean(w). The one-sided (1 − α') lower bound is
    L(α') = min(Q(α'), mean) with Q numpy's linear-interpolation quantile of ``boot``; PASS at level
    α' iff L(α') ≥ −margin. Q is non-decreasing in α', so p = inf{α' : L(α') ≥ −margin} and
    **PASS iff p ≤ α** — the bound and the p-value are one decision. With the sorted means
    s_0 ≤ … ≤ s_{B−1} and k = #{s_i < −margin}: p = 0 when k = 0, 1 when k = B or mean < −margin,
    else ((k − 1) + t)/(B − 1) with t = (−margin − s_{k−1})/(s_k − s_{k−1}) (where Q crosses −margin).
    No resamples (B = 0, or n = 1): p = 0 if mean ≥ −margin else 1. A 1e-12 tolerance absorbs
    float noise (identical runs pass a zero margin).
    """
    thr = -margin - 1e-12
    if not mean >= thr:  # NaN mean: not shown
        return 1.0
    s = np.sort(np.asarray(boot, float))
    b = s.size
    if b == 0:
        return 0.0
    k = int(np.searchsorted(s, thr, side="left"))
    if k == 0:
        return 0.0
    if k == b or b == 1:
        return 1.0
    t = (thr - s[k - 1]) / (s[k] - s[k - 1])
    return float(min(1.0, ((k - 1) + t) / (b - 1)))


def tango_z(n_better: int, n_worse: int, n: int, delta0: float) -> float:
    """Tango's (1998) score statistic for a difference of paired proportions, H0: θ = delta0.

    Per pair the oriented difference w ∈ {−1, 0, 1}; ``n_better`` = #(w = 1), ``n_worse`` =
    #(w = −1), θ = P(w = 1) − P(w = −1). ``Z = (n_better − n_worse − n·δ0) / sqrt(n·(2·q̃ +
    δ0·(1 − δ0)))`` with q̃ the maximum-likelihood P(w = −1) under θ = δ0:
    ``q̃ = (sqrt(B² − 4AC) − B) / (2A)``, A = 2n, B = −n_better − n_worse + (2n − n_better +
    n_worse)·δ0, C = −n_worse·δ0·(1 − δ0). At δ0 = 0 it is McNemar's z, (b − c)/sqrt(b + c). A zero
    variance (no discordant pair at δ0 = 0): +inf, −inf or 0 by the sign of the numerator.
    """
    a, b, c = (
        2 * n,
        -n_better - n_worse + (2 * n - n_better + n_worse) * delta0,
        -n_worse * delta0 * (1 - delta0),
    )
    q = (math.sqrt(max(b * b - 4 * a * c, 0.0)) - b) / (2 * a)
    var = n * (2 * q + delta0 * (1 - delta0))
    num = n_better - n_worse - n * delta0
    if var <= 1e-12:
        return math.copysign(math.inf, num) if num else 0.0
    return num / math.sqrt(var)


def score_p(n_better: int, n_worse: int, n: int, margin: float) -> float:
    """Non-inferiority p of the score test (oriented so higher is better): H0 θ ≤ −margin vs
    H1 θ > −margin, ``p = 1 − Φ(tango_z(…, δ0 = −margin))``. A margin of 1 or more: θ ≥ −1 always,
    p = 0."""
    if margin >= 1:
        return 0.0
    return float(stats.norm.sf(tango_z(n_better, n_worse, n, -margin)))


def score_bound(n_better: int, n_worse: int, n: int, alpha: float) -> float:
    """The one-sided (1 − alpha) lower confidence bound of θ from inverting the score test: the δ0 in
    (−1, θ̂] where ``tango_z = z_{1−alpha}`` (bisection; Z falls as δ0 rises), θ̂ = (n_better −
    n_worse)/n. PASS at margin m iff bound ≥ −m, the decision of :func:`score_p` ≤ alpha."""
    z = stats.norm.isf(alpha)
    lo, hi = -1.0, (n_better - n_worse) / n
    if tango_z(n_better, n_worse, n, hi) >= z:
        return hi
    for _ in range(100):  # Z(lo) >= z > Z(hi)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tango_z(n_better, n_worse, n, mid) >= z else (lo, mid)
    return lo


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
    mean(d); PASS iff lower >= −margin. Lower is better: upper = the one-sided (1 − alpha) upper
    bound of mean(d); PASS iff upper <= +margin. ``margin=None`` uses ``default_margin(n_pairs)``.
    The bound: both columns 0/1 → the score test (:func:`score_p`, :func:`score_bound`; ``test =
    "score"``), else the seeded percentile paired bootstrap (the draws of
    ``evaluation.aggregate.mean_ci``; :func:`non_inferiority_p`). ``p_value`` is the same decision
    as a p-value (PASS iff p_value <= alpha), so a family of these tests can be Holm-adjusted
    (:func:`non_inferiority_family`).
    """
    xa, xb, _ = pair(as_series(a), as_series(b))
    n = int(xa.size)
    m = default_margin(n) if margin is None else float(margin)
    nan = float("nan")
    if n == 0:
        return GateResult(
            metric, nan, nan, nan, nan, m, nan, 0, alpha, False, higher_is_better, nan, 1.0, 1.0
        )
    d = xb - xa
    w = d if higher_is_better else -d  # oriented: higher is better
    mean = float(d.mean())
    test = "score" if is_binary(xa, xb) else "bootstrap"
    if test == "score":
        n_better, n_worse = int((w > 0).sum()), int((w < 0).sum())
        p, bound = score_p(n_better, n_worse, n, m), score_bound(n_better, n_worse, n, alpha)
    else:
        boot = resampled_means(w, n_resamples, seed) if n > 1 and n_resamples > 0 else np.empty(0)
        bound = float(min(np.quantile(boot, alpha), w.mean())) if boot.size else float(w.mean())
        p = non_inferiority_p(boot, float(w.mean()), m)
    lower, upper = (bound, math.inf) if higher_is_better else (-math.inf, -bound)
    return GateResult(
        metric=metric,
        baseline=float(xa.mean()),
        candidate=float(xb.mean()),
        delta=mean,
        lower=lower,
        margin=m,
        mde=min_detectable_effect(xa, xb, alpha=alpha),
        n_pairs=n,
        alpha=alpha,
        passed=bool(p <= alpha),
        higher_is_better=higher_is_better,
        upper=upper,
        p_value=p,
        p_holm=p,
        test=test,
        var_d=float(np.var(d, ddof=1)) if n > 1 else nan,
        unit_range=bool(((xa >= 0) & (xa <= 1)).all() and ((xb >= 0) & (xb <= 1)).all()),
    )


def gate_passed(results: Sequence[GateResult], critical: Sequence[CheckFailure] = ()) -> bool:
    """The gate's verdict: every gated metric passes and the candidate fails no critical check of
    the eval items' ``assert`` lists (``analysis.checks.critical_failures``), whatever the
    aggregates: a critical question can regress inside a passing mean."""
    return all(r.passed for r in results) and not critical


def vacuous(r: GateResult) -> bool:
    """True when no candidate could fail: a metric whose values lie in [0, 1] moves by 1 at most,
    and every bound of its mean delta is ≥ −1, so a margin ≥ 1 (gate's default at n = 1) always
    passes."""
    return r.unit_range and r.margin >= 1


def gate_power(r: GateResult, default_margin_used: bool) -> Underpowered | None:
    """``select``'s underpowered rule for one gated metric (a family of one): MDE > margin, or
    gate's default margin wider than :data:`~rag_experiments.analysis.power.WIDE_DEFAULT_MARGIN`;
    n needed = ``power.n_for_margin`` (the figure select and plan print); None when powered."""
    reasons = []
    if r.mde > r.margin:
        reasons.append(f"MDE {r.mde:.3g} > margin {r.margin:.3g}")
    wide = default_margin_used and r.margin > WIDE_DEFAULT_MARGIN
    if wide:
        reasons.append(
            f"the default margin 1/√n = {r.margin:.3g} is wider than {WIDE_DEFAULT_MARGIN:g}: a pass says little"
        )
    if not reasons:
        return None
    target = WIDE_DEFAULT_MARGIN if wide else r.margin
    needed = n_for_margin(target, r.var_d, r.alpha, family=1, default_rule=wide)
    return Underpowered(
        int(not r.passed), 1, r.mde, r.margin, r.n_pairs, needed, tuple(reasons),
        WIDE_DEFAULT_MARGIN if wide else None, family=1, no_variance=r.var_d == 0,
    )  # fmt: skip


def non_inferiority_family(
    baseline: pd.Series,
    candidates: list[pd.Series],
    margin: float | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    n_resamples: int = 9999,
    metric: str = "",
    higher_is_better: bool = True,
) -> list[GateResult]:
    """:func:`non_inferiority` of every candidate against one baseline, Holm over the family:
    ``p_holm`` = Holm-adjusted ``p_value`` and ``passed`` = p_holm <= alpha. Holm only raises a
    p-value, so a candidate that passes here passes :func:`non_inferiority` alone (``gate``)
    with the same margin, alpha, seed and resamples; a family of one is ``gate`` itself."""
    res = [
        non_inferiority(baseline, c, margin, alpha, seed, n_resamples, metric, higher_is_better)
        for c in candidates
    ]
    adj = holm([r.p_value for r in res])
    for r, p in zip(res, adj, strict=True):
        r.p_holm = float(p)
        r.passed = bool(p <= alpha)
    return res


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
