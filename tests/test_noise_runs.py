"""Replicated runs end to end: the real SmolLM2 generator on 3 items, a real sqlite MLflow store,
compare / gate reading the long table, and the ``plan`` CLI's bad input."""

from __future__ import annotations

import logging
import math
import re

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from rag_experiments.cli import compare, gate, plan
from rag_experiments.judge.validity import build_judge
from rag_experiments.stages.generation import LocalLlamaGenerator
from tests.sweep_helpers import REPO, tiny_inputs, tiny_pipeline

CONF = REPO / "rag_experiments" / "conf"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("noise_store")
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("noise", artifact_location=str(tmp / "mlruns"))

    def log(name: str, table: pd.DataFrame, digest: str = "e" * 64) -> str:
        rid = client.create_run(exp, run_name=name, tags={"evalset_digest": digest}).info.run_id
        client.log_param(rid, "retriever.k", "3")
        path = tmp / rid / "per_query.parquet"
        path.parent.mkdir()
        table.to_parquet(path)
        client.log_artifact(rid, str(path))
        client.set_terminated(rid)
        return rid

    return uri, log


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    """The same 3 tiny items at temperature 0.8: R=2 and R=1 (replicate 0 comes from the cache)."""
    tiny = tiny_inputs(tmp_path_factory.mktemp("noise_tiny"), n_items=3)
    judge = build_judge("heuristic")
    prompt = instantiate(OmegaConf.load(CONF / "prompt" / "concise.yaml"))
    gen = LocalLlamaGenerator(max_tokens=16, temperature=0.8, n_threads=1, n_parallel=1, poll=0)
    stages = dict(generator=gen, prompt=prompt, judge=judge)
    r2 = tiny_pipeline(tiny, **stages, replicates=2)
    again = tiny_pipeline(tiny, **stages, replicates=2)
    r1 = tiny_pipeline(tiny, **stages)
    return tiny, stages, r2, again, r1


def test_a_replicated_run_is_long_cached_per_replicate_and_logs_noise_metrics(replicated):
    _, _, r2, again, r1 = replicated
    df = r2.per_query
    assert len(df) == 6 and sorted(df.groupby("id")["replicate"].apply(list).iloc[0]) == [0, 1]
    assert set(df["generation_seed"]) == {0, 1}
    assert r2.calls["generation"] == 6 - 0  # 3 items x 2 seeds, each its own cache entry
    assert again.calls.get("generation", 0) == 0 and r1.calls.get("generation", 0) == 0
    # replicate 0 is the unreplicated run's answer (same seed, same cache key)
    rep0 = df[df["replicate"] == 0].set_index("id")["answer"]
    assert rep0.to_dict() == r1.per_query.set_index("id")["answer"].to_dict()
    agg = r2.aggregates
    for key in ("replicate_flip/failure_label", "replicate_flip/correctness"):
        assert 0.0 <= agg[key] <= 1.0
    assert "var_share/answer_relevance/query" in agg and "var_share/answer_relevance/judge" not in agg
    assert agg["n_queries"] == 3 and agg["n_scored/answer_relevance"] == 3  # queries, not rows
    for key in [k for k in agg if not k.startswith(("var_share", "replicate_flip"))]:  # retrieval unchanged
        if key.startswith(("hit_", "mrr", "evidence_recall_at")):
            assert agg[key] == pytest.approx(r1.aggregates[key]), key
    assert "replicate_flip/correctness" not in r1.aggregates


