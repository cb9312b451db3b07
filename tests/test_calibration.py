"""A/A calibration of every test family the tools print (docs/metrics.md, "Calibration").

On data with no effect (two configs whose per-query values are exchangeable; a factorial grid of
exchangeable configs; a candidate exactly at the non-inferiority margin) each test at α = 0.05
must reject at a rate within Monte-Carlo error of 0.05: at most 0.05 + 3·SE and, for the tests
that should be (nearly) exact, not far below it. Metric types: binary (0/1), bounded in [0, 1] and
continuous. Vectorised over replicates where the function allows it (``paired_deltas`` takes
every replicate as a column), modest replicate counts elsewhere; the whole file takes ~11 s of
CPU (25 s wall at load average 8 on 2 shared cores).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rag_experiments.analysis.gate import default_margin, non_inferiority, non_inferiority_family
from rag_experiments.analysis.interactions import wald_terms
from rag_experiments.analysis.stats import holm, paired_deltas

ALPHA = 0.05
KINDS = ("binary", "bounded", "continuous")
#: The declared value type (evaluation.metric_spec.ValueType) that chooses each kind's tests.
VTYPE = {"binary": "binary", "bounded": "proportion", "continuous": "continuous"}


def _se(reps: int) -> float:
    return math.sqrt(ALPHA * (1 - ALPHA) / reps)


def _aa_pair(kind: str, n: int, reps: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``reps`` A/A pairs (n × reps): per query a shared difficulty, each config drawn from it
    independently, so A and B are exchangeable within every query."""
    q = rng.random((n, 1))
    if kind == "binary":
        draw = lambda: (rng.random((n, reps)) < q).astype(float)  # noqa: E731
    elif kind == "bounded":
        draw = lambda: np.clip(q + rng.normal(0, 0.25, (n, reps)), 0, 1)  # noqa: E731
    else:
        draw = lambda: q + rng.standard_t(3, (n, reps))  # noqa: E731 heavy tails
    return draw(), draw()


# ----------------------------------------------------------------------------- compare's paired tests


@pytest.mark.parametrize("kind", KINDS)
def test_paired_tests_of_compare_hold_their_level_on_aa_data(kind):
    """McNemar (binary) and sign-flip (otherwise) on 600 A/A pairs of 60 queries."""
    rng = np.random.default_rng({"binary": 1, "bounded": 2, "continuous": 3}[kind])
    n, reps = 60, 600
    a, b = _aa_pair(kind, n, reps, rng)
    cols = [f"m{j}" for j in range(reps)]
    ids = [f"q{i}" for i in range(n)]
    ta = pd.DataFrame(a, columns=cols).assign(id=ids)
    tb = pd.DataFrame(b, columns=cols).assign(id=ids)
    res = paired_deltas(ta, tb, cols, seed=0, n_resamples=499, kinds=dict.fromkeys(cols, VTYPE[kind]))
    assert {r.test for r in res} == {"mcnemar-exact" if kind == "binary" else "sign-flip"}
    fpr = np.mean([r.p_value < ALPHA for r in res])
    assert fpr <= ALPHA + 3 * _se(reps), fpr
    # sign-flip is exact; exact McNemar is conservative by its discreteness, but not absurdly
    assert fpr >= (ALPHA - 3 * _se(reps) if kind != "binary" else 0.02), fpr


@pytest.mark.parametrize("kind", KINDS)
def test_identical_or_constant_metrics_are_no_effect(kind):
    rng = np.random.default_rng(4)
    a, _ = _aa_pair(kind, 40, 1, rng)
    ids = [f"q{i}" for i in range(40)]
    ta = pd.DataFrame({"id": ids, "same": a[:, 0], "const": 0.7 if kind != "binary" else 1.0})
    for r in paired_deltas(
        ta, ta.copy(), ["same", "const"], n_resamples=999, kinds=dict.fromkeys(["same", "const"], VTYPE[kind])
    ):
        assert r.p_value == 1.0 and r.delta == 0.0 and r.ci_low == r.ci_high == 0.0


# ----------------------------------------------------------------------------- sweep main effects / interactions


