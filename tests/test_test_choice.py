"""The paired test is chosen by the metric's declared value type, never by the values observed
(docs/select.md "Which test"; analysis.stats.KIND_TESTS); identical configs are always tied and
duplicates count once in the Holm family and the tie count (issue 43, items 4 and 6)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rag_experiments.analysis.attribution import RunData
from rag_experiments.analysis.gate import non_inferiority, non_inferiority_family
from rag_experiments.analysis.select import TIE_RESAMPLES, select_config, tie_family
from rag_experiments.analysis.stats import KIND_TESTS, holm, paired_delta, value_kind


def _s(values) -> pd.Series:
    return pd.Series(np.asarray(values, float), index=[f"q{i}" for i in range(len(values))])


def _run(name: str, values, metric: str = "evidence_recall_at_5") -> RunData:
    t = pd.DataFrame({"id": [f"q{i}" for i in range(len(values))], metric: np.asarray(values, float)})
    return RunData(name, name, {}, {"config_hash": name}, t)


def test_kind_comes_from_the_registry_not_the_values():
    assert value_kind("hit_at_5") == "binary" and value_kind("mrr") == "continuous"
    assert value_kind("evidence_recall_at_5") == "proportion" and value_kind("not_a_metric") == "continuous"
    rng = np.random.default_rng(0)
    a = (rng.random(40) < 0.6).astype(float)
    b = (rng.random(40) < 0.6).astype(float)
    b_half = b.copy()
    b_half[3] = 0.5  # one two-span item half covered
    # a proportion metric: the same tests whether or not a 0.5 appears
    tests = {non_inferiority(_s(a), _s(x), metric="evidence_recall_at_5").test for x in (b, b_half)}
    assert tests == {KIND_TESTS["proportion"][1]} == {"score"}
    two = {paired_delta(_s(a), _s(x), "evidence_recall_at_5").test for x in (b, b_half)}
    assert two == {"sign-flip"}
    # a continuous metric on 0/1 values keeps its bootstrap; a binary one its score test / McNemar
    assert non_inferiority(_s(a), _s(b), metric="mrr").test == "bootstrap"
    assert non_inferiority(_s(a), _s(b), metric="hit_at_5").test == "score"
    assert paired_delta(_s(a), _s(b), "hit_at_5").test == "mcnemar-exact"
    # a binary metric averaged over replicates is a proportion: still the score test
    assert non_inferiority(_s(a), _s(b_half), metric="hit_at_5").kind == "proportion"


def test_fractional_score_test_is_tangos_on_binary_pairs():
    rng = np.random.default_rng(1)
    a = (rng.random(60) < 0.5).astype(float)
    b = (rng.random(60) < 0.5).astype(float)
    r1 = non_inferiority(_s(a), _s(b), kind="binary")
    r2 = non_inferiority(_s(a), _s(b), kind="proportion")
    assert (r1.p_value, r1.lower) == (r2.p_value, r2.lower)


def test_identical_config_is_tied_in_a_large_family_and_a_worse_one_is_not_favoured():
    """The issue's sweep (29 configs there, 14 here); one identical to the best was 'not tied' (score test with no
    discordant pair, Holm p 0.10) while a worse one was tied. Identical is now always tied."""
    rng = np.random.default_rng(2)
    n = 33
    best = (rng.random(n) < 0.8).astype(float)
    others = [np.where(rng.random(n) < 0.3, 1 - best, best) for _ in range(12)]
    runs = [_run("best", best), _run("same", best.copy())] + [_run(f"c{i}", x) for i, x in enumerate(others)]
    for kind in ("binary", "proportion", "continuous"):
        sel = select_config(
            runs, "evidence_recall_at_5", True, [float("nan")] * len(runs), kind=kind, n_resamples=499
        )
        t = sel.table.set_index("config")
        assert t.loc["same", "tie"] and not t.loc["same", "worse"], kind
        assert sel.duplicates == [["best", "same"]]


def test_duplicates_count_once_in_holm_and_the_tie_count():
    rng = np.random.default_rng(3)
    n = 50
    best = rng.random(n)
    worse = best - 0.3 + rng.normal(0, 0.05, n)
    dup = [_s(worse) for _ in range(10)]
    res = non_inferiority_family(_s(best), [*dup, _s(best)], metric="mrr", margin=0.1, n_resamples=499)
    # ten copies are one member: the same p_holm as a family of one (plus the best's duplicate, out)
    alone = non_inferiority(_s(best), _s(worse), metric="mrr", margin=0.1, n_resamples=499)
    assert {r.p_holm for r in res[:10]} == {alone.p_value}
    assert res[10].passed and res[10].identical
    assert list(holm([0.01, 0.01, 0.04], keys=["x", "x", "y"])) == [0.02, 0.02, 0.04]
    runs = [_run("best", best, "mrr"), *(_run(f"d{i}", worse, "mrr") for i in range(10))]
    _, by_run, power = tie_family(runs, "mrr", True, 0, 0.1, 0.05, 0, n_resamples=499)
    assert power is None or power.n_others == 1  # ten duplicates are one comparison
    assert TIE_RESAMPLES == 9999


def test_a_factor_no_metric_depends_on_is_found_before_the_sweep():
    """retriever.k=3,5 with generator=none: the issue's 15 duplicate runs (run.pilot.inert_factors,
    printed by the multirun callback before the first job)."""
    from rag_experiments.run.pilot import inert_factors, inert_warning

    jobs = [
        [f"chunking={c}", f"retriever.k={k}", "generator=none"] for c in ("fixed", "sentence") for k in (3, 5)
    ]
    assert inert_factors(jobs, [False] * 4) == ["retriever.k"]
    assert inert_factors(jobs, [True] * 4) == []  # with generation k is the context size
    assert inert_factors([["prompt=concise"], ["prompt=cite"]], [False, False]) == ["prompt"]
    assert inert_factors([["retriever=bm25"], ["retriever=dense"]], [False, False]) == []
    assert "retriever.k swept with generator=none" in inert_warning(["retriever.k"], 4)
