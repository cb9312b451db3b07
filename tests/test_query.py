"""The query slot (issue 29): rewrite, HyDE and multi-query on their real code paths, against a real
OpenAI-compatible chat server on 127.0.0.1 that returns fixed completions; the searched texts, the
fusion against a hand computation, the cache (a re-run makes no call; changing only the transform
keeps the chunk and corpus-vector hits), the trace span, the counted fallback and the config checks
(exit 2 naming the key)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rag_experiments.core.cache import CachedEmbedder
from rag_experiments.core.identity import semantic_config
from rag_experiments.run.assemble import build_query_transform, run_settings  # registers ${sample_dir:}
from rag_experiments.run.config_schema import unknown_group_options, validate
from rag_experiments.run.pipeline import run_pipeline
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages.chunking import MarkdownChunker, chunk_corpus
from rag_experiments.stages.embedding import SentenceTransformerEmbedder
from rag_experiments.stages.generation import OpenAICompatibleGenerator
from rag_experiments.stages.query import (
    HydeQuery,
    MultiQuery,
    RewriteQuery,
    parse_rewrite,
    parse_variants,
    rrf_lists,
)
from rag_experiments.stages.retrieval import BM25Retriever, DenseRetriever, exact_search
from tests.llm_fixtures import ChatServer
from tests.sweep_helpers import REPO, make_tiny, run_sweep, sweep_args, tiny_inputs

CONF = str(REPO / "rag_experiments" / "conf")
REWRITTEN = "webhook retry signature"
VARIANTS = "1. refund request window\n2) rate limit headers\n- {question}\n* idempotency key reuse\n4. extra one"


class QueryChat(ChatServer):
    """The reply depends on the model name: ``rewrite`` a fixed query, ``hyde`` the text in
    ``self.passage``, ``multi`` fixed variants (one of them the question itself), ``junk`` list
    markers only, ``empty`` an empty completion. Each reply reports 7 prompt and 3 completion tokens."""

    def __init__(self) -> None:
        self.passage = ""
        super().__init__(self._reply, usage=(7, 3))

    def _reply(self, body: dict) -> str:
        question = body["messages"][-1]["content"].rsplit("Question: ", 1)[1]
        return {
            "rewrite": f"Rewritten query: \"{REWRITTEN}\"\nsome chatter",
            "hyde": f"Passage: {self.passage}",
            "multi": VARIANTS.format(question=question),
            "junk": "1.\n-\n",
            "empty": "",
        }[body["model"]]

    def llm(self, model: str) -> OpenAICompatibleGenerator:
        return OpenAICompatibleGenerator(self.url, model, api_key_env=None, max_retries=0, backoff_s=0.0,
                                         concurrency=2, max_tokens=64)  # fmt: skip


@pytest.fixture
def chat():
    srv = QueryChat()
    yield srv
    srv.close()


def _run(inputs, transform, retriever=None):
    corpus, items, cache = inputs
    stages = Stages(
        chunker=MarkdownChunker(),
        chunking_cfg={"_target_": "rag_experiments.stages.chunking.MarkdownChunker"},
        retriever=retriever or BM25Retriever(k=3),
        query_transform=transform,
    )
    settings = RunSettings(k=3, ks=(1, 3), n_resamples=50, progress=False)
    before = dict(cache.stats)
    res = run_pipeline(stages, PipelineData(corpus.docs, corpus.digest, items), settings, cache)
    return res, {k: v - before.get(k, 0) for k, v in cache.stats.items() if v - before.get(k, 0)}


def _ids(res) -> list[list[str]]:
    return [[r["chunk_id"] for r in x] for x in res.per_query["retrieved"]]


# ----------------------------------------------------------------------------- pure parts


def test_rrf_fusion_by_hand() -> None:
    # c = 60: chunk 1 gets 1/61 + 1/62 = 0.032522, chunk 3 gets 1/63 + 1/61 = 0.032266, chunk 2 1/62
    idx, sc = rrf_lists([np.array([1, 2, 3]), np.array([3, 1, -1])], depth=4, c=60)
    assert idx.tolist() == [1, 3, 2, -1]
    assert sc[:3] == pytest.approx([1 / 61 + 1 / 62, 1 / 63 + 1 / 61, 1 / 62]) and sc[3] == -np.inf
    # a tie is broken by chunk index
    assert rrf_lists([np.array([5, 4]), np.array([4, 5])], depth=2)[0].tolist() == [4, 5]


def test_replies_are_parsed_without_their_markers() -> None:
    assert parse_rewrite("\n  Query: 'refund window'\nmore") == ["refund window"]
    assert parse_rewrite(" \n- \n") == []
    got = parse_variants(VARIANTS.format(question="How do refunds work?"), "how do refunds work", 3)
    assert got == ["refund request window", "rate limit headers", "idempotency key reuse"]
    assert parse_variants("1.\n-\n", "q", 3) == []


# ----------------------------------------------------------------------------- pipeline


def test_rewrite_searches_the_rewritten_query_and_a_rerun_makes_no_call(tmp_path, chat) -> None:
    inputs = tiny_inputs(tmp_path, n_items=6)
    base, _ = _run(inputs, None)
    assert base.per_query["search_queries"].tolist() == [[q] for q in base.per_query["query"]]
    assert "latency_query_s" not in base.per_query and "n_query_errors" not in base.aggregates
    res, stats = _run(inputs, RewriteQuery(chat.llm("rewrite")))
    assert chat.calls == 6 and stats["query.miss"] == 6 and stats.get("chunks.hit") == 1
    assert res.per_query["search_queries"].tolist() == [[REWRITTEN]] * 6
    # the ranking is BM25's for the rewritten text, the same for every question
    corpus = inputs[0]
    chunks = chunk_corpus(MarkdownChunker(), corpus.docs)
    bm25 = BM25Retriever(k=3)
    bm25.index(chunks)
    want = [chunks[i].chunk_id for i in bm25.search([REWRITTEN], 3)[0][0] if i >= 0]  # the table shows 3
    assert all(ids == want for ids in _ids(res)) and _ids(res) != _ids(base)
    # tokens, latency and model calls are counted like the generator's
    assert res.aggregates["tokens_in/query"] == 6 * 7 and res.aggregates["tokens_out/query"] == 6 * 3
    assert res.aggregates["latency_p50_ms/query"] > 0 and res.timings["query_s"] > 0
    assert res.calls["query"] == 6 and res.aggregates["n_query_errors"] == 0
    assert res.per_query["query_error"].isna().all()
    from rag_experiments.evaluation.cost import serving_latency_ms

    served = serving_latency_ms(res.per_query) / 1000 - res.per_query["latency_retrieval_s"]
    assert np.allclose(served, res.per_query["latency_query_s"])
    # a re-run reads every reply, with its seconds and usage, from the cache: no call
    again, stats = _run(inputs, RewriteQuery(chat.llm("rewrite")))
    assert chat.calls == 6 and stats["query.hit"] == 6 and "query.miss" not in stats
    assert again.calls["query"] == 0 and again.aggregates["tokens_in/query"] == 6 * 7
    assert again.per_query["latency_query_s"].tolist() == res.per_query["latency_query_s"].tolist()
    assert _ids(again) == _ids(res)


def test_multi_query_fuses_the_variants_by_rrf(tmp_path, chat) -> None:
    inputs = tiny_inputs(tmp_path, n_items=5)
    res, _ = _run(inputs, MultiQuery(chat.llm("multi"), n=3))
    variants = ["refund request window", "rate limit headers", "idempotency key reuse"]
    assert res.per_query["search_queries"].tolist() == [[q, *variants] for q in res.per_query["query"]]
    # by hand: each text ranked by BM25 to depth 100, then sum 1 / (60 + rank)
    chunks = chunk_corpus(MarkdownChunker(), inputs[0].docs)
    bm25 = BM25Retriever(k=3)
    bm25.index(chunks)
    for q, ids in zip(res.per_query["query"], _ids(res), strict=True):
        lists = bm25.search([q, *variants], 100)[0]
        score: dict[int, float] = {}
        for row in lists:
            for r, i in enumerate(row):
                if i >= 0:
                    score[int(i)] = score.get(int(i), 0.0) + 1 / (60 + r + 1)
        best = sorted(score, key=lambda i: (-score[i], i))[:3]  # the table shows max(ks) = 3 ranks
        assert ids == [chunks[i].chunk_id for i in best]
    # without the question the fused lists are the variants' alone: the same for every question
    alone, _ = _run(inputs, MultiQuery(chat.llm("multi"), n=3, include_original=False))
    assert len({tuple(x) for x in _ids(alone)}) == 1 and chat.calls == 5  # the same replies, cached


def test_hyde_embeds_the_hypothetical_answer_and_its_mix_with_the_question(tmp_path, chat) -> None:
    inputs = tiny_inputs(tmp_path, n_items=5)
    corpus, items, cache = inputs
    chunks = chunk_corpus(MarkdownChunker(), corpus.docs)
    target = max((c for c in chunks if len(c.text) < 900), key=lambda c: len(c.text))  # under the reply cap
    chat.passage = " ".join(target.text.split())
    emb = CachedEmbedder(SentenceTransformerEmbedder(show_progress=False), cache)
    rewrite, _ = _run(inputs, RewriteQuery(chat.llm("rewrite")), DenseRetriever(emb, k=3))
    # answer alone (w = 0): every question's top chunk is the one the "answer" copies
    res, stats = _run(inputs, HydeQuery(chat.llm("hyde"), query_weight=0.0), DenseRetriever(emb, k=3))
    assert stats.get("chunks.hit") == 1 and stats.get("vectors_mm.hit") and "vectors_mm.miss" not in stats
    assert stats["query.miss"] == 5  # only the transform is recomputed, not chunking or the corpus
    assert all(ids[0] == target.chunk_id for ids in _ids(res))
    assert res.per_query["search_queries"].tolist() == [[chat.passage]] * 5
    # mixed (w = 0.5): normalise(0.5 E(q) + 0.5 E(answer)), computed here independently
    mixed, _ = _run(inputs, HydeQuery(chat.llm("hyde"), query_weight=0.5), DenseRetriever(emb, k=3))
    assert chat.calls == 5 + 5  # rewrite's 5, hyde's 5: the mix reuses hyde's cached replies
    assert mixed.per_query["search_queries"].tolist() == [[q, chat.passage] for q in mixed.per_query["query"]]
    q = emb.encode([it.query for it in items], kind="query")
    a = emb.encode([chat.passage], kind="passage")[0]
    v = 0.5 * q + 0.5 * a
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    m = emb.encode([c.text for c in chunks], kind="passage")
    want = exact_search(v.astype(np.float32), m, 3)[0]
    assert _ids(mixed) == [[chunks[i].chunk_id for i in row] for row in want]
    assert _ids(mixed) != _ids(res)
    # BM25 has no vectors: it searches the question and the answer as one text
    bm, _ = _run(inputs, HydeQuery(chat.llm("hyde"), query_weight=0.5))
    bm25 = BM25Retriever(k=3)
    bm25.index(chunks)
    texts = [f"{it.query}\n\n{chat.passage}" for it in items]
    assert _ids(bm) == [[chunks[i].chunk_id for i in row if i >= 0] for row in bm25.search(texts, 3)[0]]


def test_an_unusable_reply_is_counted_and_the_question_is_searched(tmp_path, chat) -> None:
    inputs = tiny_inputs(tmp_path, n_items=4)
    base, _ = _run(inputs, None)
    for model, transform, why in (
        ("junk", MultiQuery, "unparseable reply '1.\\n-\\n'"),
        ("empty", RewriteQuery, "model call failed: failed after 1 attempts: Retryable: empty completion"),
        ("junk", HydeQuery, None),  # a hypothetical answer may be any text: "1. -" is one
    ):
        res, stats = _run(inputs, transform(chat.llm(model)))
        if why is None:
            assert res.aggregates["n_query_errors"] == 0
            continue
        assert res.aggregates["n_query_errors"] == 4, model
        assert res.per_query["query_error"].str.contains(why, regex=False).all(), res.per_query["query_error"][0]
        assert res.per_query["search_queries"].tolist() == [[q] for q in res.per_query["query"]]
        assert _ids(res) == _ids(base)  # the question, searched as it is
        assert "query.hit" not in stats  # failures are not cached: a re-run asks again
        calls = chat.calls
        _run(inputs, transform(chat.llm(model)))
        assert chat.calls == calls + 4


def test_trace_has_a_query_span_before_retrieve() -> None:
    from rag_experiments.core.types import EvalItem
    from rag_experiments.tracking.mlflow_adapter import to_spans
    from rag_experiments.tracking.traces import build_spans

    retrieved = [{"chunk_id": "d#0-5", "doc_id": "d", "start": 0, "end": 5, "score": 1.0, "rank": 1}]
    row = {
        "id": "q1", "retrieved": json.dumps(retrieved), "search_queries": ["q?", "variant"],
        "latency_query_s": 0.2, "latency_retrieval_s": 0.1, "query_error": None,
        "tokens_in_query": 7.0, "tokens_out_query": 3.0,
    }  # fmt: skip
    item = EvalItem(id="q1", query="q?", gold_spans=[], tags=[])
    specs, end = build_spans(row, item, {"d": "hello world"}, 0, 1)
    spans = {s.name: s for s in to_spans(specs)}
    assert spans["query"].span_type == "LLM" and spans["query"].outputs == {"search_queries": ["q?", "variant"]}
    assert spans["query"].start_time_ns == 0 and spans["query"].end_time_ns == int(0.2e9)
    assert spans["retrieve"].start_time_ns == int(0.2e9) and end == int(0.3e9)
    assert spans["retrieve"].inputs["search_queries"] == ["q?", "variant"]
    plain = {k: v for k, v in row.items() if k not in ("latency_query_s", "query_error")}
    assert "query" not in {s.name for s in to_spans(build_spans(plain, item, {"d": "x"}, 0, 1)[0])}


# ----------------------------------------------------------------------------- config


def _cfg(*overrides: str) -> dict:
    with initialize_config_dir(version_base="1.3", config_dir=CONF):
        cfg = compose("config", overrides=["generator=none", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def test_query_none_is_not_in_config_hash_and_each_option_builds(tmp_path, chat) -> None:
    none = _cfg()
    assert none["query"] == {"name": "none"} and "query" not in semantic_config(none)
    # a sweep -m query=none,hyde +generator@query.llm=local: none calls no model, its hash is plain none's
    shared = _cfg("+generator@query.llm=local")
    assert "llm" in shared["query"] and validate(shared) == [] and semantic_config(shared) == semantic_config(none)
    own = ["+generator@query.llm=openai", f"query.llm.base_url={chat.url}", "query.llm.model=multi",
           "query.llm.api_key_env=null"]  # fmt: skip
    for option, cls in (("rewrite", RewriteQuery), ("hyde", HydeQuery), ("multi_query", MultiQuery)):
        cfg = _cfg(f"query={option}", *own)
        assert validate(cfg) == [], option
        assert semantic_config(cfg)["query"]["_target_"].endswith(cls.__name__)
        with initialize_config_dir(version_base="1.3", config_dir=CONF):
            node = compose("config", overrides=["generator=none", f"query={option}", *own])
            built = build_query_transform(node.query, None)
            assert run_settings(node).pricing["query"] is None
        assert isinstance(built, cls) and built.llm.base_url == chat.url
        assert json.loads(built.identity)["query"] == cls.kind
    # with a generator and no llm of its own, the transform calls the generator
    gen = chat.llm("rewrite")
    with initialize_config_dir(version_base="1.3", config_dir=CONF):
        built = build_query_transform(compose("config", overrides=["query=rewrite"]).query, gen)
    assert built.llm is gen and validate(_cfg("query=rewrite", "generator=openai",
                                              "generator.api_key_env=null")) == []  # fmt: skip
    # identity: the mix weight changes the config, not the cached replies
    a, b = HydeQuery(gen, query_weight=0.0), HydeQuery(gen, query_weight=0.5)
    assert a.identity != b.identity and a.llm_identity == b.llm_identity


def test_bad_query_input_names_the_key(tmp_path) -> None:
    assert validate(_cfg("query=hyde")) == [
        "conf/query: llm: missing: with generator=none the transform needs a chat model of its own "
        "(e.g. +generator@query.llm=local, or +generator@query.llm=openai query.llm.model=...)"
    ]
    own = ["+generator@query.llm=openai", "query.llm.api_key_env=null"]
    assert validate(_cfg("query=multi_query", *own, "query.n=0")) == ["conf/query: n: must be an integer >= 1 (got 0)"]
    assert validate(_cfg("query=hyde", *own, "query.query_weight=2")) == [
        "conf/query: query_weight: must be a number in [0, 1] (got 2)"
    ]
    assert validate(_cfg("query=multi_query", *own, "query.prompt='rewrite {question}'")) == [
        "conf/query: prompt: must be a string containing {question} and {n} (got 'rewrite {question}')"
    ]
    assert validate(_cfg("query=rewrite", *own, "query.llm.base_url=ftp://x"))[0].startswith(
        "conf/query: llm.base_url: must be an http(s) URL"
    )
    assert validate(_cfg("query=rewrite", *own, "+query.temperature=1")) == [
        "conf/query: temperature: unknown option for RewriteQuery (got 1)"
    ]
    assert unknown_group_options(["query=step_back"])[0].startswith("conf/query: unknown option 'step_back'")
    # end to end: exit 2 before any run, naming the key
    docs, ev = make_tiny(tmp_path)
    p = run_sweep(tmp_path, *sweep_args(tmp_path, docs, ev), "generator=none", "query=hyde", check=False)
    assert p.returncode == 2 and "conf/query: llm: missing" in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "mlruns").exists()


def test_query_and_llm_rerank_prompts_are_registered_like_answer_prompts(tmp_path, chat) -> None:
    """rag-experiments.query.<kind> and rag-experiments.rerank.llm in a real sqlite store: by content
    (the same text twice is one version, an edited text a new one), linked to the run."""
    from mlflow.tracking import MlflowClient

    from rag_experiments.stages.query import MULTI_QUERY_PROMPT
    from rag_experiments.stages.rerank import LLMReranker
    from rag_experiments.tracking import prompt_registry as pr

    pr._registered.clear()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.create_experiment("prompts")

    def stages(transform) -> Stages:
        return Stages(chunker=MarkdownChunker(), retriever=BM25Retriever(k=3), query_transform=transform,
                      reranker=LLMReranker(chat.url, "m"))  # fmt: skip

    refs = pr.register_stage_prompts(client, exp, stages(MultiQuery(chat.llm("multi"))))
    assert refs == [("rag-experiments.query.multi_query", 1), ("rag-experiments.rerank.llm", 1)]
    text = client.get_prompt_version(*refs[0]).template
    assert "{{question}}" in text and "{{n}}" in text and "{question}" not in text.replace("{{question}}", "")
    assert "{{passage}}" in client.get_prompt_version(*refs[1]).template
    pr._registered.clear()  # another process: the store, not the memo, says the text is there
    assert pr.register_stage_prompts(client, exp, stages(MultiQuery(chat.llm("multi")))) == refs
    edited = MultiQuery(chat.llm("multi"), prompt=MULTI_QUERY_PROMPT + " Keep each under ten words.")
    assert pr.register_stage_prompts(client, exp, stages(edited))[0] == ("rag-experiments.query.multi_query", 2)
    run = client.create_run(exp).info.run_id
    for ref in refs:
        pr.link_run(client, run, *ref)
    assert set(pr.linked_prompts(client, run)) == set(refs)
    assert pr.stage_prompts(Stages(chunker=MarkdownChunker(), retriever=BM25Retriever(k=3))) == []


def test_a_sweep_logs_the_searched_queries_the_span_and_the_prompt(tmp_path, chat) -> None:
    """End to end through ``python -m rag_experiments.sweep`` (retrieval only, the transform's own
    model a real chat server on 127.0.0.1): the run's table holds ``search_queries``, each trace a
    ``query`` span, the prompt is registered and linked to the run, and ``query=none`` in the same
    sweep shares the ``query.llm`` override without calling it."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from rag_experiments.tracking.prompt_registry import linked_prompts
    from rag_experiments.tracking.runs import load_per_query

    docs, ev = make_tiny(tmp_path, n_items=4)
    run_sweep(
        tmp_path, "-m", *sweep_args(tmp_path, docs, ev), "generator=none", "retriever=bm25", "query=none,rewrite",
        "+generator@query.llm=openai", f"query.llm.base_url={chat.url}", "query.llm.model=rewrite",
        "query.llm.api_key_env=null",
    )  # fmt: skip
    assert chat.calls == 4  # rewrite's 4 questions; none called nothing
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("test").experiment_id
    runs = {r.data.params.get("query"): r for r in client.search_runs([exp], "attributes.status = 'FINISHED'")}
    table = load_per_query(client, runs["rewrite"])
    assert [list(x) for x in table["search_queries"]] == [[REWRITTEN]] * 4
    assert [list(x) for x in load_per_query(client, runs["none"])["search_queries"]] == [[q] for q in table["query"]]
    assert runs["rewrite"].data.metrics["n_query_errors"] == 0 and runs["rewrite"].data.metrics["tokens_in/query"] == 28
    assert ("rag-experiments.query.rewrite", 1) in linked_prompts(client, runs["rewrite"].info.run_id)
    assert linked_prompts(client, runs["none"].info.run_id) == []
    mlflow.set_tracking_uri(client.tracking_uri)
    traces = mlflow.search_traces(locations=[exp], run_id=runs["rewrite"].info.run_id, return_type="list")
    spans = [{s.name: s for s in t.data.spans} for t in traces]
    assert len(spans) == 4 and all(s["query"].outputs == {"search_queries": [REWRITTEN]} for s in spans)


def test_a_reply_cut_at_the_models_cap_is_said_not_searched_silently(tmp_path, caplog):
    """Issue 42 (12): a query model that ignores max_tokens has its reply cut at max_answer_chars;
    the query step says how many were cut instead of searching the head alone in silence."""
    import logging

    from rag_experiments.core.cache import StageCache
    from rag_experiments.core.types import Generation
    from rag_experiments.run.query_stage import query_stage
    from rag_experiments.stages.query import RewriteQuery

    class Rambling:
        identity, model, concurrency, max_answer_chars = "rambling", "rambling", 1, 40

        def generate(self, prompts):
            return [Generation("webhook retry schedule " * 2, "rambling", truncated=True) for _ in prompts]

    with caplog.at_level(logging.WARNING, logger="rag_experiments.run.query_stage"):
        q = query_stage(RewriteQuery(Rambling()), ["how long do webhooks retry", "rate limits"], StageCache(tmp_path))
    assert q.outputs[0] and "2 of 2 replies cut at the model's max_answer_chars=40" in caplog.text
