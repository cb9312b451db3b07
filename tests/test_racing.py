"""Racing's anytime-valid test (analysis/racing.py): simulation with known effects, bounds, order."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rag_experiments.analysis import racing as R


def _correlated_bernoulli(rng, means, n, rho=0.6):
    """Per-query values in {0, 1} with exact means ``means`` that share query difficulty: with
    probability ``rho`` a query's draw is common to every config (U_i), else its own (V_ci)."""
    u = rng.random(n)
    v = rng.random((len(means), n))
    common = rng.random(n) < rho
    draw = np.where(common[None, :], u[None, :], v)
    return (draw <= np.asarray(means)[:, None]).astype(float)


def _race(x, batch, alpha, rng=None, rule=R.RULE, max_bet=R.MAX_BET):
    """The racing protocol over batches: returns {config index: n at which it was stopped}."""
    k, n = x.shape
    alive = set(range(k))
    stopped = {}
    for end in range(batch, n + 1, batch):
        vals = {str(c): x[c, :end] for c in sorted(alive)}
        for name, dec in R.race_round(vals, k, alpha, True, rule, max_bet).items():
            if dec.stop:
                stopped[int(name)] = end
        alive -= set(stopped)
        if len(alive) == 1:
            break
    return stopped


def test_simulation_stops_the_true_best_at_most_alpha_of_the_time():
    """≥ 500 repetitions with known effects: two configs share the best mean (0.60), the rest are
    worse. P(a true best is stopped) ≤ α; and the test has power: the clearly worse ones stop."""
    rng = np.random.default_rng(7)
    means = [0.60, 0.60, 0.55, 0.50, 0.40, 0.30]
    alpha, reps, n, batch = 0.05, 500, 240, 12
    best_stopped = 0
    worst_stopped = 0
    for _ in range(reps):
        x = _correlated_bernoulli(rng, means, n)
        stopped = _race(x, batch, alpha)
        best_stopped += 0 in stopped or 1 in stopped
        worst_stopped += 5 in stopped
    assert best_stopped / reps <= alpha, best_stopped
    assert worst_stopped / reps >= 0.9, worst_stopped


def test_simulation_all_equal_configs_rarely_stopped():
    """Every config is a true best (equal means, continuous values): stopping config 0 ≤ α."""
    rng = np.random.default_rng(11)
    alpha, reps, n, batch = 0.10, 500, 150, 10
    stops = 0
    for _ in range(reps):
        base = rng.random(n)
        x = np.clip(base[None, :] + rng.normal(0, 0.25, (4, n)), 0, 1)
        stops += 0 in _race(x, batch, alpha)
    assert stops / reps <= alpha, stops


def test_bets_are_predictable():
    """λ_t must not depend on d_t: changing the last value leaves every bet unchanged."""
    rng = np.random.default_rng(0)
    d = rng.uniform(-1, 1, 50)
    e = d.copy()
    e[-1] = -d[-1]
    assert np.array_equal(R.bets(d, 0.01), R.bets(e, 0.01))
    assert np.all((R.bets(d, 0.01) > 0) & (R.bets(d, 0.01) <= R.MAX_BET))


def test_upper_bound_is_a_valid_and_shrinking_bound():
    rng = np.random.default_rng(3)
    d = (rng.random(400) < 0.3).astype(float) - (rng.random(400) < 0.5).astype(float)  # mean −0.2
    u_short, u_long = R.upper_bound(d[:40], 0.05), R.upper_bound(d, 0.05)
    assert u_long < u_short
    assert -0.2 < u_long < 0  # excludes 0 with 400 items, still covers the true mean
    # stopping ⇔ the bound is below 0
    dec = R.decide({"a": np.zeros(400) + 0.5, "b": 0.5 + d / 2}, "b", 2, 0.05)
    assert dec.stop and dec.leader == "a" and dec.upper < 0


def test_decide_leader_direction_and_no_stop_when_leading():
    vals = {"a": [1, 1, 0, 1], "b": [0, 1, 0, 0]}
    assert R.decide(vals, "a", 2).leader == "a" and not R.decide(vals, "a", 2).stop
    assert R.decide(vals, "b", 2).leader == "a"
    lower = R.decide(vals, "a", 2, higher_is_better=False)  # lower is better: b leads
    assert lower.leader == "b" and lower.delta < 0
    with pytest.raises(ValueError, match="different numbers"):
        R.decide({"a": [1, 0], "b": [1]}, "a", 2)


def test_more_configs_need_more_evidence():
    """The α/(K−1) split: the same data stops a config among 2, not among 200."""
    d_good = np.ones(60)
    d_bad = (np.arange(60) % 3 == 0).astype(float)
    vals = {"a": d_good, "b": d_bad}
    t2, t200 = R.decide(vals, "b", 2).threshold, R.decide(vals, "b", 200).threshold
    assert t200 > t2 and math.isclose(t2, math.log(1 / 0.05))


def test_batch_order_is_seeded_permutation():
    a, b = R.batch_order(30, 5), R.batch_order(30, 5)
    assert np.array_equal(a, b) and sorted(a) == list(range(30))
    assert not np.array_equal(a, R.batch_order(30, 6))


def test_simulation_variant_any_rival_and_larger_bets_keeps_alpha():
    """The variants (docs/racing.md, "Why not 3×"): stop against any alive rival, bets up to 3/4.
    Same 500 races as the shipped method's test: a true best is still stopped in ≤ α of them."""
    rng = np.random.default_rng(7)
    means = [0.60, 0.60, 0.55, 0.50, 0.40, 0.30]
    alpha, reps, n, batch = 0.05, 500, 240, 12
    best_stopped = worst_stopped = 0
    for _ in range(reps):
        stopped = _race(_correlated_bernoulli(rng, means, n), batch, alpha, rule="any", max_bet=0.75)
        best_stopped += 0 in stopped or 1 in stopped
        worst_stopped += 5 in stopped
    assert best_stopped / reps <= alpha, best_stopped
    assert worst_stopped / reps >= 0.9, worst_stopped


def test_rule_any_and_bet_cap():
    rng = np.random.default_rng(4)
    base = rng.random(60)
    vals = {"a": (base < 0.8).astype(float), "b": (base < 0.7).astype(float), "c": (base < 0.2).astype(float)}
    lead = R.decide(vals, "c", 3, 0.05)
    anyr = R.decide(vals, "c", 3, 0.05, rule="any")
    assert lead.leader == "a" and anyr.log_capital >= lead.log_capital  # the max over rivals
    assert anyr.stop >= lead.stop and (anyr.upper < 0) == anyr.stop
    with pytest.raises(ValueError, match="rule"):
        R.decide(vals, "c", 3, rule="best")
    d = -np.ones(30)
    assert np.all(R.bets(d, 0.01, 0.75) <= 0.75) and R.bets(d, 0.01, 0.75).max() == 0.75
    # the fewest straight losses that can stop a config: (1 + max bet)^t >= (K-1)/alpha
    k, alpha = 12, 0.05
    for mb in (0.5, 0.75):
        t = math.ceil(math.log((k - 1) / alpha) / math.log1p(mb))
        ones = np.ones(t + 5)
        early = R.decide({"a": ones[: t - 1], "b": 0 * ones[: t - 1]}, "b", k, alpha, max_bet=mb)
        late = R.decide({"a": ones[:t], "b": 0 * ones[:t]}, "b", k, alpha, max_bet=mb)
        assert not early.stop and late.stop, mb
