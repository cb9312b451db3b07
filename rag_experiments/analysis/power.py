"""Power planning: the one home of the minimum detectable effect (MDE) formula (docs/metrics.md).

A paired comparison of two configs on n queries with R replicates each estimates the mean per-query
difference d̄. Under the nested model of ``analysis.variance`` its variance is

    Var(d̄) = σ²_between / n + σ²_within / (n·R)

with σ²_between the variance across queries of the true per-query difference and σ²_within the
replicate (generation) variance of one replicate's difference. A test at level α (``sides`` = 2:
two-sided, z_{1−α/2}; 1: one-sided, z_{1−α}) detects a true shift δ with probability ``power`` when
δ ≥ MDE = (z_α + z_power)·√Var(d̄) (normal approximation). ``gate`` (one-sided, the observed paired
SD, R folded into it) and ``plan`` (two-sided, components from a pilot) both call :func:`mde`.
No MLflow, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from scipy import stats

__all__ = [
    "WIDE_DEFAULT_MARGIN",
    "PairedVariance",
    "Underpowered",
    "mde",
    "n_for_effect",
    "n_for_margin",
    "paired_variance",
    "replicates_for_effect",
    "z_sum",
]


def z_sum(alpha: float = 0.05, power: float = 0.8, sides: int = 2) -> float:
    """z_{1−α/sides} + z_{power}: 2.80 for α = 0.05 two-sided at 80 % power, 2.49 one-sided."""
    if not 0 < alpha < 1 or not 0 < power < 1 or sides not in (1, 2):
        raise ValueError(f"alpha and power must be in (0, 1), sides 1 or 2 (got {alpha}, {power}, {sides})")
    return float(stats.norm.ppf(1 - alpha / sides) + stats.norm.ppf(power))


def mde(
    var_between: float,
    n: int,
    var_within: float = 0.0,
    replicates: int = 1,
    alpha: float = 0.05,
    power: float = 0.8,
    sides: int = 2,
) -> float:
    """MDE = (z_{1−α/sides} + z_power) · √(σ²_between/n + σ²_within/(n·R)); NaN when n < 2."""
    if n < 2 or math.isnan(var_between):
        return math.nan
    within = 0.0 if math.isnan(var_within) else var_within
    return z_sum(alpha, power, sides) * math.sqrt(var_between / n + within / (n * max(1, replicates)))


def n_for_effect(
    effect: float,
    var_between: float,
    var_within: float = 0.0,
    replicates: int = 1,
    alpha: float = 0.05,
    power: float = 0.8,
    sides: int = 2,
) -> int:
    """Queries needed so that MDE <= ``effect``: ⌈(z_α + z_power)² (σ²_b + σ²_w/R) / δ²⌉."""
    v = var_between + (0.0 if math.isnan(var_within) else var_within) / max(1, replicates)
    return max(2, math.ceil(z_sum(alpha, power, sides) ** 2 * v / effect**2))


def n_for_margin(
    margin: float,
    var: float,
    alpha: float = 0.05,
    family: int = 1,
    power: float = 0.8,
    default_rule: bool = False,
) -> int | None:
    """Queries at which ``select`` and ``gate`` can show a config non-inferior within ``margin``:
    the one figure ``select``, ``report`` and ``plan`` print.

    n = ⌈(z_{1−α/m} + z_power)² · σ²_d / margin²⌉: the one-sided test of each of the m = ``family``
    comparisons with the best at the level Holm gives its smallest p (α/m; later steps are looser,
    so this n suffices for every one), σ²_d the variance of a per-query paired difference. With
    gate's default margin (``default_rule``: max(0.01, 1/√n)) n is also at least ⌈1/margin²⌉, the
    n at which the default margin has shrunk to ``margin``. None when σ²_d is unknown (NaN) and no
    rule applies; σ²_d = 0 needs only the margin rule (1 query without it)."""
    if not margin > 0:
        return None
    floor = math.ceil(1 / margin**2 - 1e-9) if default_rule else 1
    if math.isnan(var):
        return floor if default_rule else None
    z = z_sum(alpha / max(1, family), power, sides=1)
    return max(floor, math.ceil(z**2 * var / margin**2), 2 if var > 0 else 1)


def replicates_for_effect(
    effect: float,
    n: int,
    var_between: float,
    var_within: float,
    alpha: float = 0.05,
    power: float = 0.8,
    sides: int = 2,
) -> int | None:
    """Replicates needed at n queries so that MDE <= ``effect``: ⌈σ²_w / (n·δ²/z² − σ²_b)⌉, at
    least 1; None when no R reaches it (σ²_between/n alone exceeds (δ/z)²: more queries needed)."""
    room = n * effect**2 / z_sum(alpha, power, sides) ** 2 - var_between
    if room <= 0:
        return None
    if var_within <= 0 or math.isnan(var_within):
        return 1
    return max(1, math.ceil(var_within / room))


class PairedVariance(NamedTuple):
    """(σ²_between, σ²_within) of a paired difference, as :func:`paired_variance` derives them."""

    between: float
    within: float


def paired_variance(var_query: float, var_generation: float, rho: float = 0.5) -> PairedVariance:
    """The components of a *difference* of two configs from one pilot run's components.

    Two configs A, B measured on the same queries: d_q = B_q − A_q. With the per-query true scores
    correlated ρ across configs and the pilot's σ²_query for both, Var(true d_q) = 2(1 − ρ)·σ²_query
    (ρ = 0.5 gives σ²_query: the pilot's own between-query variance); independent replicate noise
    in both gives σ²_within = 2·σ²_generation.
    """
    if not -1 <= rho <= 1:
        raise ValueError(f"rho must be in [-1, 1], got {rho}")
    gen = 0.0 if math.isnan(var_generation) else var_generation
    return PairedVariance(2 * (1 - rho) * var_query, 2 * gen)


#: The widest default margin a tie may stand on: gate's default margin is 1/√n, so below 45 paired
#: queries a "tie" would only mean "within ±0.15 or more" — said as underpowered, not as equivalence.
WIDE_DEFAULT_MARGIN = 0.15


@dataclass(frozen=True)
class Underpowered:
    """Why the eval set cannot separate the candidates (``Selection.underpowered``; the report and
    the ``select.underpowered`` tag read it)."""

    n_indistinguishable: int  # configs neither shown non-inferior nor shown worse
    n_others: int  # configs compared with the best
    mde: float  # median over the comparisons of gate's MDE (one-sided, 80 % power)
    margin: float  # the non-inferiority margin used (median over the comparisons)
    n: int  # paired queries (median over the comparisons)
    n_needed: int | None  # queries to show non-inferiority (analysis.power.n_for_margin); None: unknown
    reasons: tuple[str, ...]
    target: float | None = None  # the margin n_needed is for, when not the current one (a wide default)
    family: int = 1  # comparisons with the best: the Holm family n_needed accounts for
    no_variance: bool = False  # every paired difference was 0: n_needed rests on the margin rule alone
    compared: int | None = None  # configs compared with the best before same-score ones were merged

    def configs(self) -> str:
        """``configs`` or, when configs with the same per-query scores count once, ``distinct configs
        (of 11 compared: …)``: so the count reads beside the tie set's, which counts every config."""
        if self.compared is None or self.compared == self.n_others:
            return "configs"
        return f"distinct configs (of {self.compared} compared: configs with the same per-query scores count once)"

    def need(self) -> str:
        """The n needed and what it accounts for, as ``plan --margin M --configs K`` prints it."""
        if not self.n_needed:
            return "the MDE is unknown (fewer than 2 paired queries)"
        margin = self.target if self.target is not None else self.margin
        holm = f"Holm over {self.family}: one-sided α/{self.family}" if self.family > 1 else "one-sided α"
        why = (
            "no variance in the paired differences: the default margin's rule 1/√n alone"
            if self.no_variance
            else f"{holm}, 80 % power"
            + (f", and the default margin 1/√n ≤ {margin:.3g}" if self.target is not None else "")
        )
        tail = (
            ""
            if self.target is not None
            else f" (with --margin {margin:.3g}: the default margin shrinks as 1/√n, like the MDE)"
        )
        plan = f"--configs {self.family + 1}" if self.target is not None else f"--margin {margin:.3g} --configs {self.family + 1}"
        return (
            f"n ≈ {self.n_needed} queries to show a config non-inferior within ±{margin:.3g} ({why}; "
            f"`plan {plan}` gives the same figure from a pilot){tail}"
        )

    def power_text(self) -> str:
        """The MDE against the margin at n, and the n needed."""
        if math.isfinite(self.mde) and math.isfinite(self.margin):
            rel = ">" if self.mde > self.margin else "≤"
            return f"MDE {self.mde:.3g} {rel} margin {self.margin:.3g} at n = {self.n} queries; {self.need()}"
        return f"only {self.n} paired queries: no MDE; {self.need()}"

    def gate_message(self, metric: str) -> str:
        """The UNDERPOWERED line ``gate`` prints for one metric (a family of one)."""
        return (
            f"UNDERPOWERED: {metric}: this eval set cannot decide the gate ({'; '.join(self.reasons)}); "
            f"{self.power_text()}. A PASS here is weak evidence."
        )

    def message(self, pick: bool = True) -> str:
        """The UNDERPOWERED line; ``pick``: say what ``select`` chooses (the report chooses nothing)."""
        power = self.power_text()
        what = (
            "Choosing the best mean among the tied configs within the constraints, not the cheapest."
            if pick
            else "No config is chosen here; `select` would keep the best mean, not the cheapest tie."
        )
        return (
            f"UNDERPOWERED: this eval set cannot separate the configs ({'; '.join(self.reasons)}). "
            f"{self.n_indistinguishable} of "
            f"{self.n_others} {self.configs()} are indistinguishable from the best (neither shown non-inferior "
            f"nor shown worse); {power}. {what}"
        )
