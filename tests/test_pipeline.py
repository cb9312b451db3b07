"""The full pipeline (retrieve → generate → judge) on a tiny corpus with real models.

Real MiniLM, the real llama.cpp server with the packaged SmolLM2, the heuristic judge; the only
fake is a dead endpoint for the fault case. Checks what the stage cache promises: an identical
re-run calls no model, a prompt change re-runs no retrieval, a k change re-runs no search.
"""

from __future__ import annotations

import io
import math
import socket
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rag_experiments.core.cache import CachedEmbedder, StageCache
from rag_experiments.core.progress import Progress, eta_s, timing_table
from rag_experiments.core.types import EvalItem
from rag_experiments.evalset.corpus import Corpus
from rag_experiments.evalset.load import EvalSet
from rag_experiments.evalset.subset import stratified_subset
from rag_experiments.evaluation.labels import RATE_LABELS as FAILURE_LABELS
from rag_experiments.judge.validity import build_judge
from rag_experiments.run.pipeline import run_pipeline
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages.chunking import MarkdownChunker
from rag_experiments.stages.embedding import SentenceTransformerEmbedder
from rag_experiments.stages.generation import LocalLlamaGenerator, OpenAICompatibleGenerator
from rag_experiments.stages.retrieval import DenseRetriever
from tests.llm_fixtures import requires_smollm2
from tests.sweep_helpers import make_tiny

CONF = Path(__file__).resolve().parent.parent / "rag_experiments" / "conf"


