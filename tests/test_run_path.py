"""The typed run path (run_types, assemble) keeps behaviour: the per-query table and aggregates of a
retrieval-only run on the bundled sample equal those recorded before ``run_pipeline`` took
``Stages``/``PipelineData``/``RunSettings`` (21 keyword arguments then)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from rag_experiments.core.cache import StageCache
from rag_experiments.evalset.corpus import Corpus
from rag_experiments.evalset.load import EvalSet, sample_dir
from rag_experiments.run.assemble import build, run_settings
from rag_experiments.run.pipeline import run_pipeline
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages.chunking import MarkdownChunker
from rag_experiments.stages.retrieval import BM25Retriever
from tests.recorded import check
from tests.sweep_helpers import REPO

# Expected values: tests/fixtures/retrieval_digest.json (tests/recorded.py: floats within a
# stated tolerance, BM25's float32 scores included), recorded on 3824cda, where the earlier
# sha256 of the 9-decimal table (f9ebad86…, first recorded with the 21-argument run_pipeline,
# 5f97d8c) and of the aggregates (2ec3de9b…) also passed.


def test_retrieval_only_sample_run_unchanged(tmp_path) -> None:
    d = sample_dir()
    corpus = Corpus(str(d / "docs"))
    evalset = EvalSet(str(d / "evalset.jsonl"), corpus)
    stages = Stages(
        chunker=MarkdownChunker(),
        chunking_cfg={"_target_": "rag_experiments.stages.chunking.MarkdownChunker"},
        retriever=BM25Retriever(k=5),
    )
    settings = RunSettings(k=5, ks=(1, 3, 5, 10), n_resamples=50, progress=False)
    res = run_pipeline(stages, PipelineData.of(corpus, evalset), settings, StageCache(tmp_path))
    assert len(res.per_query) == len(evalset.items) == 168
    drop = [c for c in res.per_query if c.startswith("latency") or c == "search_queries"]
    rows = res.per_query.drop(columns=drop).to_dict(orient="records")
    check("retrieval_digest", rows, {k: v for k, v in res.aggregates.items() if "latency" not in k})
    assert res.per_query["search_queries"].tolist() == [[it.query] for it in evalset.items]


@pytest.mark.parametrize("overrides", [["generator=none"], ["generator=local", "judge=heuristic"]])
def test_config_builds_typed_stages_once(tmp_path, overrides) -> None:
    """``assemble.build`` turns the composed config into Stages (typed fields, no dict look-ups) and
    ``run_settings`` reads the metrics group with the defaults of evaluation.defaults."""
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "rag_experiments" / "conf")):
        cfg = compose("config", overrides=[*overrides, f"cache_dir={tmp_path}"])
    loaded = build(cfg, StageCache(tmp_path))
    st = loaded.stages
    assert st.retriever.embedder is st.embedder  # one embedder, built once
    assert st.generates == (overrides[0] != "generator=none")
    assert (st.prompt is None, st.judge is None) == (not st.generates,) * 2
    assert set(st.identities()) >= {"embedder", "retriever"}
    s = run_settings(cfg)
    assert (s.k, s.ks, s.token_budgets, s.rank_depth) == (5, (1, 3, 5, 10), (256, 512, 1024), 100)
    assert loaded.data.corpus_digest == loaded.corpus.digest and loaded.data.items == loaded.evalset.items


def test_stage_slots_are_declared_once_and_resolve() -> None:
    """``core.slots.SLOTS`` is the one list: each slot's Protocol imports, its config group folder
    exists, ``Stages`` has its field or keeps its stage in ``extra`` (docs/architecture.md, "Add a stage
    slot"), and the derived lists follow it in pipeline order."""
    import dataclasses
    import importlib

    from rag_experiments.core import identity
    from rag_experiments.core.conf_groups import STAGE_GROUPS, conf_dir
    from rag_experiments.core.slots import INPUT_GROUPS, SLOTS
    from rag_experiments.run.types import Stages

    fields = {f.name for f in dataclasses.fields(Stages)}
    for s in SLOTS:
        module, _, name = s.protocol.rpartition(".")
        assert hasattr(importlib.import_module(module), name), s.protocol
        assert (conf_dir() / s.group).is_dir(), s.group
        # a field, or (a slot added by the recipe) its stage kept in ``Stages.extra``: ``stages.<name>``
        assert s.name in fields or getattr(Stages(None, None, extra={s.name: s}), s.name) is s, s.name
        for ns in s.cache:
            assert identity.STAGE_CODE[ns] == s.code
    assert STAGE_GROUPS == (*INPUT_GROUPS, *(s.group for s in SLOTS))
    import yaml

    from rag_experiments.core.conf_groups import GROUPS

    defaults = yaml.safe_load((conf_dir() / "config.yaml").read_text())["defaults"]
    assert set(GROUPS) == {k for d in defaults if isinstance(d, dict) for k in d if not k.startswith("override ")}
    assert [s.group for s in SLOTS][:3] == ["chunking", "embedding", "retriever"]