def _aa_grid(kind: str, n: int, levels: tuple[int, int], rng) -> pd.DataFrame:
    """A long table (query, f0, f1, y) of a factorial grid whose configs are all exchangeable."""
    q = rng.beta(0.3, 0.3, n) if kind == "binary" else rng.random(n)  # binary: many constant queries
    parts = []
    for i in range(levels[0]):
        for j in range(levels[1]):
            if kind == "binary":
                y = (rng.random(n) < q).astype(float)
            elif kind == "bounded":
                y = np.clip(q + rng.normal(0, 0.25, n), 0, 1)
            else:
                y = q + rng.standard_t(3, n)
            parts.append(pd.DataFrame({"query": np.arange(n), "y": y, "f0": str(i), "f1": str(j)}))
    return pd.concat(parts, ignore_index=True)


def test_sweep_wald_tests_hold_their_level_on_aa_grids():
    """Main effects and interaction of 2 × 2 and 3 × 2 A/A grids (40 queries), 150 grids per
    metric type: every term's rejection rate within MC error of 0.05, and not conservative
    overall (with the query dummies counted in the small-sample factor it was 0.02)."""
    rng = np.random.default_rng(5)
    reps, rates, all_p = 150, {}, []
    for kind in KINDS:
        p = np.array(
            [
                [pv for *_, pv in wald_terms(_aa_grid(kind, 40, (2, 2) if r % 2 else (3, 2), rng), 2)]
                for r in range(reps)
            ]
        )
        rates[kind] = float(np.mean(p < ALPHA))
        all_p.append(p.ravel())
        assert rates[kind] <= ALPHA + 3 * _se(p.size), rates
    pooled = np.concatenate(all_p)
    assert abs(np.mean(pooled < ALPHA) - ALPHA) <= 3 * _se(pooled.size), rates


# ----------------------------------------------------------------------------- select / gate non-inferiority


def _at_margin(kind: str, n: int, m: float, rng) -> tuple[np.ndarray, np.ndarray]:
    """A baseline and a candidate whose true mean difference is exactly −m (the NI null's edge)."""
    if kind == "binary":  # discordant pairs: P(1→0) = 0.25, P(0→1) = 0.25 − m
        u = rng.random(n)
        a = np.where(u < 0.25, 1.0, np.where(u < 0.5 - m, 0.0, (rng.random(n) < 0.6).astype(float)))
        b = np.where(u < 0.25, 0.0, np.where(u < 0.5 - m, 1.0, a))
        return a, b
    if kind == "bounded":
        a = rng.uniform(0.4, 0.6, n)
        return a, a - m + rng.uniform(-0.25, 0.25, n)  # stays inside [0, 1] for m <= 0.15
    a = rng.normal(0, 1, n)
    return a, a - m + rng.exponential(0.5, n) - 0.5  # skewed noise


@pytest.mark.parametrize("kind", KINDS)
def test_gate_non_inferiority_holds_its_level_at_the_margin(kind):
    """A candidate exactly ``margin`` worse passes gate (a false 'non-inferior') at most ~5 % of the
    time: 400 replicates of n = 100 (percentile bootstrap, 499 resamples)."""
    rng = np.random.default_rng({"binary": 6, "bounded": 7, "continuous": 8}[kind])
    n, reps = 100, 400
    m = default_margin(n)
    passed = [
        non_inferiority(pd.Series(a), pd.Series(b), n_resamples=499, seed=r, kind=VTYPE[kind]).passed
        for r, (a, b) in ((r, _at_margin(kind, n, m, rng)) for r in range(reps))
    ]
    assert np.mean(passed) <= ALPHA + 3 * _se(reps), np.mean(passed)


_N100 = [pytest.mark.slow]  # 2,000 score tests at n = 100: ~8 s each, the full suite's