def _prompt(name: str):
    return instantiate(OmegaConf.load(CONF / "prompt" / f"{name}.yaml"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe")
    docs, ev = make_tiny(root, n_items=4)
    corpus = Corpus(str(docs))
    items = EvalSet(str(ev), corpus).items
    cache = StageCache(root / "cache")
    embedder = CachedEmbedder(SentenceTransformerEmbedder(show_progress=False), cache)
    judge = build_judge("heuristic")  # conf/judge/heuristic.yaml
    return corpus, items, cache, embedder, judge


def _run(setup, generator, prompt="concise", k=3, generation_subset=None):
    corpus, items, cache, embedder, judge = setup
    chunker = MarkdownChunker()
    stages = Stages(
        chunker=chunker,
        chunking_cfg={"_target_": "rag_experiments.stages.chunking.MarkdownChunker"},
        retriever=DenseRetriever(embedder, k=k),
        generator=generator,
        prompt=_prompt(prompt),
        judge=judge,
    )
    settings = RunSettings(
        k=k, ks=(1, 3, 5), n_resamples=200, progress=False, generation_subset=generation_subset
    )
    return run_pipeline(stages, PipelineData(corpus.docs, corpus.digest, items), settings, cache)


@requires_smollm2
def test_full_pipeline_then_cache_reuse(setup):
    gen = LocalLlamaGenerator(max_tokens=48, extra_body={"repeat_penalty": 1.15})
    first = _run(setup, gen)
    df = first.per_query
    n = len(df)
    assert first.calls["retrieval"] == 1 and first.calls["generation"] == n
    assert df["answer"].str.len().gt(0).all() and df["error"].isna().all()
    for col in (
        "faithfulness",
        "answer_relevance",
        "correctness",
        "failure_label",
        "claims",
        "verdicts",
        "context",
        "latency_generation_s",
        "latency_judge_s",
    ):
        assert col in df, col
    assert set(df["failure_label"]) <= set(FAILURE_LABELS)
    # retrieval and generation are reported side by side, never blended
    agg = first.aggregates
    for key in ("hit_at_3", "mrr", "faithfulness", "answer_relevance", "correctness", "rate_ok", "n_errors"):
        assert key in agg, key
    assert sum(agg[f"rate_{lab}"] for lab in FAILURE_LABELS) == pytest.approx(1.0)
    unanswerable = df[df["gold_spans"].map(len) == 0]
    assert len(unanswerable) == 1 and math.isnan(unanswerable["hit_at_3"].iloc[0])
    # claim-level diagnostics: NaN with a reason for the unanswerable item, proportions elsewhere
    diag = ["claim_recall", "context_utilization", "hallucination", "self_knowledge"]
    assert unanswerable[diag].isna().all(axis=None)
    assert "unanswerable item" in unanswerable["diagnostics_nan_reason"].iloc[0].values()
    answerable = df[df["gold_spans"].map(len) > 0]
    assert answerable["claim_recall"].between(0, 1).all() and first.calls["judge_diagnostic_verdicts"] > 0
    assert agg["n_scored/claim_recall"] == len(answerable) and "claim_recall_ci_high" in agg
    assert df["tokens_in_judge"].isna().all()  # heuristic judge: no model call, no tokens (not 0)

    again = _run(setup, gen)  # identical re-run: no model is called at all
    assert not any(again.calls.values()), again.calls
    assert again.per_query["answer"].tolist() == df["answer"].tolist()
    pd.testing.assert_frame_equal(again.per_query[diag], df[diag])  # diagnostics from the cache

    other_prompt = _run(setup, gen, prompt="cite")  # prompt change: generation only
    assert other_prompt.calls.get("retrieval", 0) == 0 and other_prompt.calls["generation"] == n

    other_k = _run(setup, gen, k=5)  # same search depth (max of ks and k): no new search
    assert other_k.calls.get("retrieval", 0) == 0

    # generation on a subset: retrieval metrics unchanged on every item, generation means and label
    # rates over the subset only (one denominator), the rest labelled by retrieval alone
    part = _run(setup, gen, generation_subset=2)
    pq, agg2 = part.per_query, part.aggregates
    assert part.n_generated == 2 and agg2["n_generated"] == 2 and not any(part.calls.values())
    assert pq["generated"].sum() == 2
    for key in ("faithfulness", "correctness", "rate_ok"):
        assert agg2[f"n_scored/{key}"] == 2, key
    assert sum(agg2[f"rate_{lab}"] for lab in FAILURE_LABELS) == pytest.approx(1.0)
    assert agg2["n_scored/hit_at_3"] == agg["n_scored/hit_at_3"] and agg2["mrr"] == agg["mrr"]
    assert set(pq.loc[~pq["generated"], "failure_label"]) <= {"retrieved", "retrieval_failure"}
    same = pq["generated"].to_numpy()
    assert pq.loc[same, "answer"].tolist() == df.loc[same, "answer"].tolist()


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: connections are refused


def test_unreachable_endpoint_is_counted_as_errors_and_the_run_goes_on(setup):
    gen = OpenAICompatibleGenerator(
        base_url=f"http://127.0.0.1:{_dead_port()}/v1", model="x", max_retries=1, backoff_s=0.01, timeout_s=2
    )
    res = _run(setup, gen)
    df = res.per_query
    assert df["error"].notna().all()
    assert res.aggregates["n_errors"] == len(df)
    assert set(df["failure_label"]) == {"error"}
    assert res.aggregates["rate_ok"] == 0.0
    assert "faithfulness" not in res.aggregates or math.isnan(res.aggregates["faithfulness"])


def _item(i: int, tags: tuple[str, ...]) -> EvalItem:
    return EvalItem(id=f"q{i}", query=f"q{i}", gold_spans=[], tags=list(tags))


def test_stratified_subset_is_fixed_proportional_and_keeps_rare_tags():
    items = [_item(i, ("exact",)) for i in range(60)]
    items += [_item(60 + i, ("paraphrase", "exact")) for i in range(30)]
    items += [_item(90 + i, ("unanswerable",)) for i in range(3)]
    sub = stratified_subset(items, 10)
    assert sub == stratified_subset(items, 10) and sub == sorted(set(sub)) and len(sub) == 10
    strata = Counter(items[i].tags[0] for i in sub)
    # rarest tag first: each stratum gets a share; the 3-item unanswerable stratum is not dropped
    assert strata["unanswerable"] >= 1 and strata["paraphrase"] == 3 and strata["exact"] == 6
    assert stratified_subset(items, None) == list(range(len(items)))
    assert stratified_subset(items, 500) == list(range(len(items)))
    with pytest.raises(ValueError, match="generation_subset"):
        stratified_subset(items, 0)


def test_progress_prints_a_line_per_tenth_with_eta_when_not_a_tty():
    out = io.StringIO()
    with Progress("generation", 20, stream=out, unit="answers") as bar:
        for _ in range(20):
            bar.update()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[generation] started: 20 answers"
    assert lines[-1].startswith("[generation] done: 20 answers")
    ticks = [ln for ln in lines[1:-1]]
    assert len(ticks) == 9 and all("ETA" in ln for ln in ticks), lines
    assert ticks[0].startswith("[generation] 2/20 (10%)")
    quiet = io.StringIO()
    with Progress("generation", 20, enabled=False, stream=quiet) as bar:
        bar.update(20)
    assert quiet.getvalue() == ""
    assert eta_s(5, 20, 10.0) == pytest.approx(30.0) and eta_s(0, 20, 1.0) is None


def test_timing_table_lists_stages_in_pipeline_order_with_shares():
    table = timing_table({"judging_s": 5.0, "retrieval_s": 15.0, "total_s": 40.0, "generation_s": 20.0})
    names = [ln.split()[0] for ln in table.splitlines()[1:]]
    assert names == ["retrieval", "generation", "judging", "total"]
    assert "50.0%" in table.splitlines()[2]
