"""The degenerate-case rules every CI and MDE goes through (docs/noise.md, "Degenerate data").

A normal approximation or a bootstrap collapses to zero width when the sampled values do not vary
(all 0, all 1, one constant stratum, n = 1), and a κ or an MDE from a handful of labels says more
than the data can. These rules replace luck with exact bounds or with "too few to say":

* a label seen in no row or in every row: Clopper–Pearson in Kish's effective sample size
  (:func:`no_variation`; the Korn–Graubard idea);
* a stratum whose sampled values are all equal, not fully sampled: the variance its exact
  Clopper–Pearson bound implies (:func:`constant_stratum_var`), combined into the design-based
  interval like any other stratum's;
* κ with fewer than :data:`KAPPA_MIN_PER_CLASS` labels in a class: "too few to say", with the counts
  (:func:`kappa_too_few`);
* an MDE from a pilot whose values do not vary: "not plannable from this pilot: no variance"
  (:func:`not_plannable`), never an MDE of 0.

Pure functions, no I/O; ``tests/test_intervals.py`` simulates populations and checks coverage.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

#: Fewer human labels than this in any class (of a κ): too few to say.
KAPPA_MIN_PER_CLASS = 5
#: What ``[plan]`` and ``plan`` say instead of an MDE of 0.
NO_VARIANCE = "not plannable from this pilot: no variance"


def clopper_pearson(k: float, n: float, alpha: float = 0.05) -> tuple[float, float]:
    """The exact (Clopper–Pearson) two-sided 1 − alpha interval of a proportion from k of n; ``n``
    may be an effective (non-integer) size. (NaN, NaN) for n ≤ 0."""
    from scipy.stats import beta

    if not n > 0:
        return math.nan, math.nan
    lo = 0.0 if k <= 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k >= n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def no_variation(theta: float, w: Sequence[float], alpha: float = 0.05) -> tuple[float, float]:
    """θ̂ = 0 or 1 from weighted rows: Clopper–Pearson of 0 (or all) successes in
    n_eff = (Σw)²/Σw², e.g. [0, 1 − (α/2)^(1/n_eff)] for a label never seen."""
    w = np.asarray(w, float)
    n_eff = float(w.sum() ** 2 / np.sum(w**2))
    return clopper_pearson(theta * n_eff, n_eff, alpha)


def korn_graubard(theta: float, var: float, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """The Korn–Graubard interval of a design-based proportion θ̂ with variance ``var``: Clopper–
    Pearson at the effective size n_eff = min(n, θ̂(1 − θ̂)/var) with n_eff·θ̂ successes. Where few
    units are positive the normal interval θ̂ ± z·√var is too short above (a property test saw 83 %
    coverage at 5 positives of 50); the exact one is not."""
    if not (var > 0 and 0 < theta < 1):
        return math.nan, math.nan
    n_eff = min(float(n), theta * (1 - theta) / var)
    return clopper_pearson(theta * n_eff, n_eff, alpha)


def constant_stratum_var(n_h: int, m_bar: float, alpha: float = 0.05) -> float:
    """s² of a stratum whose ``n_h`` sampled units all have the same 0/1 value (m̄ traces per unit):
    the variance m̄² p(1 − p) · n/(n − 1) at p = the Clopper–Pearson bound of 0 of n_h on the unseen
    side, so the stratum adds the uncertainty its sample cannot rule out instead of none."""
    p = clopper_pearson(0, n_h, alpha)[1]
    return m_bar**2 * p * (1 - p) * (n_h / (n_h - 1) if n_h > 1 else 1.0)


def kappa_too_few(labels: Sequence[str], classes: Sequence[str] = ()) -> str | None:
    """ "too few to say (…)" when a class of the human ``labels`` (``classes``, else the ones seen;
    one class seen is too few too) has fewer than :data:`KAPPA_MIN_PER_CLASS` labels; None otherwise."""
    counts = Counter(str(x) for x in labels)
    cats = list(classes) or sorted(counts)
    if len(cats) < 2:
        cats = [*cats, "any other class"]
    if min(counts.get(c, 0) for c in cats) >= KAPPA_MIN_PER_CLASS:
        return None
    shown = ", ".join(f"{counts.get(c, 0)} {c}" for c in cats)
    return f"too few to say ({shown}; κ needs ≥ {KAPPA_MIN_PER_CLASS} labels in each class)"


def not_plannable(var_between: float, var_within: float = 0.0) -> str | None:
    """:data:`NO_VARIANCE` when the pilot's values do not vary (both variances 0 or NaN): an MDE
    from them would be 0. None when there is variance to plan from."""
    vb = 0.0 if math.isnan(var_between) else var_between
    vw = 0.0 if math.isnan(var_within) else var_within
    return NO_VARIANCE if vb <= 0 and vw <= 0 else None
