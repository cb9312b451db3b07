"""How often production answers fail, from the labelled sample of ``evalset from-traces`` (docs/from-traces.md).

Estimand, per label ℓ (``ok`` or a failure label): θ_ℓ = the share of the frame's traces (after the
time and tag filters, questions already in the eval set left out) whose answer a reviewer would
label ℓ. The sample's unit c is a cluster of m_c near-duplicate questions; its reviewed label is
taken to hold for all of them (the stated assumption of merging).

**Estimator** (the design is stratified SRS without replacement, ``analysis.trace_sample``): the
labelled units of stratum h are treated as an SRS of its N_h units (rows left blank are missing at
random within their stratum), so their inclusion probability is π_h = n_h / N_h with n_h the
labelled count. The combined ratio (Hájek) estimator

    θ̂_ℓ = Σ_h N_h ȳ_h / Σ_h N_h m̄_h,   ȳ_h = mean_{c∈S_h} m_c·1[label_c = ℓ],  m̄_h = mean_{c∈S_h} m_c

with the linearised stratified variance (finite-population correction included)

    Var̂(θ̂_ℓ) = Σ_h N_h² (1 − n_h/N_h) s²_h / n_h / X̂²,   s²_h = sample variance of d_c = m_c (y_c − θ̂_ℓ) in S_h,
    X̂ = Σ_h N_h m̄_h,   CI = θ̂ ± z_{0.975} √Var̂, clipped to [0, 1]

A stratum with one labelled unit and N_h > 1 borrows the pooled s² of all labelled units. A
stratum not fully labelled whose labelled units all have (or all lack) the label has s²_h = 0 though
its unlabelled units may differ: it gets at least the variance its exact Clopper–Pearson bound
implies (``evaluation.intervals.constant_stratum_var``), so one constant stratum cannot make the
interval zero-wide (4/4 in one stratum and 0/8 of 28 in another: not [0.031, 0.031]). When no
labelled unit (or every one) has the label, the CI is Clopper–Pearson for 0 (or n_eff) successes in
Kish's effective sample size n_eff = (Σ w)² / Σ w², w = m/π_h (the Korn–Graubard idea;
``evaluation.intervals.no_variation``), e.g. [0, 1 − 0.025^(1/n_eff)] for a label never seen. A stratum
with no labelled unit is **not covered**: the estimate is then about the covered strata only and
says so. Without the design file (the ``.design.json`` beside the review) the rows' own π are used:
the Hájek estimate with weights m/π and the with-replacement variance of ``analysis.ppi``.

**PPI.** When the judge's label is on every trace of the frame (this project's runs log
``failure_label`` on each), θ̂_PP = (Σ_frame m f) / (Σ_frame m) + Σ_S w (y − f) / Σ_S w, w = m/π
(``analysis.ppi.ppi_mean`` with π/m as its π): the judge's population share corrected by its error
on the labelled sample.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rag_experiments.analysis.ppi import Z975, Estimate, clip01, ppi_mean
from rag_experiments.evaluation.intervals import constant_stratum_var, korn_graubard, no_variation


@dataclass(frozen=True)
class Labelled:
    unit_id: str
    label: str
    pi: float  # the draw's π (the review's inclusion_prob)
    m: int = 1  # traces the unit stands for
    stratum: str = "all"
    judge: str | None = None  # the judge's label of the unit, when it has one


@dataclass(frozen=True)
class LabelEstimate:
    label: str
    hajek: Estimate
    ppi: Estimate | None  # None without a judge label on every unit of the frame
    judge_only: float | None


@dataclass(frozen=True)
class Coverage:
    n_labelled: int
    n_sampled: int
    strata_covered: list[str]
    strata_uncovered: list[str]  # strata with units but no labelled one: the estimate says nothing there
    traces_covered: int
    traces_frame: int


def stratified_ratio(
    rows: Sequence[Labelled], sizes: dict[str, int], label: str, z: float = Z975
) -> tuple[Estimate, list[str]]:
    """θ̂_ℓ and its CI (module docstring), and the strata with units but no label."""
    by: dict[str, list[Labelled]] = defaultdict(list)
    for r in rows:
        by[r.stratum].append(r)
    uncovered = [h for h, n in sizes.items() if n > 0 and not by.get(h)]
    strata = [h for h in by if sizes.get(h, 0) > 0]
    if not strata:
        return Estimate(math.nan, math.nan, math.nan, 0), uncovered
    num = sum(sizes[h] * np.mean([r.m * (r.label == label) for r in by[h]]) for h in strata)
    den = sum(sizes[h] * np.mean([r.m for r in by[h]]) for h in strata)
    theta = float(num / den)
    d_all = np.array([r.m * ((r.label == label) - theta) for h in strata for r in by[h]], float)
    pooled = float(np.var(d_all, ddof=1)) if d_all.size > 1 else math.nan
    var = 0.0
    for h in strata:
        d = np.array([r.m * ((r.label == label) - theta) for r in by[h]], float)
        n_h, big = d.size, sizes[h]
        if n_h >= big:
            continue  # the whole stratum labelled: no sampling variance
        s2 = float(np.var(d, ddof=1)) if n_h > 1 else pooled
        if len({r.label == label for r in by[h]}) == 1:  # constant stratum: its exact bound's variance
            s2 = max(
                0.0 if math.isnan(s2) else s2, constant_stratum_var(n_h, float(np.mean([r.m for r in by[h]])))
            )
        var += big**2 * (1 - n_h / big) * s2 / n_h
    n = sum(len(by[h]) for h in strata)
    if theta in (0.0, 1.0):
        w = [sizes[h] / len(by[h]) * r.m for h in strata for r in by[h]]
        return _no_variation(theta, w, n), uncovered
    if math.isnan(var):
        return Estimate(clip01(theta), math.nan, math.nan, n), uncovered
    half = z * math.sqrt(var) / den
    lo, hi = korn_graubard(theta, var / den**2, n)  # exact where few are positive: never narrower
    return Estimate(clip01(theta), clip01(min(theta - half, lo)), clip01(max(theta + half, hi)), n), uncovered


def _no_variation(theta: float, w: Sequence[float], n: int) -> Estimate:
    """θ̂ = 0 or 1: ``evaluation.intervals.no_variation`` (Clopper–Pearson in Kish's n_eff)."""
    return Estimate(theta, *no_variation(theta, w), n)


def hajek(rows: Sequence[Labelled], label: str, z: float = Z975) -> Estimate:
    """Σ w y / Σ w with w = m/π and the with-replacement linearised variance (no design file)."""
    if not rows:
        return Estimate(math.nan, math.nan, math.nan, 0)
    w = np.array([r.m / r.pi for r in rows], float)
    y = np.array([r.label == label for r in rows], float)
    theta = float(np.sum(w * y) / np.sum(w))
    n = len(rows)
    if theta in (0.0, 1.0):
        return _no_variation(theta, w, n)
    if n < 2:
        return Estimate(clip01(theta), math.nan, math.nan, n)
    var = n / (n - 1) * float(np.sum((w * (y - theta)) ** 2)) / float(np.sum(w)) ** 2
    half = z * math.sqrt(var)
    return Estimate(clip01(theta), clip01(theta - half), clip01(theta + half), n)


def estimate(
    rows: Sequence[Labelled],
    labels: Sequence[str],
    sizes: dict[str, int] | None = None,
    frame_judge: Sequence[tuple[str, int]] | None = None,
) -> list[LabelEstimate]:
    """One :class:`LabelEstimate` per label. ``sizes``: units per stratum (the design file), else
    the rows' π (:func:`hajek`). ``frame_judge``: (judge label, m) of every unit of the frame,
    when the judge labelled all of them: adds PPI and the judge-only share."""
    out = []
    for lab in labels:
        est = stratified_ratio(rows, sizes, lab)[0] if sizes else hajek(rows, lab)
        ppi = judge = None
        if frame_judge is not None and rows and all(r.judge is not None for r in rows):
            f_all = np.repeat([float(j == lab) for j, _ in frame_judge], [m for _, m in frame_judge])
            judge = float(f_all.mean()) if f_all.size else None
            ppi = ppi_mean(
                f_all,
                [float(r.label == lab) for r in rows],
                [float(r.judge == lab) for r in rows],
                [r.pi / r.m for r in rows],  # weights m/π
            )
        out.append(LabelEstimate(lab, est, ppi, judge))
    return out