def test_temperature_zero_reuses_replicate_zero_with_a_warning(tmp_path, caplog):
    tiny = tiny_inputs(tmp_path, n_items=2)
    judge = build_judge("heuristic")
    prompt = instantiate(OmegaConf.load(CONF / "prompt" / "concise.yaml"))
    gen = LocalLlamaGenerator(max_tokens=8, temperature=0.0, n_threads=1, n_parallel=1, poll=0)
    with caplog.at_level(logging.WARNING, logger="rag_experiments.run.pipeline"):
        res = tiny_pipeline(tiny, generator=gen, prompt=prompt, judge=judge, replicates=3)
    assert "generator.temperature=0" in caplog.text and "reuse replicate 0" in caplog.text
    assert res.calls["generation"] == 2  # not 6
    df = res.per_query
    assert df.groupby("id")["answer"].nunique().eq(1).all() and len(df) == 6
    assert res.aggregates["replicate_flip/correctness"] == 0.0


def test_compare_and_gate_read_a_replicated_run(replicated, store, capsys):
    _, _, r2, _, r1 = replicated
    uri, log = store
    a, b = log("r1", r1.per_query), log("r2", r2.per_query)
    args = ["--tracking-uri", uri, "--metric", "hit_at_3", "--metric", "answer_relevance"]
    assert compare.main([a, b, *args]) == 0
    out = capsys.readouterr().out
    assert "answer_relevance" in out and "hit_at_3" in out
    code = gate.main(["--baseline", a, "--candidate", b, *args, "--margin", "0.9"])  # 1: no verdict
    out = capsys.readouterr().out
    assert code in (0, 1), out
    row = next(line for line in out.splitlines() if line.startswith("hit_at_3"))
    assert row.split()[-2] == "2"  # paired queries (the unanswerable one has no hit), not rows


