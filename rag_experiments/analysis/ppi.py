"""Judge-corrected estimates: prediction-powered inference (Angelopoulos et al. 2023, as in ARES).

The judge labels every claim of a run; a human labels a small sample of them. The judge alone is
biased (lenient or strict), the human sample alone is small. PPI combines them: the judge's mean
over all claims, corrected by the mean judge error measured on the human sample.

Estimand (see ``docs/spotcheck.md``): θ = (1/N) Σ_{i=1..N} Y_i, the share of the run's N judged
claims (those with a parseable judge verdict) that a human would label *supported* — a claim-level
pooled rate, not the per-query mean the run logs as faithfulness.

    θ̂_PP = (1/N) Σ_{i=1..N} f_i  +  Σ_{i∈S} w_i (Y_i − f_i) / Σ_{i∈S} w_i,     w_i = 1 / π_i

f_i ∈ {0, 1} is the judge's verdict (1 = supported) on claim i, Y_i the human label, S the labelled
sample and π_i its inclusion probability. With a simple random sample (all π_i equal) the rectifier
is the plain mean(Y − f) of the classic PPI mean estimator. With the spot-check's unequal-probability
sample it is the Hájek (ratio) form of the Horvitz–Thompson estimator: normalising by Σ w rather than
N keeps it right when sampled rows are left blank (assumed missing at random) and when labelled
claims whose judge verdict is unparseable are left out of the population; it is consistent, with a
bias of order 1/n.

The first term is computed on the whole finite population of the run's claims, so it has no
sampling variance; all uncertainty is in the rectifier. Its linearised variance uses the
with-replacement approximation, with r_i = Y_i − f_i and r̄ the rectifier:

    Var̂(θ̂_PP) = n/(n − 1) · Σ_{i∈S} w_i² (r_i − r̄)² / (Σ_{i∈S} w_i)²,   CI = θ̂_PP ± z_{0.975} √Var̂

(equal weights: Σ (r_i − r̄)² / (n (n − 1)), the classic PPI variance of the rectifier). It ignores
the finite-population correction and any stratification, so it is conservative (slightly too wide)
for samples drawn without replacement. The judge-only figure (1/N) Σ f_i is reported beside it with
the naive binomial interval p̂ ± z √(p̂(1−p̂)/N): that interval is narrow around the wrong value
whenever the judge is biased.

**Bounded outcomes.** θ is a proportion, so θ ∈ [0, 1], but neither formula knows it: the rectifier
can push θ̂_PP past a bound (judge mean 0.9, every labelled claim judged 0 and labelled 1: 1.9), and
a normal interval near 0 or 1 spills over (10 labels, κ 0: [−0.157, 0.808], issue 27). Both
estimates are therefore **clipped to [0, 1]**: value, CI low and CI high each → min(max(x, 0), 1).
Clipping never removes a feasible value, so the coverage of a clipped interval is at least that of
the unclipped one; a CI that touches a bound says the labels cannot place θ more closely there.
(ppi-python offers no bounded-outcome method for the mean: `ppi_mean_ci` is the same CLT interval.)

**No variation** (``evaluation.intervals``). A judge-only share of 0 or 1 gets the Clopper–Pearson
interval of 0 (or N) of N; a rectifier with the same value on every label (the judge agreed with
every human label) gets θ̂_PP ± the Clopper–Pearson bound of 0 disagreements in Kish's n_eff, not
a zero-width interval: |r| ≤ 1, so the mean error is at most the disagreement rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rag_experiments.evaluation.intervals import clopper_pearson

Z975 = 1.959963984540054


def clip01(x: float) -> float:
    """min(max(x, 0), 1); NaN stays NaN (a proportion's estimate, module docstring)."""
    return x if math.isnan(x) else min(max(x, 0.0), 1.0)


@dataclass(frozen=True)
class Estimate:
    value: float
    ci_low: float
    ci_high: float
    n: int  # observations the estimate rests on (labelled claims for PPI, all claims for judge-only)


def judge_only(f_all: Sequence[float], z: float = Z975) -> Estimate:
    """p̂ = mean(f) over all N claims, CI p̂ ± z √(p̂(1−p̂)/N) clipped to [0, 1]. NaN without claims."""
    f = np.asarray(f_all, float)
    if f.size == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    p = float(f.mean())
    if p in (0.0, 1.0):
        return Estimate(p, *clopper_pearson(p * f.size, f.size), int(f.size))
    half = z * math.sqrt(p * (1 - p) / f.size)
    return Estimate(p, clip01(p - half), clip01(p + half), int(f.size))


def ppi_mean(
    f_all: Sequence[float],
    y_lab: Sequence[float],
    f_lab: Sequence[float],
    pi_lab: Sequence[float] | None = None,
    z: float = Z975,
) -> Estimate:
    """θ̂_PP = mean(f_all) + Σ w (y − f) / Σ w with its CLT interval (module docstring), w = 1/π.

    ``pi_lab`` None means a simple random sample (equal weights). NaN for no labels; the interval is
    NaN with a single label (no variance estimate). Value and CI are clipped to [0, 1]
    (:func:`clip01`, module docstring: θ is a proportion).
    """
    f_all = np.asarray(f_all, float)
    y, f = np.asarray(y_lab, float), np.asarray(f_lab, float)
    n = y.size
    if f_all.size == 0 or n == 0 or f.size != n:
        return Estimate(math.nan, math.nan, math.nan, n)
    w = np.ones(n) if pi_lab is None else 1.0 / np.asarray(pi_lab, float)
    r = y - f
    rbar = float(np.sum(w * r) / np.sum(w))
    theta = float(f_all.mean()) + rbar
    if n < 2:
        return Estimate(clip01(theta), math.nan, math.nan, n)
    var = n / (n - 1) * float(np.sum((w * (r - rbar)) ** 2)) / float(np.sum(w)) ** 2
    half = z * math.sqrt(var)
    if np.all(r == r[0]):  # no variation in the judge's error: at most the unseen disagreement rate
        half = max(half, clopper_pearson(0, float(w.sum() ** 2 / np.sum(w**2)))[1])
    return Estimate(clip01(theta), clip01(theta - half), clip01(theta + half), n)
