"""Gate decisions: paired non-inferiority of a candidate against a baseline, per metric.

The direction of each metric comes from the caller (the CLI reads it from the metric registry):
for a higher-is-better metric the candidate may not *drop* by more than the margin, for a
lower-is-better one (a failure rate, a latency) it may not *rise* by more than the margin.

The test is chosen by the metric's declared value type (``stats.value_kind``, ``stats.KIND_TESTS``),
never by the values observed: Tango's score test for paired proportions on binary and proportion
metrics (hit@k, the failure-label rates, evidence recall; on fractional values its restricted
maximum likelihood generalised, :func:`restricted_z`), a seeded
percentile paired bootstrap on continuous ones. The bootstrap is anti-conservative on 0/1 metrics
(a candidate exactly a margin worse passed 7–8 % of the time at α = 0.05 for n = 30–100,
docs/metrics.md "Calibration"); the score test holds the level there. A candidate identical to
the baseline on every paired item always passes (bound 0, p 0). No MLflow, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats
from scipy.optimize import brentq

from rag_experiments.analysis.checks import CheckFailure
from rag_experiments.analysis.power import WIDE_DEFAULT_MARGIN, Underpowered, mde, n_for_margin
from rag_experiments.analysis.stats import KIND_TESTS, as_series, holm, pair, table_key, value_kind
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
    "restricted_z",
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
    test: str = "bootstrap"  # "score" (Tango: binary, proportion) or "bootstrap" (continuous)
    kind: str = "continuous"  # the metric's declared value type that chose the test (stats.KIND_TESTS)
    identical: bool = False  # the same value on every paired item: passes whatever the test
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


def restricted_z(w: np.ndarray, delta0: float) -> float:
    """The score statistic of H0 E[w] = δ0 for paired differences w in [−1, 1] (oriented so higher is
    better): Z = (w̄ − δ0) / √(V0/n), V0 the variance of w under the maximum-likelihood
    distribution with mean δ0 over the observed values plus an atom at −1 (the worst a pair can do).
    That atom is Tango's construction: on 0/1 pairs (w ∈ {−1, 0, 1}) this is Tango's (1998) score
    statistic, computed in its closed form (:func:`_tango_z`; McNemar's z at δ0 = 0), also with no
    observed loss (``tests/test_calibration.py`` checks it against a numerical maximisation); on
    fractional values it is the empirical-likelihood score test. The ML weights: with the atom,
    p_i = (1 + δ0) / (n (1 + w_i)) and the atom 1 − Σ p_i when that is ≥ 0; else
    p_i = 1 / (n (1 + λ (w_i − δ0))) with Σ p_i (w_i − δ0) = 0 (a root in λ). Computed on the
    distinct values and their counts."""
    u, c = np.unique(np.asarray(w, float), return_counts=True)
    return _restricted_z(u, c.astype(float), delta0)


def _restricted_z(u: np.ndarray, c: np.ndarray, delta0: float) -> float:
    n = float(c.sum())
    mean, x = float(u @ c) / n, u - delta0
    if mean <= delta0:  # cannot pass: the sign is all that matters
        v = float(c @ x**2) / n
        return (mean - delta0) / math.sqrt(v / n) if v > 0 else (0.0 if mean == delta0 else -math.inf)
    if delta0 <= -1:
        return math.inf
    if np.isin(u, (-1.0, 0.0, 1.0)).all():
        return _tango_z(float(c[u == 1].sum()), float(c[u == -1].sum()), n, delta0)
    p = c * (1 + delta0) / (n * (1 + u)) if u[0] > -1 else None
    if p is not None and p.sum() <= 1:
        v = float(p @ x**2 + (1 - p.sum()) * (1 + delta0) ** 2)
    else:  # Σ c x/(1 + λx) falls in λ; its root is in (0, −1/min x)
        lam = brentq(lambda t: float(c @ (x / (1 + t * x))), 0.0, -(1 - 1e-12) / float(x.min()), xtol=1e-14)
        p = c / (1 + lam * x)
        v = float(p @ x**2) / float(p.sum())
    return (mean - delta0) / math.sqrt(v / n)


def _tango_z(n_better: float, n_worse: float, n: float, delta0: float) -> float:
    """Tango's closed form: ``Z = (n₊ − n₋ − n·δ0) / √(n·(2·q̃ + δ0·(1 − δ0)))``, q̃ = (√(B² − 4AC)
    − B)/(2A) the restricted ML P(w = −1), A = 2n, B = −n₊ − n₋ + (2n − n₊ + n₋)·δ0,
    C = −n₋·δ0·(1 − δ0)."""
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


def score_p(w: np.ndarray, margin: float) -> float:
    """Non-inferiority p of the score test on oriented differences ``w``: H0 θ ≤ −margin vs
    H1 θ > −margin, ``p = 1 − Φ(restricted_z(w, −margin))``. A margin of 1 or more: θ ≥ −1 always,
    p = 0."""
    if margin >= 1:
        return 0.0
    return float(stats.norm.sf(restricted_z(w, -margin)))


def score_bound(w: np.ndarray, alpha: float) -> float:
    """The one-sided (1 − alpha) lower confidence bound of θ from inverting the score test: the δ0 in
    (−1, w̄] where ``restricted_z = z_{1−alpha}`` (Brent's root; Z falls as δ0 rises). PASS at
    margin m iff bound ≥ −m, the decision of :func:`score_p` ≤ alpha."""
    z = stats.norm.isf(alpha)
    u, c = np.unique(np.asarray(w, float), return_counts=True)
    c = c.astype(float)
    lo, hi = -1.0 + 1e-12, float(u @ c) / float(c.sum())
    if _restricted_z(u, c, hi) >= z:
        return hi
    if _restricted_z(u, c, lo) < z:
        return -1.0
    return float(brentq(lambda d: _restricted_z(u, c, d) - z, lo, hi, xtol=1e-12))


def non_inferiority(
    a: pd.Series,
    b: pd.Series,
    margin: float | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    n_resamples: int = 9999,
    metric: str = "",
    higher_is_better: bool = True,
    kind: str | None = None,
) -> GateResult:
    """Is candidate ``b`` no worse than baseline ``a`` by more than ``margin``?

    d = b − a per paired query. Higher is better: lower = the one-sided (1 − alpha) lower bound of
    mean(d); PASS iff lower >= −margin. Lower is better: upper = the one-sided (1 − alpha) upper
    bound of mean(d); PASS iff upper <= +margin. ``margin=None`` uses ``default_margin(n_pairs)``.
    The bound, by ``metric``'s declared value type (``stats.value_kind``; ``kind`` overrides it):
    binary and proportion → the score test (:func:`score_p`, :func:`score_bound`, Tango's on 0/1
    pairs; ``test = "score"``), continuous → the seeded percentile paired bootstrap
    (the draws of ``evaluation.aggregate.mean_ci``; :func:`non_inferiority_p`). Identical values on
    every pair: bound 0, p 0 (PASS at any margin ≥ 0). ``p_value`` is the same decision
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
    kind = value_kind(metric, kind, xa, xb)
    test = KIND_TESTS[kind][1]
    identical = not d.any()
    if identical:  # one config on this eval set: tied, whatever the test
        p, bound = 0.0, 0.0
    elif test == "score":  # Tango's on 0/1 pairs, its restricted ML generalised on fractional ones
        p, bound = score_p(w, m), score_bound(w, alpha)
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
        kind=kind,
        identical=identical,
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
    kind: str | None = None,
) -> list[GateResult]:
    """:func:`non_inferiority` of every candidate against one baseline, Holm over the family:
    ``p_holm`` = Holm-adjusted ``p_value`` and ``passed`` = p_holm <= alpha. Holm only raises a
    p-value, so a candidate that passes here passes :func:`non_inferiority` alone (``gate``)
    with the same margin, alpha, seed and resamples; a family of one is ``gate`` itself.
    Duplicates count once (``stats.table_key``): a candidate identical to the baseline is the
    baseline (out of the family, PASS), candidates identical to each other are one member."""
    res = [
        non_inferiority(baseline, c, margin, alpha, seed, n_resamples, metric, higher_is_better, kind)
        for c in candidates
    ]
    base_key = table_key(baseline)
    keys = [table_key(c) for c in candidates]
    adj = holm([math.nan if k == base_key else r.p_value for r, k in zip(res, keys, strict=True)], keys)
    for r, p in zip(res, adj, strict=True):
        r.p_holm = r.p_value if math.isnan(p) else float(p)
        r.passed = bool(r.p_holm <= alpha)
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