@pytest.mark.parametrize(
    "n, p_loss",
    [(30, 0.2), (30, 0.3), pytest.param(100, 0.15, marks=_N100), pytest.param(100, 0.3, marks=_N100)],
)
def test_gate_on_binary_metrics_holds_its_level_at_small_n(n, p_loss):
    """0/1 metrics get the score test: a candidate exactly a margin worse (P(loss) = p_loss,
    P(win) = p_loss − margin) passes at most ~5 % of the time, and not far below (it is not
    a conservative stand-in). 2,000 replicates. The percentile bootstrap it replaced passed 7–8 %
    of the time here (docs/metrics.md, "Calibration")."""
    rng = np.random.default_rng(n + int(100 * p_loss))
    reps, m = 2000, default_margin(n)
    passed = []
    for _ in range(reps):
        u = rng.random(n)
        a = np.where(u < p_loss, 1.0, np.where(u < 2 * p_loss - m, 0.0, (rng.random(n) < 0.6).astype(float)))
        b = np.where(u < p_loss, 0.0, np.where(u < 2 * p_loss - m, 1.0, a))
        r = non_inferiority(pd.Series(a), pd.Series(b), kind="binary")
        assert r.test == "score"
        passed.append(r.passed)
    assert 0.02 <= np.mean(passed) <= ALPHA + 3 * _se(reps), np.mean(passed)


def test_score_test_statistic_bound_and_p_are_one_decision():
    """On 0/1 pairs the score statistic is Tango's: McNemar's z at δ0 = 0, and the restricted
    maximum-likelihood P(loss) (checked against a numerical maximisation, with and without an
    observed loss); PASS iff bound >= −margin iff p <= alpha on random tables and fractional values."""
    from scipy.optimize import minimize_scalar

    from rag_experiments.analysis.gate import restricted_z, score_bound, score_p

    def trinomial(better, worse, n):
        return np.array([1.0] * better + [-1.0] * worse + [0.0] * (n - better - worse))

    assert restricted_z(trinomial(9, 3, 50), 0.0) == pytest.approx((9 - 3) / math.sqrt(12))
    rng = np.random.default_rng(12)
    for i in range(200):
        n = int(rng.integers(5, 300))
        better, worse = (int(x) for x in rng.multinomial(n, [0.15, 0.2, 0.65])[:2])
        worse = 0 if i % 4 == 0 else worse  # no observed loss: the atom at −1 carries P(loss)
        d0 = -float(rng.uniform(0.01, 0.5))
        w = trinomial(better, worse, n)
        if w.mean() > d0:

            def nll(q, better=better, worse=worse, n=n, d0=d0):  # P(win) = q + d0, P(loss) = q
                loss = worse * math.log(q) if worse else 0.0
                return -(better * math.log(q + d0) + loss + (n - better - worse) * math.log(1 - 2 * q - d0))

            q = minimize_scalar(nll, bounds=(-d0 + 1e-12, (1 - d0) / 2 - 1e-12), method="bounded",
                                options={"xatol": 1e-12}).x  # fmt: skip
            z = (better - worse - n * d0) / math.sqrt(n * (2 * q + d0 * (1 - d0)))
            assert restricted_z(w, d0) == pytest.approx(z, rel=1e-4)
        frac = np.clip(w + rng.choice([0, 0.5, -0.5], n), -1, 1)
        for x in (w, frac):
            for alpha in (0.01, 0.05, 0.2):
                m = -d0
                assert (score_p(x, m) <= alpha) == (score_bound(x, alpha) >= -m - 1e-9)


def test_selects_family_keeps_the_familywise_rate():
    """select's tie set: 4 candidates all exactly at the margin below the best. Holm keeps the
    chance that any is called non-inferior at <= 5 % (unadjusted it would be ~4 × 5 %)."""
    rng = np.random.default_rng(9)
    n, reps, k = 100, 150, 4
    m = default_margin(n)
    any_holm, any_raw = [], []
    for r in range(reps):
        best = rng.uniform(0.4, 0.6, n)
        cands = [pd.Series(best - m + rng.uniform(-0.25, 0.25, n)) for _ in range(k)]
        res = non_inferiority_family(pd.Series(best), cands, n_resamples=499, seed=r)
        any_holm.append(any(x.passed for x in res))
        any_raw.append(any(x.p_value <= ALPHA for x in res))
    assert np.mean(any_holm) <= ALPHA + 3 * _se(reps), np.mean(any_holm)
    assert np.mean(any_raw) > np.mean(any_holm)  # the adjustment is doing the work


