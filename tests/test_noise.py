"""Replicates, variance decomposition and power planning (issue 19 items 1-3): pure parts, fast."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from rag_experiments.analysis.gate import min_detectable_effect
from rag_experiments.analysis.power import (
    mde,
    n_for_effect,
    paired_variance,
    replicates_for_effect,
    z_sum,
)
from rag_experiments.analysis.variance import (
    nested_components,
    one_way_components,
    pilot_components,
    shares,
    variance_metrics,
)
from rag_experiments.evaluation.aggregate import aggregate, cluster_mean_ci, mean_ci
from rag_experiments.evaluation.replicates import collapse_replicates, flip_rates, n_replicates
from rag_experiments.run.config_schema import validate


def _simulate(q: int, r: int, j: int, sd=(0.2, 0.1, 0.07), seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.normal(0, sd[0], (q, 1, 1))
    b = rng.normal(0, sd[1], (q, r, 1))
    e = rng.normal(0, sd[2], (q, r, j))
    return 0.5 + a + b + e


# ----------------------------------------------------------------------------- variance decomposition


def test_nested_anova_recovers_known_components():
    y = _simulate(3000, 3, 2)
    got = nested_components(y)
    assert got["query"] == pytest.approx(0.04, abs=0.004)
    assert got["generation"] == pytest.approx(0.01, abs=0.0015)
    assert got["judge"] == pytest.approx(0.0049, abs=0.0005)
    true = shares({"query": 0.04, "generation": 0.01, "judge": 0.0049})
    for c, s in shares(got).items():
        assert s == pytest.approx(true[c], abs=0.05), c


def test_one_way_without_judge_repeats_and_unbalanced():
    y = _simulate(3000, 4, 1, sd=(0.2, 0.15, 0.0))[:, :, 0]
    y[::3, 3] = np.nan  # a third of the queries lost a replicate
    y[::7, 1:] = np.nan  # some have a single replicate
    between, within = one_way_components(list(y))
    assert between == pytest.approx(0.04, abs=0.004) and within == pytest.approx(0.0225, abs=0.002)
    got = nested_components(y)  # 2-D: no judge component at all, not a zero
    assert set(got) == {"query", "generation"}
    # no between-query variance: the estimate is truncated at 0, not negative
    flat = _simulate(500, 3, 1, sd=(0.0, 0.2, 0.0))[:, :, 0]
    assert nested_components(flat)["query"] >= 0.0


def test_variance_metrics_read_a_long_table():
    y = _simulate(400, 3, 1, sd=(0.2, 0.2, 0.0), seed=3)[:, :, 0]
    df = _long(y)
    out = variance_metrics(df)
    assert set(out) == {"var_share/correctness/query", "var_share/correctness/generation"}
    assert out["var_share/correctness/query"] == pytest.approx(0.5, abs=0.08)
    assert variance_metrics(df.drop(columns=["replicate"])) == {}


# ----------------------------------------------------------------------------- long tables


def _long(y: np.ndarray, hits: np.ndarray | None = None) -> pd.DataFrame:
    q, r = y.shape
    hits = np.ones(q) if hits is None else hits
    rows = []
    for i in range(q):
        for rep in range(r):
            rows.append(
                {
                    "id": f"q{i:04d}",
                    "query": f"question {i}",
                    "tags": ["t"],
                    "gold_spans": [] if i == 0 else [{"doc_id": "d", "start": 0, "end": 5}],
                    "hit_at_5": float(hits[i]),
                    "correctness": float(y[i, rep]),
                    "failure_label": "ok" if y[i, rep] >= 0.5 else "generation_failure",
                    "error": None,
                    "n_unparseable": 1,
                    "replicate": rep,
                    "generation_seed": rep,
                }
            )
    return pd.DataFrame(rows)


def test_collapse_gives_one_row_per_query_and_leaves_retrieval_alone():
    y = np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.5, 1.0]])
    df = _long(y, hits=np.array([1.0, 0.0, 1.0]))
    df.loc[df["id"].eq("q0001") & df["replicate"].eq(2), "error"] = "HTTP 500"
    one = collapse_replicates(df)
    assert list(one["id"]) == ["q0000", "q0001", "q0002"] and "replicate" not in one
    assert list(one["hit_at_5"]) == [1.0, 0.0, 1.0]  # unchanged, not weighted
    assert one["correctness"].tolist() == pytest.approx([2 / 3, 0.0, 2.5 / 3])
    assert list(one["failure_label"]) == ["ok", "generation_failure", "ok"]  # modal label
    assert one["error"].isna().all()  # only one replicate of q0001 failed
    assert list(one["n_replicates"]) == [3, 3, 3] and n_replicates(df) == 3
    assert collapse_replicates(one) is one  # unreplicated: unchanged
    flips = flip_rates(df, correct_threshold=0.5)
    # q0000 flips (1,1,0); q0001 has two successful replicates, both 0; q0002 is 1, 0.5, 1: all >= 0.5
    assert flips["replicate_flip/correctness"] == pytest.approx(1 / 3)
    assert flips["replicate_flip/failure_label"] == pytest.approx(1 / 3)


def test_aggregates_of_a_replicated_table_average_within_queries_first():
    rng = np.random.default_rng(1)
    y = rng.uniform(0, 1, (40, 3))
    df = _long(y, hits=(np.arange(40) % 2).astype(float))
    agg = aggregate(df, n_resamples=200)
    one = collapse_replicates(df)
    assert agg["n_queries"] == 40 and agg["n_scored/correctness"] == 40
    assert agg["hit_at_5"] == 0.5 and agg["n_scored/hit_at_5"] == 40  # not 120 rows
    assert agg["correctness"] == pytest.approx(y.mean())
    assert agg["n_unparseable_verdicts"] == 120  # every replicate's verdicts counted
    ci = mean_ci(one["correctness"], n_resamples=200)
    assert (agg["correctness_ci_low"], agg["correctness_ci_high"]) == pytest.approx(ci[1:3])


def test_cluster_bootstrap_width_matches_the_two_level_variance():
    """The CI of the grand mean reflects σ²_b/n + σ²_w/(nR); a naive bootstrap over the n·R rows is
    too narrow when replicates share their query."""
    q, r = 300, 3
    y = _simulate(q, r, 1, sd=(0.2, 0.3, 0.0), seed=7)[:, :, 0]
    clusters = np.repeat(np.arange(q), r)
    mean, lo, hi, n = cluster_mean_ci(y.ravel(), clusters, n_resamples=2000)
    assert n == q and mean == pytest.approx(y.mean())
    se = math.sqrt(0.04 / q + 0.09 / (q * r))
    assert (hi - lo) / (2 * 1.96 * se) == pytest.approx(1.0, abs=0.15)
    _, nlo, nhi, _ = mean_ci(y.ravel(), n_resamples=2000)
    assert (nhi - nlo) < 0.85 * (hi - lo)


# ----------------------------------------------------------------------------- power


def test_mde_formula_by_hand_and_the_gate_uses_it():
    z = 1.959964 + 0.841621
    assert z_sum() == pytest.approx(z, abs=1e-5)
    assert mde(0.04, 100, 0.02, 2) == pytest.approx(z * math.sqrt(0.04 / 100 + 0.02 / 200), rel=1e-5)
    assert math.isnan(mde(0.04, 1))
    rng = np.random.default_rng(0)
    a, b = rng.normal(0, 1, 50), rng.normal(0.1, 1, 50)
    one_sided = (1.644854 + 0.841621) * np.std(b - a, ddof=1) / math.sqrt(50)
    assert min_detectable_effect(a, b) == pytest.approx(one_sided, rel=1e-5)
    # sample sizes invert the MDE
    n = n_for_effect(0.03, 0.04, 0.02, 2)
    assert mde(0.04, n, 0.02, 2) <= 0.03 < mde(0.04, n - 1, 0.02, 2)
    r = replicates_for_effect(0.05, 200, 0.04, 0.2)
    assert mde(0.04, 200, 0.2, r) <= 0.05 < mde(0.04, 200, 0.2, r - 1)
    assert replicates_for_effect(0.01, 50, 0.04, 0.2) is None  # between-query variance alone too big
    assert paired_variance(0.04, 0.01, rho=0.5) == (pytest.approx(0.04), pytest.approx(0.02))


def test_mde_has_the_stated_power_in_simulation():
    """A true paired effect equal to the MDE is detected ~80 % of the time (two-sided z test)."""
    rng = np.random.default_rng(11)
    n, r, vb, vw = 60, 3, 0.03, 0.05
    delta = mde(vb, n, vw, r)
    sims = 4000
    d_q = rng.normal(delta, math.sqrt(vb), (sims, n)) + rng.normal(0, math.sqrt(vw), (sims, n, r)).mean(
        axis=2
    )
    se = math.sqrt(vb / n + vw / (n * r))
    power = float((np.abs(d_q.mean(axis=1) / se) > 1.959964).mean())
    assert power == pytest.approx(0.8, abs=0.03)


def test_pilot_components_of_replicated_and_single_runs():
    y = _simulate(2000, 3, 1, sd=(0.2, 0.1, 0.0), seed=5)[:, :, 0]
    df = _long(y)
    n, r, vq, vg = pilot_components(df, "correctness")
    assert (
        (n, r) == (2000, 3) and vq == pytest.approx(0.04, abs=0.004) and vg == pytest.approx(0.01, abs=0.001)
    )
    n, r, vq, vg = pilot_components(collapse_replicates(df), "correctness")
    assert r == 1 and math.isnan(vg) and vq == pytest.approx(0.04 + 0.01 / 3, abs=0.004)
    assert pilot_components(df, "hit_at_5")[3] == 0.0  # retrieval: no replicate noise


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("bad", [0, -1, 1.5, "3"])
def test_replicates_below_one_is_a_config_problem_naming_the_key(bad):
    cfg = {
        "experiment_name": "x",
        "seed": 0,
        "replicates": bad,
        "metrics": {"ks": [1], "bootstrap_resamples": 100},
    }
    problems = validate(cfg)
    assert any(p.startswith("conf/config: replicates: must be an integer >= 1") for p in problems), problems
    cfg["replicates"] = 3
    assert not any("replicates" in p for p in validate(cfg))


# ----------------------------------------------------------------------------- report


def test_report_variance_bars_from_logged_shares(tmp_path):
    from types import SimpleNamespace

    from rag_experiments.report.figures import variance_shares
    from rag_experiments.report.plots import VarianceShares, draw

    metrics = {
        "var_share/correctness/query": 0.6,
        "var_share/correctness/generation": 0.4,
        "var_share/faithfulness/query": 0.2,
        "var_share/faithfulness/generation": 0.8,
        "correctness": 0.5,
    }
    one = variance_shares([SimpleNamespace(label="a", metrics=metrics)])
    assert list(one.columns) == ["query", "generation"]  # no judge repeats: no judge column
    assert one.loc["faithfulness", "generation"] == 0.8
    two = variance_shares([SimpleNamespace(label=x, metrics=metrics) for x in ("a", "b")])
    assert "b · correctness" in two.index
    assert variance_shares([SimpleNamespace(label="a", metrics={"correctness": 0.5})]).empty
    png = draw(VarianceShares(one), tmp_path / "v.png")
    assert png.stat().st_size > 1000


# ----------------------------------------------------------------------------- judge repeats in runs


def _labels(k_supported: np.ndarray, n_claims: int) -> str:
    """``judge_repeat_labels`` of a row whose repeat j finds ``k_supported[j]`` of ``n_claims``
    claims supported (plus one unparseable claim, which no repeat's score may count)."""
    import json

    by_claim = [["supported" if c < k else "unsupported" for k in k_supported] for c in range(n_claims)]
    by_claim.append(["unparseable"] * len(k_supported))
    return json.dumps(by_claim)


def _judged_table(y: np.ndarray, n_claims: int = 10, replicated: bool = True) -> tuple[pd.DataFrame, np.ndarray]:
    """A per-query table whose faithfulness of (q, r, judge repeat j) is round(y·C)/C, the repeats
    kept in-row as ``judge_repeat_labels`` (as the pipeline writes them); also that rounded cube."""
    k = np.clip(np.rint(y * n_claims), 0, n_claims).astype(int)
    q, r, _ = y.shape
    rows = []
    for i in range(q):
        for rep in range(r):
            rows.append({
                "id": f"q{i:04d}",
                "faithfulness": k[i, rep, 0] / n_claims,  # the run's metric: repeat 0
                "correctness": float(y[i, rep, 0] > 0.5),
                "judge_repeat_labels": _labels(k[i, rep], n_claims),
                "error": None,
                **({"replicate": rep, "generation_seed": rep} if replicated else {}),
            })
    return pd.DataFrame(rows), k / n_claims


def test_judge_share_from_the_repeats_kept_in_each_row():
    from rag_experiments.judge.repeats import judge_repeat_long, repeat_scores

    y = _simulate(1500, 3, 3, sd=(0.15, 0.1, 0.1), seed=5)
    df, cube = _judged_table(y)
    assert repeat_scores(df["judge_repeat_labels"].iloc[0]) == list(cube[0, 0])  # unparseable not counted
    long = judge_repeat_long(df, "faithfulness")
    assert len(long) == 1500 * 3 * 3 and set(long["judge_repeat"]) == {0, 1, 2}
    out = variance_metrics(df)
    want = shares(nested_components(cube))
    for c in ("query", "generation", "judge"):
        assert out[f"var_share/faithfulness/{c}"] == pytest.approx(want[c], abs=1e-12), c
    # and those are the simulated components (rounding to tenths adds ~1/1200 to the judge's)
    true = shares({"query": 0.0225, "generation": 0.01, "judge": 0.01 + 1 / 1200})
    for c, v in true.items():
        assert out[f"var_share/faithfulness/{c}"] == pytest.approx(v, abs=0.04), c
    # correctness is not re-judged by the repeats: no judge share for it, not a zero
    assert "var_share/correctness/query" in out and "var_share/correctness/judge" not in out
    # the run's faithfulness (repeat 0) is unchanged by the repeats
    assert df["faithfulness"].tolist() == cube[:, :, 0].ravel().tolist()


def test_judge_repeats_without_replicates_split_query_and_judge():
    y = _simulate(1500, 1, 4, sd=(0.2, 0.0, 0.1), seed=6)
    df, cube = _judged_table(y, replicated=False)
    out = variance_metrics(df)
    assert set(out) == {"var_share/faithfulness/query", "var_share/faithfulness/judge"}
    assert out["var_share/faithfulness/judge"] == pytest.approx(
        shares(nested_components(cube))["judge"], abs=1e-12
    )
    assert out["var_share/faithfulness/judge"] == pytest.approx(0.0108 / (0.04 + 0.0108), abs=0.04)
    # one judge repeat (or none) and no replicates: nothing to split
    assert variance_metrics(df.drop(columns=["judge_repeat_labels"])) == {}
    # collapse keeps each replicate's repeat labels for the traces
    rep, _ = _judged_table(_simulate(4, 2, 2, seed=1))
    kept = collapse_replicates(rep)["replicates"].iloc[0]
    assert [r["judge_repeat_labels"] for r in kept] == rep.loc[rep["id"] == "q0000", "judge_repeat_labels"].tolist()
