"""Racing: stop a sweep's losing configs early with an anytime-valid test (docs/racing.md).

Pure functions, no I/O. Every config of a racing sweep scores the eval items in one seeded order
(:func:`batch_order`), a batch at a time. After each batch a config is compared with the current
leader on the paired per-query differences of the primary metric seen so far, and stopped when it
is significantly worse under a **betting confidence sequence** (Waudby-Smith & Ramdas 2023,
"Estimating means of bounded random variables by betting", JRSS-B 86(1); the predictable plug-in
bet of their §5, one-sided). Because the test is a nonnegative supermartingale, Ville's inequality
makes it valid at every batch end at once: checking after each batch costs no optional-stopping
bias.

Model and guarantee. Eval items are a sample from a population of queries; in the seeded order
each config's per-query value is an i.i.d. draw (a uniformly random order of an i.i.d. sample is
i.i.d.). For configs ``c`` and ``j`` with per-query values in [0, 1] (oriented so that higher is
better), ``d_i = x_c,i − x_j,i ∈ [−1, 1]`` and ``μ = E[d]``. Under H0(c, j): ``μ ≥ 0`` (c is not
worse than j), the capital

    K_t = Π_{i ≤ t} (1 − λ_i · d_i),    λ_i predictable (a function of d_1 … d_{i−1}), 0 ≤ λ_i ≤ 1/2

is a nonnegative supermartingale with K_0 = 1 (E[1 − λ_i d_i | past] = 1 − λ_i μ ≤ 1), so by
Ville's inequality P(∃ t: K_t ≥ 1/a) ≤ a. The bet is WSR's predictable plug-in

    λ_t = min(1/2, sqrt(2 log(1/a) / (σ̂²_{t−1} · t · log(1 + t)))),
    μ̂_t = (0 + Σ_{i≤t} d_i) / (t + 1),   σ̂²_t = (1 + Σ_{i≤t} (d_i − μ̂_i)²) / (t + 1)

(their [0, 1] priors 1/2 and 1/4 moved to the range [−1, 1]: prior mean 0, prior variance 1).
The same bets give the confidence sequence for μ: ``K_t(m) = Π (1 − λ_i (d_i − m))`` is
increasing in m, and ``U_t = inf{m : K_t(m) ≥ 1/a}`` is a time-uniform upper confidence bound
(P(∃ t: μ > U_t) ≤ a). Stopping when the running minimum of U_t is below 0 is the same as
``max_{s≤t} K_s(0) ≥ 1/a``.

Multiple comparisons and a data-dependent leader. With K configs, config c is stopped at a batch
end when its test against the current leader L_t (the alive config with the best mean on the items
seen) has ``K_t ≥ (K − 1)/α``, i.e. ``a = α/(K − 1)``. The leader is chosen from the data, so we do
not rely on it: for the config with the best population mean, every H0(best, j) is true, and

    P(best is ever stopped) ≤ P(∃ j ≠ best, ∃ t: K_t^{best,j} ≥ (K−1)/α) ≤ Σ_j α/(K−1) = α,

whichever leader each batch happens to pick. The same bound holds for any config c and the event
"c is stopped by a config whose population mean is not above c's". This is the guarantee racing
gives; survivors are then compared by the usual paired tests (compare / select).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "RaceDecision",
    "batch_order",
    "bets",
    "decide",
    "log_capital",
    "race_round",
    "upper_bound",
]

MAX_BET = 0.5  # λ ≤ 1/2: every factor 1 − λ(d − m) ≥ 0 for d ≤ 1, m ≥ −1 (≥ 1/2 at m = 0)
RULES = ("leader", "any")
RULE = "leader"  # compare with the current leader only (docs/racing.md)


def batch_order(n_items: int, seed: int) -> np.ndarray:
    """The racing order: a seeded permutation of ``range(n_items)``; batch b is
    ``order[b*B:(b+1)*B]``. The same seed and n give the same order on every host and launcher."""
    return np.random.default_rng([int(seed), 0x52414345]).permutation(int(n_items))


def bets(d: np.ndarray, a: float, max_bet: float = MAX_BET) -> np.ndarray:
    """Predictable plug-in bets λ_1 … λ_n for the differences ``d`` (module docstring formula),
    capped at ``max_bet`` < 1: λ_t uses only d_1 … d_{t−1}."""
    d = np.asarray(d, float)
    n = d.size
    if n == 0:
        return np.empty(0)
    t = np.arange(1, n + 1, dtype=float)
    mu_hat = np.cumsum(d) / (t + 1)  # μ̂_t, t = 1..n
    mu_prev = np.concatenate([[0.0], mu_hat[:-1]])  # μ̂_{t−1}, the estimate d_t is centred on
    sig_hat = (1.0 + np.cumsum((d - mu_prev) ** 2)) / (t + 1)  # σ̂²_t
    sig_prev = np.concatenate([[1.0], sig_hat[:-1]])  # σ̂²_{t−1}
    lam = np.sqrt(2.0 * math.log(1.0 / a) / (sig_prev * t * np.log1p(t)))
    return np.minimum(lam, max_bet)


def log_capital(d: np.ndarray, a: float, m: float = 0.0, max_bet: float = MAX_BET) -> np.ndarray:
    """log K_t(m) for t = 1..n: the one-sided betting capital against H0: E[d] ≥ m. The bets are
    also capped at 1/(1 − m), so that every factor 1 − λ(d − m) ≥ 0 for d ≤ 1 (at m = 0 the cap is
    ``max_bet`` alone; with ``max_bet`` = 1/2 it never binds for m ≥ −1)."""
    d = np.asarray(d, float)
    lam = bets(d, a, max_bet)
    if m < 1:
        lam = np.minimum(lam, 1.0 / (1.0 - m))
    with np.errstate(divide="ignore"):  # m = −1, d = 1 and λ = 1/2: capital 0, log −inf
        return np.cumsum(np.log1p(-lam * (d - m)))


def upper_bound(d: np.ndarray, a: float, tol: float = 1e-4, max_bet: float = MAX_BET) -> float:
    """The confidence sequence's upper bound for E[d] after all of ``d`` (running minimum over t
    of U_t, module docstring), found by bisection on m ∈ [−1, 1]; 1.0 when nothing is excluded."""
    d = np.asarray(d, float)
    if d.size == 0:
        return 1.0
    thr = math.log(1.0 / a)

    def rejected(m: float) -> bool:  # some s ≤ t with K_s(m) ≥ 1/a
        return bool(np.max(log_capital(d, a, m, max_bet)) >= thr)

    if not rejected(1.0):
        return 1.0
    lo, hi = -1.0, 1.0  # K is increasing in m: rejected on [U, 1]
    if rejected(lo):
        return -1.0
    lo, hi = (lo, 0.0) if rejected(0.0) else (0.0, hi)  # so "U < 0" is exactly "rejected at 0"
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if rejected(mid) else (mid, hi)
    return hi


@dataclass(frozen=True)
class RaceDecision:
    """What one config learns after a batch."""

    stop: bool
    leader: str  # the rival it was found worse than (the leader under rule "leader"; itself when it leads)
    n: int  # paired items the test used
    delta: float  # mean(me − leader) over those items, in the metric's better direction
    upper: float  # the confidence sequence's upper bound on that difference (level a)
    log_capital: float  # max_t log K_t(0)
    threshold: float  # log((K − 1) / α)


def _leader(values: Mapping[str, np.ndarray], higher_is_better: bool) -> str:
    """The config with the best mean over its non-NaN values; ties to the smallest name."""
    sign = 1.0 if higher_is_better else -1.0

    def score(name: str) -> float:
        v = values[name][~np.isnan(values[name])]
        return sign * float(v.mean()) if v.size else -math.inf

    return min(values, key=lambda name: (-score(name), name))


def decide(
    values: Mapping[str, Sequence[float] | np.ndarray],
    me: str,
    n_configs: int,
    alpha: float = 0.05,
    higher_is_better: bool = True,
    with_bound: bool = True,
    rule: str = RULE,
    max_bet: float = MAX_BET,
) -> RaceDecision:
    """Should config ``me`` stop? ``values``: per alive config, its per-query values in [0, 1] on
    the same items in racing order (NaN = no value; pairs with a NaN are skipped).

    ``rule`` "leader": compare with the leader only (the best mean among ``values``); "any":
    with every other alive config, stopping when any of those tests rejects (the rival with the
    largest capital is reported). Both keep the guarantee (module docstring: the union bound covers
    all K − 1 tests of the best config, whichever are looked at). ``d = x_me − x_rival`` (sign flipped
    when lower is better); stop when ``max_t log K_t(0) ≥ log((K − 1)/α)``, K = ``n_configs`` (every
    config of the sweep, also those not compared here). ``with_bound``: also compute the confidence
    sequence's upper bound for the reported rival (a bisection; NaN when False).
    """
    arrays = {k: np.asarray(v, float) for k, v in values.items()}
    lengths = {len(v) for v in arrays.values()}
    if len(lengths) != 1:
        raise ValueError(f"racing: configs have different numbers of items {sorted(lengths)}")
    if rule not in RULES:
        raise ValueError(f"racing: rule must be one of {RULES} (got {rule!r})")
    a = alpha / max(n_configs - 1, 1)
    thr = math.log(1.0 / a)
    leader = _leader(arrays, higher_is_better)
    rivals = [c for c in arrays if c != me] if rule == "any" else [leader] if leader != me else []
    rivals.sort(key=lambda c: c != leader)  # the leader first: it is reported on ties
    best: tuple[float, str, np.ndarray] | None = None
    for rival in rivals:
        d = arrays[me] - arrays[rival]
        d = d[~np.isnan(d)] * (1.0 if higher_is_better else -1.0)
        if d.size == 0:
            continue
        if np.nanmax(np.abs(d)) > 1.0 + 1e-9:
            raise ValueError("racing: per-query values must lie in [0, 1] (differences in [-1, 1])")
        lk = float(np.max(log_capital(d, a, 0.0, max_bet)))
        if best is None or lk > best[0]:
            best = (lk, rival, d)
    if best is None:
        return RaceDecision(False, leader, 0, 0.0 if leader == me else math.nan, 1.0, 0.0, thr)
    lk, rival, d = best
    upper = upper_bound(d, a, max_bet=max_bet) if with_bound else math.nan
    return RaceDecision(lk >= thr, rival, int(d.size), float(d.mean()), upper, lk, thr)


def race_round(
    values: Mapping[str, Sequence[float] | np.ndarray],
    n_configs: int,
    alpha: float = 0.05,
    higher_is_better: bool = True,
    rule: str = RULE,
    max_bet: float = MAX_BET,
) -> dict[str, RaceDecision]:
    """:func:`decide` for every alive config at one batch end (what each job computes for itself
    from the shared store); used by the simulation test and the racing benchmark."""
    return {
        me: decide(values, me, n_configs, alpha, higher_is_better, False, rule, max_bet) for me in values
    }


# --------------------------------------------------------------------------------------------- reading
# How compare / select / report treat a racing sweep's stopped configs: never as if their partial
# means covered the eval set.

STATUS_TAG = "racing.status"


def is_stopped(tags: Mapping[str, str]) -> bool:
    """True for a run a racing sweep stopped early (tag ``racing.status`` = ``stopped``)."""
    return tags.get(STATUS_TAG) == "stopped"


def split_stopped(runs: Sequence) -> tuple[list, list]:
    """(runs that covered the eval set, runs stopped by racing); anything with ``.tags`` or
    ``.data.tags`` (RunData or an MLflow Run)."""
    def tags(r) -> Mapping[str, str]:
        return r.tags if hasattr(r, "tags") else r.data.tags

    return [r for r in runs if not is_stopped(tags(r))], [r for r in runs if is_stopped(tags(r))]


def stopped_rows(runs: Sequence, metric: str | None = None) -> list[list[str]]:
    """Table rows for stopped configs: config, stopped at n, stopped by, racing metric and its
    partial mean over those n items (labelled as such), the anytime-valid upper bound on the
    difference to the leader. ``runs``: RunData (with per-query tables)."""
    out = []
    for r in runs:
        t = r.tags
        m = metric or t.get("racing.primary", "")
        s = r.series(m).dropna() if m else None
        part = f"{s.mean():.3f} (n={s.size}, partial)" if s is not None and s.size else "–"
        out.append([
            r.name,
            t.get("racing.stopped_at_n", "?"),
            t.get("racing.stopped_by", "?"),
            m,
            part,
            t.get("racing.delta", "–"),
            t.get("racing.upper_bound", "–"),
        ])
    return out


STOPPED_HEADERS = [
    "config", "stopped at n", "stopped by (leader run)", "metric", "partial mean", "delta vs leader",
    "upper bound",
]
STOPPED_NOTE = (
    "Stopped by racing (docs/racing.md): each was significantly worse than the leader under an "
    "anytime-valid betting confidence sequence (its upper bound on the difference < 0, α split over "
    "the configs); its means cover only the first n items of the racing order, so it is left out of "
    "the comparisons, the tie set and the winner."
)