def _pilot(q: int, r: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(q):
        base, hit = rng.uniform(0.2, 0.8), float(rng.uniform() < 0.7)
        for rep in range(r):
            rows.append(
                {
                    "id": f"q{i:03d}",
                    "hit_at_3": hit,
                    "mrr": hit * 0.5,
                    "correctness": float(np.clip(base + rng.normal(0, 0.2), 0, 1)),
                    "error": None,
                    "replicate": rep,
                    "generation_seed": rep,
                }
            )
    return pd.DataFrame(rows)


def test_plan_prints_mdes_and_sample_sizes(store, capsys):
    uri, log = store
    rid = log("pilot", _pilot(40, 3))
    assert plan.main(["--pilot", rid, "--tracking-uri", uri, "--effect", "0.05"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("correctness")).split()
    assert row[1:3] == ["40", "3"]
    mde = float(row[5])
    assert 0 < mde < 1 and int(row[6]) > 40  # 0.05 needs more than 40 queries here
    hit = next(line for line in out.splitlines() if line.startswith("hit_at_3")).split()
    assert hit[4] == "0.0000"  # retrieval: no replicate noise


def test_plan_refuses_fewer_than_10_scored_queries(store, capsys):
    uri, log = store
    rid = log("small-pilot", _pilot(9, 2))
    assert plan.main(["--pilot", rid, "--tracking-uri", uri]) == 2
    assert "9 scored queries (< 10)" in capsys.readouterr().err


def test_plan_refuses_a_pilot_of_another_eval_set_naming_both_digests(store, tmp_path, capsys):
    uri, log = store
    rid = log("other-pilot", _pilot(20, 2), digest="a" * 64)
    ev = tmp_path / "evalset.jsonl"
    ev.write_text('{"id": "x", "query": "q?"}\n')
    assert plan.main(["--pilot", rid, "--tracking-uri", uri, "--evalset", str(ev)]) == 2
    err = capsys.readouterr().err
    assert "a" * 64 in err and plan.file_digest(ev) in err
    assert plan.main(["--pilot", rid, "--tracking-uri", uri, "--evalset", "a" * 64]) == 0


def test_judge_repeats_of_a_real_stochastic_judge_give_a_judge_share(tmp_path):
    """judge.repeats=3 with the packaged SmolLM2 as judge at temperature 1 (a real stochastic judge,
    offline): each row keeps every repeat's labels, the run logs var_share/faithfulness/judge from
    them, and the run's faithfulness stays repeat 0's."""

    from rag_experiments.judge.repeats import repeat_scores
    from rag_experiments.judge.validity import judge_config, judge_with_repeats

    tiny = tiny_inputs(tmp_path, n_items=3)
    over = ["temperature=1.0", "use_logprobs=false", "decompose=false", "max_tokens=16", "repeats=3", "n_questions=1", "timeout_s=1200"]
    judge, repeats = judge_with_repeats(judge_config("local", over))
    assert len(repeats) == 2
    prompt = instantiate(OmegaConf.load(CONF / "prompt" / "concise.yaml"))
    gen = LocalLlamaGenerator(max_tokens=24, temperature=0.0, n_threads=1, n_parallel=1, poll=0, timeout_s=1200)
    res = tiny_pipeline(tiny, generator=gen, prompt=prompt, judge=judge, judge_repeats=tuple(repeats))
    df = res.per_query
    assert df["error"].isna().all()
    judged = df[df["judge_repeat_labels"].map(lambda v: isinstance(v, list) and len(v) > 0)]  # answers with at least one claim
    assert len(judged) >= 2
    for _, row in judged.iterrows():
        labels = row["judge_repeat_labels"]
        assert all(len(ls) == 3 for ls in labels)
        scores = repeat_scores(row["judge_repeat_labels"])
        assert len(scores) == 3
        assert scores[0] == pytest.approx(row["faithfulness"], nan_ok=True)  # the run's metric: repeat 0
    agg = res.aggregates
    assert {"var_share/faithfulness/query", "var_share/faithfulness/judge"} <= set(agg)
    assert "var_share/faithfulness/generation" not in agg  # no replicates: no generation share
    flipped = judged["judge_flip_rate"].fillna(0).gt(0).any()
    share = agg["var_share/faithfulness/judge"]
    # a flipped claim moves some repeat's faithfulness: the judge share is then > 0 (or NaN when
    # no query has a scorable claim); without a flip it is exactly 0
    assert (share > 0) if flipped else (share == 0 or math.isnan(share))


def test_plan_says_not_plannable_when_the_pilot_has_no_variance(store, capsys):
    """Issue 37: every answer scoring 0 gave n = 2 for correctness; a zero variance is no estimate."""
    uri, log = store
    flat = _pilot(20, 1).assign(correctness=0.0)
    rid = log("flat-pilot", flat)
    assert plan.main(["--pilot", rid, "--tracking-uri", uri, "--metric", "correctness", "--metric", "mrr"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("correctness"))
    assert "not plannable from this pilot: no variance" in row and not re.search(r"\b2\s*$", row)
    assert "not plannable from this pilot: no variance for correctness" in out
    assert "not plannable" not in next(line for line in out.splitlines() if line.startswith("mrr"))


def test_plan_n_to_select_is_selects_figure_with_the_margin_rule_and_holm(store, capsys):
    """The n select's UNDERPOWERED line prints (analysis.power.n_for_margin): Holm over the K − 1
    comparisons and, at gate's default margin, at least 1/0.15² = 45 queries."""
    from rag_experiments.analysis.power import n_for_margin, paired_variance
    from rag_experiments.analysis.variance import pilot_components

    uri, log = store
    pilot = _pilot(40, 1, seed=3)
    rid = log("pilot-select", pilot)
    assert plan.main(["--pilot", rid, "--tracking-uri", uri, "--metric", "hit_at_3", "--configs", "15"]) == 0
    out = capsys.readouterr().out
    assert "n to select (±0.15, Holm over 14)" in out
    got = int(next(line for line in out.splitlines() if line.startswith("hit_at_3")).split()[-1])
    n, r, vq, vg = pilot_components(pilot, "hit_at_3")
    var_d = paired_variance(vq, vg, 0.5).between
    assert got == n_for_margin(0.15, var_d, 0.05, family=14, default_rule=True) >= 45
    assert got > n_for_margin(0.15, var_d, 0.05, family=1, default_rule=True)  # Holm costs queries


def _hits(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"id": [f"q{i:03d}" for i in range(n)], "hit_at_3": (rng.random(n) < 0.6).astype(float)})


def test_gate_at_n_1_refuses_a_verdict_that_could_not_fail(store, capsys):
    """Issue 37: at n = 1 the default margin is 1, the limit −1.0: GATE PASSED whatever the
    candidate. Now exit 2, naming the n needed (select's and plan's figure)."""
    uri, log = store
    a, b = log("one-a", _hits(1, 0).assign(hit_at_3=1.0)), log("one-b", _hits(1, 0).assign(hit_at_3=0.0))
    assert gate.main(["--baseline", a, "--candidate", b, "--metric", "hit_at_3", "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert "no candidate could fail" in err and "n ≈ 45 queries" in err and "n = 1" in err
    # an explicit margin below 1 is a verdict (the worst case fails)
    code = gate.main(["--baseline", a, "--candidate", b, "--metric", "hit_at_3", "--margin", "0.5", "--tracking-uri", uri])
    assert code == 1


def test_gate_prints_underpowered_first_like_select(store, capsys):
    """n = 12: the default margin 1/√12 = 0.29 passes nearly anything; gate says so first."""
    uri, log = store
    a, b = log("twelve-a", _hits(12, 1)), log("twelve-b", _hits(12, 2))
    code = gate.main(["--baseline", a, "--candidate", b, "--metric", "hit_at_3", "--tracking-uri", uri])
    lines = capsys.readouterr().out.splitlines()
    assert code in (0, 1)
    assert lines[0].startswith("UNDERPOWERED: hit_at_3: this eval set cannot decide the gate")
    assert "the default margin 1/√n = 0.289 is wider than 0.15" in lines[0] and "n ≈ " in lines[0]
    assert "`plan --configs 2` gives the same figure" in lines[0]


def test_human_labels_lead_gate_and_compare_and_their_absence_is_said_first(store, capsys):
    """Issue 37 item 5: with human labels the label-corrected (PPI) faithfulness leads, the
    judge-only figure second with κ beside it; without labels a judge metric says UNVALIDATED first."""
    uri, log = store
    client = MlflowClient(uri)
    rng = np.random.default_rng(5)
    ids = [f"q{i:03d}" for i in range(60)]
    a, b = (
        log(name, pd.DataFrame({"id": ids, "faithfulness": rng.uniform(0.3, 1.0, 60)}))
        for name in ("judged-a", "judged-b")
    )
    for rid in (a, b):
        client.set_tag(rid, "judge_identity", "heuristic-1")
        client.log_param(rid, "judge", "heuristic")
    pair = ["--baseline", a, "--candidate", b, "--metric", "faithfulness", "--tracking-uri", uri]
    gate.main(pair)
    assert capsys.readouterr().out.startswith("UNVALIDATED: faithfulness is the judge's opinion")
    for rid, ppi in ((a, 0.168), (b, 0.25)):
        for key, v in (("ppi_faithfulness", ppi), ("judge_faithfulness", 0.432)):
            client.log_metric(rid, f"spotcheck/{key}", v)
            client.log_metric(rid, f"spotcheck/{key}_ci_low", v - 0.1)
            client.log_metric(rid, f"spotcheck/{key}_ci_high", v + 0.1)
        client.log_metric(rid, "spotcheck/kappa", -0.24)
        client.log_metric(rid, "spotcheck/n", 20)
    gate.main(pair)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("human-corrected faithfulness (PPI, primary) of judged-a")
    assert "0.168 [0.068, 0.268]; judge-only 0.432 [0.332, 0.532] (human κ -0.24 (spot-check, n=20))" in first
    assert compare.main([a, b, "--metric", "faithfulness", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert re.search(r"human-corrected faithfulness \(PPI, primary\) of judged-b \(\w+\): 0.250", out)
    assert "UNVALIDATED" not in out
