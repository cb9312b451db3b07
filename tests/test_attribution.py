"""Attribution library: failure labels, paired statistics, Holm, flips, factor effects, gate maths."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rag_experiments.analysis.attribution import RunData, config_diff, factor_effects, infer_factors
from rag_experiments.analysis.gate import default_margin, min_detectable_effect, non_inferiority
from rag_experiments.analysis.stats import flips, holm, paired_delta, transition_matrix
from rag_experiments.evaluation.labels import Thresholds, failure_label, load_thresholds

TH = Thresholds(correct=0.5, faithful=0.5)
NAN = float("nan")


def ids(n: int) -> list[str]:
    return [f"q{i:03d}" for i in range(n)]


def series(values, n=None) -> pd.Series:
    values = np.asarray(values, float)
    return pd.Series(values, index=ids(len(values) if n is None else n))


# ----------------------------------------------------------------------------- failure labels


@pytest.mark.parametrize(
    "answerable, hit, correctness, faithfulness, generated, error, expected",
    [
        # error set wins over everything
        (True, True, 1.0, 1.0, True, "timeout after 3 retries", "error"),
        # retrieval-only run
        (True, False, NAN, NAN, False, None, "retrieval_failure"),
        (True, True, NAN, NAN, False, None, "retrieved"),
        (False, False, NAN, NAN, False, None, "retrieved"),
        # unanswerable item: ok iff the answer declined (correctness >= correct)
        (False, False, 1.0, NAN, True, None, "ok"),
        (False, True, 0.5, 0.0, True, None, "ok"),
        (False, False, 0.0, 1.0, True, None, "generation_failure"),
        # answerable, hit, correct and (faithful or faithfulness NaN)
        (True, True, 1.0, 1.0, True, None, "ok"),
        (True, True, 0.5, 0.5, True, None, "ok"),
        (True, True, 1.0, NAN, True, None, "ok"),
        # answerable, hit, not correct or not faithful
        (True, True, 0.0, 1.0, True, None, "generation_failure"),
        (True, True, 1.0, 0.2, True, None, "generation_failure"),
        (True, True, NAN, 1.0, True, None, "generation_failure"),
        # answerable, not hit, correct
        (True, False, 1.0, 0.0, True, None, "correct_without_evidence"),
        # answerable, not hit, not correct
        (True, False, 0.2, 1.0, True, None, "retrieval_failure"),
    ],
)
def test_failure_label_decision_table(answerable, hit, correctness, faithfulness, generated, error, expected):
    assert failure_label(answerable, hit, correctness, faithfulness, generated, error, TH) == expected


def test_failure_label_thresholds_from_config():
    th = load_thresholds()
    assert th == Thresholds(correct=0.5, faithful=0.5)
    strict = {"correct": 0.9, "faithful": 0.9}
    assert failure_label(True, True, 0.8, 1.0, True, None, th) == "ok"
    assert failure_label(True, True, 0.8, 1.0, True, None, strict) == "generation_failure"


# ----------------------------------------------------------------------------- paired tests


def test_true_ten_point_gain_on_400_binary_queries_is_detected():
    rng = np.random.default_rng(1)
    a = (rng.random(400) < 0.6).astype(float)
    b = a.copy()
    misses, hits = np.flatnonzero(a == 0), np.flatnonzero(a == 1)
    b[rng.choice(misses, 60, replace=False)] = 1  # 60 miss→hit
    b[rng.choice(hits, 20, replace=False)] = 0  # 20 hit→miss: net +40 / 400 = +10 points
    res = paired_delta(series(a), series(b), "hit_at_5", seed=0)
    assert res.binary and res.test == "mcnemar-exact"
    assert res.n_pairs == 400
    assert res.delta == pytest.approx(0.10)
    assert res.p_value < 0.05
    assert res.ci_low > 0 and res.ci_high > res.delta
    # the same inputs always give the same verdict
    assert paired_delta(series(a), series(b), "hit_at_5", seed=0) == res


def test_true_ten_point_gain_on_continuous_scores_is_detected():
    rng = np.random.default_rng(2)
    a = rng.beta(4, 3, 400)
    b = np.clip(a + 0.10 + rng.normal(0, 0.2, 400), 0, 1)
    res = paired_delta(series(a), series(b), "faithfulness", seed=0, n_resamples=2999)
    assert not res.binary and res.test == "sign-flip"
    assert res.p_value < 0.05 and res.ci_low > 0


def test_pairing_drops_nan_and_missing_ids():
    a = pd.Series([1.0, 0.0, NAN, 1.0], index=["x", "y", "z", "only_a"])
    b = pd.Series([1.0, 1.0, 0.0, 0.0], index=["x", "y", "z", "only_b"])
    res = paired_delta(a, b, "hit_at_5")
    assert res.n_pairs == 2  # x, y
    assert res.mean_a == 0.5 and res.mean_b == 1.0


def _null_pairs(rng, n, binary):
    """Exchangeable pairs: A and B are two independent draws around the same per-query level."""
    level = rng.beta(2, 2, n)
    if binary:
        return (rng.random(n) < level).astype(float), (rng.random(n) < level).astype(float)
    return level + rng.normal(0, 0.15, n), level + rng.normal(0, 0.15, n)


@pytest.mark.parametrize("binary", [True, False])
def test_pure_noise_on_50_queries_false_positive_rate(binary):
    trials, n = 200, 50
    rng = np.random.default_rng(12345)
    significant = 0
    for t in range(trials):
        a, b = _null_pairs(rng, n, binary)
        res = paired_delta(series(a), series(b), "m", seed=t, n_resamples=999)
        significant += res.p_value < 0.05
    rate = significant / trials
    # A valid level-0.05 test gives Binomial(200, <=0.05) false positives: mean <= 10, sd ~3.1.
    # The slack of 2 sd (0.031) keeps a correct test from failing on an unlucky seed (P < 3 %);
    # a miscalibrated test (unpaired, or a z-test on 0/1 with n = 50) overshoots it clearly.
    # McNemar exact is conservative, so the binary case is expected well under 0.05.
    slack = 2 * math.sqrt(0.05 * 0.95 / trials)
    assert rate <= 0.05 + slack, f"false-positive rate {rate:.3f}"
    if binary:
        assert rate <= 0.05


# ----------------------------------------------------------------------------- Holm


def test_holm_matches_hand_computation():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> monotone 0.06
    p = [0.01, 0.04, 0.03, 0.005]
    np.testing.assert_allclose(holm(p), [0.03, 0.06, 0.06, 0.02])
    # capped at 1, monotone
    np.testing.assert_allclose(holm([0.5, 0.6]), [1.0, 1.0])
    # NaN stays NaN and does not count towards m
    out = holm([0.02, NAN, 0.04])
    np.testing.assert_allclose(out[[0, 2]], [0.04, 0.04])
    assert math.isnan(out[1])
    assert holm([]).size == 0


# ----------------------------------------------------------------------------- flips, transitions


def _table(hits, labels):
    n = len(hits)
    return pd.DataFrame(
        {
            "id": ids(n),
            "query": [f"question {i}" for i in range(n)],
            "tags": [["paraphrase"] if i % 2 else [] for i in range(n)],
            "hit_at_5": np.asarray(hits, float),
            "failure_label": labels,
        }
    )


def test_flips_and_transition_matrix():
    a = _table([1, 1, 0, 0, NAN], ["ok", "ok", "retrieval_failure", "retrieval_failure", "ok"])
    b = _table(
        [1, 0, 1, 0, NAN], ["ok", "retrieval_failure", "ok", "retrieval_failure", "generation_failure"]
    )
    f = flips(a, b, "hit_at_5")
    assert f[["id", "change"]].values.tolist() == [["q001", "hit→miss"], ["q002", "miss→hit"]]
    assert f.loc[0, "query"] == "question 1" and f.loc[0, "tags"] == ["paraphrase"]
    fl = flips(a, b, "failure_label")
    assert dict(zip(fl["id"], fl["change"], strict=True)) == {
        "q001": "ok→retrieval_failure",
        "q002": "retrieval_failure→ok",
        "q004": "ok→generation_failure",
    }
    m = transition_matrix(a, b)
    assert list(m.index) == ["ok", "retrieval_failure", "generation_failure"]
    assert m.loc["ok", "ok"] == 1
    assert m.loc["ok", "retrieval_failure"] == 1
    assert m.loc["retrieval_failure", "ok"] == 1
    assert m.loc["retrieval_failure", "retrieval_failure"] == 1
    assert m.loc["ok", "generation_failure"] == 1
    assert m.to_numpy().sum() == 5


# ----------------------------------------------------------------------------- config diff, factors


BASE_PARAMS = {
    "chunking": "fixed",
    "chunking._target_": "rag_experiments.stages.chunking.FixedChunker",
    "chunking.size": "256",
    "embedding": "minilm",
    "embedding._target_": "rag_experiments.stages.embedding.MiniLM",
    "retriever": "dense",
    "retriever.k": "5",
    "seed": "0",
    "cache_dir": ".cache/a",
    "tracking.uri": "sqlite:///mlflow.db",
    "experiment_name": "x",
}


def test_config_diff_names_the_factor_only():
    other = dict(
        BASE_PARAMS, **{"retriever.k": "10", "cache_dir": "/elsewhere", "tracking.uri": "sqlite:///b.db"}
    )
    assert config_diff(BASE_PARAMS, other) == {"retriever.k": ("5", "10")}
    sentence = dict(
        BASE_PARAMS, chunking="sentence", **{"chunking._target_": "rag_experiments.stages.chunking.Sentence"}
    )
    del sentence["chunking.size"]
    sentence["chunking.max_sentences"] = "3"
    assert config_diff(BASE_PARAMS, sentence) == {"chunking": ("fixed", "sentence")}
    full = config_diff(BASE_PARAMS, sentence, collapse_groups=False)
    assert set(full) == {"chunking", "chunking._target_", "chunking.size", "chunking.max_sentences"}
    assert config_diff(BASE_PARAMS, dict(BASE_PARAMS)) == {}


def _grid(effect_sentence=0.15, effect_k10=0.0, replicate=False, overrides=True, n=300):
    """A 2×2 grid chunking ∈ {fixed, sentence} × retriever.k ∈ {5, 10} with known effects on hit_at_5."""
    rng = np.random.default_rng(7)
    base = (rng.random(n) < 0.5).astype(float)
    runs = []
    for chunk in ("fixed", "sentence"):
        for k in ("5", "10"):
            hit = base.copy()
            if chunk == "sentence":
                flip = np.flatnonzero(hit == 0)[: int(effect_sentence * n)]
                hit[flip] = 1
            if k == "10" and effect_k10:
                flip = np.flatnonzero(hit == 0)[-int(effect_k10 * n) :]
                hit[flip] = 1
            params = dict(BASE_PARAMS, chunking=chunk, **{"retriever.k": k})
            tags = {"config_hash": f"{chunk}-{k}"}
            if overrides:
                tags["overrides"] = f'["chunking={chunk}", "retriever.k={k}"]'
            table = pd.DataFrame({"id": ids(n), "hit_at_5": hit, "mrr": hit * 0.5})
            runs.append(RunData(f"run-{chunk}-{k}", f"chunking={chunk},retriever.k={k}", params, tags, table))
    if replicate:
        r0 = runs[0]
        runs.append(RunData("run-fixed-5-again", r0.name, r0.params, dict(r0.tags), r0.table.copy()))
    return runs


@pytest.mark.parametrize("overrides", [True, False])
def test_infer_factors_from_overrides_or_params(overrides):
    assert infer_factors(_grid(overrides=overrides)) == ["chunking", "retriever.k"]


def test_factor_effects_one_at_a_time_marginals_holm_and_noise_floor():
    runs = _grid()
    base = runs[0]  # chunking=fixed, k=5
    att = factor_effects(runs, base, ["hit_at_5", "mrr"], seed=0, n_resamples=999, n_splits=500)
    assert att.factors == {"chunking": ["fixed", "sentence"], "retriever.k": ["5", "10"]}
    eff = att.effects.set_index(["factor", "level", "metric"])
    sent = eff.loc[("chunking", "sentence", "hit_at_5")]
    assert sent.run_id == "run-sentence-5"  # the other factor held at the baseline's value
    assert sent.delta == pytest.approx(0.15, abs=1 / 300)
    assert sent.p_holm < 0.05 and sent.ci_low > 0
    k10 = eff.loc[("retriever.k", "10", "hit_at_5")]
    assert k10.run_id == "run-fixed-10" and k10.delta == 0 and k10.p_value == 1.0
    # Holm across all comparisons: adjusted >= raw, and the family size is all of them
    all_p = np.concatenate([att.effects.p_value, att.marginals.p_value.dropna()])
    np.testing.assert_allclose(
        np.sort(np.concatenate([att.effects.p_holm, att.marginals.p_holm.dropna()])), np.sort(holm(all_p))
    )
    mar = att.marginals.set_index(["factor", "level", "metric"])
    fixed, sentence = (
        mar.loc[("chunking", "fixed", "hit_at_5")],
        mar.loc[("chunking", "sentence", "hit_at_5")],
    )
    assert sentence["mean"] - fixed["mean"] == pytest.approx(0.15, abs=1 / 300)
    assert fixed.n_runs == 2 and fixed.ci_low <= fixed["mean"] <= fixed.ci_high
    nf = att.noise_floor.set_index("metric")
    assert nf.loc["hit_at_5", "method"] == "split-half"
    assert nf.loc["hit_at_5", "low"] < 0 < nf.loc["hit_at_5", "high"]


def test_noise_floor_uses_replicate_runs_when_present():
    runs = _grid(replicate=True)
    att = factor_effects(runs, runs[0], ["hit_at_5"], n_resamples=499)
    row = att.noise_floor.iloc[0]
    assert row.method == "replicate runs" and "same config_hash" in row.detail
    assert row.low == row.high == row.delta == 0.0  # a deterministic pipeline re-run


# ----------------------------------------------------------------------------- gate maths


def _regression(n, net_points, churn=0):
    """Baseline hits ~70 %; candidate flips ``churn`` + net miss→hit and ``churn`` hit→miss."""
    rng = np.random.default_rng(3)
    a = (rng.random(n) < 0.7).astype(float)
    b = a.copy()
    net = round(net_points * n)
    up, down = churn + max(net, 0), churn + max(-net, 0)
    b[np.flatnonzero(a == 0)[:up]] = 1
    b[np.flatnonzero(a == 1)[:down]] = 0
    return series(a), series(b)


def test_gate_five_point_regression_fails_with_margin_002():
    a, b = _regression(400, -0.05)
    res = non_inferiority(a, b, margin=0.02)
    assert res.delta == pytest.approx(-0.05)
    assert not res.passed and res.verdict == "FAIL" and res.lower < -0.02


def test_gate_half_point_gain_passes():
    a, b = _regression(400, +0.005)
    res = non_inferiority(a, b, margin=0.02)
    assert res.delta == pytest.approx(0.005) and res.passed
    # also with the default margin, and with some churn around the gain
    assert non_inferiority(a, b).passed
    a2, b2 = _regression(400, +0.005, churn=10)
    assert non_inferiority(a2, b2, margin=0.02).passed


def test_gate_is_deterministic_and_identity_passes():
    a, b = _regression(400, -0.02, churn=20)
    assert non_inferiority(a, b, margin=0.02, seed=0) == non_inferiority(a, b, margin=0.02, seed=0)
    # identical on every item: one config on this eval set, tied whatever the test and margin
    # (the score test alone would put the bound near -3/400, and Holm over a family could fail it)
    for kind, test in (("binary", "score"), ("proportion", "score"), ("continuous", "bootstrap")):
        same = non_inferiority(a, a, margin=0.0, kind=kind)
        assert same.test == test and same.identical and same.passed and same.lower == 0 == same.delta


def test_default_margin_scales_with_n():
    assert default_margin(100) == pytest.approx(0.1)
    assert default_margin(400) == pytest.approx(0.05)
    assert default_margin(5000) == pytest.approx(1 / math.sqrt(5000))
    assert default_margin(100_000) == 0.01
    # the example: a true 2-point drop is noise at 100 queries, real at 5,000
    a, b = _regression(100, -0.02)
    assert non_inferiority(a, b).passed
    a, b = _regression(5000, -0.02, churn=100)
    assert not non_inferiority(a, b, n_resamples=1999).passed


def test_min_detectable_effect_formula():
    a, b = _regression(400, -0.05, churn=20)
    d = (b - a).to_numpy()
    expected = (1.6448536269514722 + 0.8416212335729143) * d.std(ddof=1) / math.sqrt(400)
    assert min_detectable_effect(a, b) == pytest.approx(expected)
    assert non_inferiority(a, b).mde == pytest.approx(expected)
