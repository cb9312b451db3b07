"""A typo in a config *key* exits 2 with a "did you mean", like a typo in a value (issue 37)."""

from __future__ import annotations

import pytest

from rag_experiments.run.config_keys import did_you_mean, unknown_config_keys
from tests.sweep_helpers import run_sweep


@pytest.mark.parametrize(
    "argv,line",
    [
        (["retriver=bm25"], "retriver=bm25: unknown key 'retriver' in conf/config.yaml (did you mean 'retriever'?)"),
        (["retriever.kk=3"], "retriever.kk=3: unknown key 'kk' in conf/retriever/dense.yaml (did you mean 'k'?)"),
        (["retriever=bm25", "retriever.k2=1"], "retriever.k2=1: unknown key 'k2' in conf/retriever/bm25.yaml (did you mean"),
        (["+foo.bar=1"], "+foo.bar=1: unknown key 'foo': nothing in conf/config.yaml reads it (keys: corpus,"),
        (["++foo=1"], "++foo=1: unknown key 'foo': nothing in conf/config.yaml reads it"),
        (["racing.batchsize=3"], "racing.batchsize=3: unknown key 'batchsize' in conf/config.yaml (did you mean 'batch_size'?)"),
        (["metrics.kss=[1]"], "metrics.kss=[1]: unknown key 'kss' in conf/config.yaml (did you mean 'ks'?)"),
        (["tracking.ur=x"], "tracking.ur=x: unknown key 'ur' in conf/tracking/sqlite.yaml (did you mean 'uri'?)"),
        (["~retriver"], "~retriver: unknown key 'retriver' in conf/config.yaml (did you mean 'retriever'?)"),
        (["+retriever.k=3"], "+retriever.k=3: retriever.k is already set: drop the + (retriever.k=3)"),
        # a key only one of the swept options has: the job with the other one would not compose
        (["-m", "retriever=dense,bm25", "retriever.method=lucene"],
         "retriever.method=lucene: unknown key 'method' in conf/retriever/dense.yaml"),
        # a key every swept option has but the group's default lacks: Hydra's primary compose fails
        (["-m", "rerank=llm,endpoint", "rerank.base_url=http://x"],
         "rerank.base_url=http://x: rerank is swept, and Hydra first composes a multirun with its default "
         "(rerank=none), which has no base_url: write ++rerank.base_url=http://x to set it in every swept option"),
    ],
)
def test_an_unknown_key_is_named_with_a_suggestion(argv, line):
    problems = unknown_config_keys(argv)
    assert len(problems) == 1 and problems[0].startswith(line), problems


def test_known_keys_sweeps_and_hydra_keys_pass():
    argv = [
        "-m",
        "retriever=bm25",
        "retriever.method=lucene",
        "retriever.k=3,5",
        "metrics.ks=[1,2]",
        "~judge_card.pairs",
        "++retriever.k=4",
        "+experiment=ablate_k",
        "hydra.x=1",  # Hydra's own config: its business
        "+retriever.extra_arg=1",  # a constructor argument: config_schema.known_keys refuses it after composing
        "judge_card.enabled=false",
        "corpus=dir",
        "corpus.path=/data/docs",  # a ??? value: present, though OmegaConf's `in` says it is not
    ]
    assert unknown_config_keys(argv) == []
    assert unknown_config_keys(["-m", "rerank=llm,endpoint", "++rerank.base_url=http://x"]) == []
    assert unknown_config_keys(["rerank=llm,endpoint", "rerank.base_url=http://x"]) == []  # not a multirun
    assert unknown_config_keys(["foo=1", "--config-dir", "/my/conf"]) == []
    assert unknown_config_keys(["foo=1", "-cn=mine"]) == []


def test_did_you_mean():
    assert did_you_mean("retriver", ["retriever", "rerank"]) == " (did you mean 'retriever'?)"
    assert did_you_mean("zzz", ["retriever"]) == ""


def test_a_key_typo_exits_2_through_the_cli_and_creates_nothing(tmp_path):
    """Before: Hydra's ``Key 'retriver' is not in struct`` and exit 1, the exit of a failed gate."""
    p = run_sweep(tmp_path, "retriver=bm25", "retriever.kk=3", check=False)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "unknown key 'retriver' in conf/config.yaml (did you mean 'retriever'?)" in p.stderr
    assert "unknown key 'kk' in conf/retriever/dense.yaml (did you mean 'k'?)" in p.stderr
    assert "not in struct" not in p.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "outputs").exists()


def test_a_constructor_key_typo_after_composition_has_a_suggestion_too():
    """``+retriever.kk=3`` (or a typo in a YAML) composes; the group check refuses it, with a hint."""
    from rag_experiments.run.config_schema import _Group

    g = _Group("retriever", {"_target_": "rag_experiments.stages.retrieval.DenseRetriever", "kk": 3, "embedder": 1})
    g.known_keys()
    assert g.problems == [
        "conf/retriever: kk: unknown option for DenseRetriever (got 3); did you mean 'k'?",
        "conf/retriever: embedder: is set by the sweep, not the config (got 1)",
    ]