def test_non_inferiority_p_is_the_bound_decision():
    """PASS iff p <= alpha, at every alpha, for the same bootstrap (gate prints the bound)."""
    rng = np.random.default_rng(10)
    for _ in range(50):
        a, b = _at_margin("bounded", 30, 0.05, rng)
        for alpha in (0.01, 0.05, 0.2):
            r = non_inferiority(pd.Series(a), pd.Series(b), margin=0.05, alpha=alpha, n_resamples=199)
            assert r.passed == (r.lower >= -0.05 - 1e-12) == (r.p_value <= alpha)


# ----------------------------------------------------------------------------- Holm


def test_holm_keeps_the_familywise_rate_on_aa_p_values():
    """Families of 8 A/A p-values (uniform, and positively correlated through a shared component):
    P(any p_holm < 0.05) <= 0.05 + 3 SE; a single test is left unadjusted."""
    rng = np.random.default_rng(11)
    reps, m = 4000, 8
    from scipy import stats

    shared = rng.normal(size=(reps, 1))
    z = np.sqrt(0.5) * shared + np.sqrt(0.5) * rng.normal(size=(reps, m))
    for p in (rng.random((reps, m)), 2 * stats.norm.sf(np.abs(z))):
        fwer = np.mean([np.any(holm(row) < ALPHA) for row in p])
        assert fwer <= ALPHA + 3 * _se(reps), fwer
    assert holm([0.03])[0] == 0.03


def test_sweep_attribution_of_identical_configs_is_no_effect():
    """compare --sweep / report's one-factor-at-a-time and marginal tests on a 2 × 2 grid whose four
    configs have the same per-query values (binary and bounded): every p and p_holm is 1."""
    import json

    from rag_experiments.analysis.attribution import RunData, factor_effects

    rng = np.random.default_rng(12)
    n = 40
    table = pd.DataFrame(
        {
            "id": [f"q{i}" for i in range(n)],
            "hit_at_5": (rng.random(n) < 0.6).astype(float),
            "mrr": rng.random(n),
        }
    )
    runs = [
        RunData(
            f"{p}{k}",
            f"prompt={p},retriever.k={k}",
            {"prompt": p, "retriever.k": k},
            {"overrides": json.dumps([f"prompt={p}", f"retriever.k={k}"])},
            table.copy(),
        )
        for p in ("cite", "concise")
        for k in ("3", "5")
    ]
    att = factor_effects(runs, runs[0], ["hit_at_5", "mrr"], n_resamples=199, n_splits=100)
    assert (
        len(att.effects) == 4
        and (att.effects["p_value"] == 1.0).all()
        and (att.effects["p_holm"] == 1.0).all()
    )
    tested = att.marginals.dropna(subset=["p_value"])
    assert (
        len(tested) and (tested["p_value"] == 1.0).all() and (tested["delta_vs_baseline_level"] == 0.0).all()
    )


@pytest.mark.parametrize("n", [30, 100])
def test_proportion_score_test_holds_its_level_at_the_margin_on_mixed_values(n):
    """Proportion metrics get the score test, Tango's restricted ML generalised (stats.KIND_TESTS):
    per-query differences in {−1, −0.5, 0, 0.5, 1} (a third of the items fractional, as two-span
    evidence recall), mean exactly −margin. 4,000 replicates: it passes at most α + 3 SE and not far
    below (the percentile bootstrap passed ~6 % here, docs/metrics.md "Calibration")."""
    from rag_experiments.analysis.gate import score_p

    rng = np.random.default_rng(20 + n)
    reps, m, p = 4000, default_margin(n), 0.2
    u, frac = rng.random((reps, n)), rng.random((reps, n)) < 1 / 3
    trinomial = np.where(u < p, -1.0, np.where(u < 2 * p - m, 1.0, 0.0))
    halves = np.where(rng.random((reps, n)) < 0.5 + m, -0.5, 0.5)  # mean −m
    w = np.where(frac, halves, trinomial)
    passed = [score_p(x, m) <= ALPHA for x in w]
    assert np.mean(passed) <= ALPHA + 3 * _se(reps), np.mean(passed)
