"""A dead generation endpoint under the default ``generation_subset`` and prompts larger than the
local model's window: neither may give a FINISHED run that a re-run then skips."""

from __future__ import annotations

import pytest

from rag_experiments.run.steps import StepRecord, failure_reason
from rag_experiments.run.sweep import run_job
from rag_experiments.tracking.memory import MemoryStore
from rag_experiments.tracking.run_store import MemoryRunStore
from tests.llm_fixtures import requires_smollm2
from tests.sweep_helpers import make_tiny, tiny_job


def test_every_item_failed_counts_the_generated_items_only():
    # the default subset generates 24 of 168 items: 24 errors is every item the step was asked to do
    assert "every one of the 24 generated queries errored" in failure_reason(
        {"retriever": StepRecord("retriever", 168), "generator": StepRecord("generator", 24, 24)}
    )
    assert not failure_reason({"generator": StepRecord("generator", 24, 23)})
    assert not failure_reason({"retriever": StepRecord("retriever", 168)})  # retrieval only


def test_dead_endpoint_with_a_generation_subset_fails_and_is_retried(tmp_path, capsys):
    """In-process through ``run_job`` into the in-memory run store: the pipeline and the resume
    rule are what is checked (``tests/test_run_store.py`` holds the MLflow store to the same rule)."""
    job = tiny_job(
        tmp_path,
        "generator=openai",
        "generator.base_url=http://127.0.0.1:9/v1",
        "generator.timeout_s=1",
        "generator.max_retries=0",
        "generation_subset=2",  # 2 of 6 items generated, as 24 of 168 by default
        "judge=heuristic",
        n_items=6,
    )
    store = MemoryRunStore(MemoryStore(), "test")
    with pytest.raises(SystemExit) as first:
        run_job(job, store)
    err = capsys.readouterr().err
    assert first.value.code != 0, err[-2000:]
    assert "every one of the 2 generated queries errored" in err, err[-2000:]
    (run,) = store.store.runs.values()
    assert run.status == "FAILED"
    assert store.resume_decision(job.chash, run.tags["code_fingerprint"]) == (None, "")  # nothing to reuse
    with pytest.raises(SystemExit):
        run_job(job, store)
    assert "[skip]" not in capsys.readouterr().out and len(store.store.runs) == 2


# -- contexts over the local model's window (chunking=whole) ---------------------------------------


def _prompt():
    from rag_experiments.stages.prompts import PromptTemplate

    return PromptTemplate("t", "Answer from the context.", "Context:\n{context}\n\nQuestion: {question}")


def test_fit_context_keeps_rank_order_and_spans(tmp_path):
    from rag_experiments.core.types import Chunk
    from rag_experiments.stages.context_fit import fit_context

    doc = "abcdefghij" * 300
    chunks = [Chunk(f"c{i}", "d", i * 1000, (i + 1) * 1000, doc[i * 1000 : (i + 1) * 1000]) for i in range(3)]
    count = lambda msgs: sum(len(m["content"]) for m in msgs) // 4  # noqa: E731  (4 characters a token)
    fitted, cut = fit_context(_prompt(), "q?", chunks, 400, count)
    assert cut and 0 < len(fitted) <= 2 and fitted[0] == chunks[0]
    assert count(_prompt().render("q?", fitted)) <= 400
    assert all(doc[c.start : c.end] == c.text for c in fitted)  # still spans of the document
    assert fit_context(_prompt(), "q?", chunks[:1], 4000, count) == (chunks[:1], False)
    with pytest.raises(ValueError, match="generator.ctx_size"):
        fit_context(_prompt(), "q?" * 2000, chunks, 400, count)


@requires_smollm2
def test_whole_documents_over_the_local_window_are_fitted_not_http_400(tmp_path):
    from rag_experiments.core.cache import StageCache
    from rag_experiments.evalset.corpus import Corpus
    from rag_experiments.evalset.load import EvalSet
    from rag_experiments.judge.heuristic import HeuristicJudge
    from rag_experiments.run.pipeline import run_pipeline
    from rag_experiments.run.types import PipelineData, RunSettings, Stages
    from rag_experiments.stages.chunking import WholeDocumentChunker
    from rag_experiments.stages.generation import LocalLlamaGenerator
    from rag_experiments.stages.retrieval import BM25Retriever

    docs, ev = make_tiny(tmp_path, n_items=3)
    corpus = Corpus(str(docs))
    # 4 whole documents at k=3 are ≈ 3,000 tokens: over a 1,024-token slot as `whole` is over 4,096
    gen = LocalLlamaGenerator(ctx_size=1024, n_threads=1, n_parallel=1, max_tokens=16, max_retries=0)

    stages = Stages(
        chunker=WholeDocumentChunker(),
        chunking_cfg={"_target_": "whole"},
        retriever=BM25Retriever(k=3),
        generator=gen,
        prompt=_prompt(),
        judge=HeuristicJudge(),
    )
    data = PipelineData(corpus.docs, corpus.digest, EvalSet(str(ev), corpus).items)
    settings = RunSettings(k=3, ks=(1, 3), n_resamples=20, progress=False)

    def run():
        return run_pipeline(stages, data, settings, StageCache(tmp_path / "cache"))

    res = run()
    df = res.per_query
    assert res.aggregates["n_errors"] == 0, df["error"].tolist()
    assert res.aggregates["n_context_truncated"] == int(df["context_truncated"].sum()) >= 2
    assert df["context"].str.len().max() < 3 * 1024 * 4  # cut: not the whole documents
    again = run()  # the fit is cached: same contexts, answers from the cache
    assert again.per_query["context"].tolist() == df["context"].tolist()
    assert again.calls.get("generation", 0) == 0
