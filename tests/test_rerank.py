"""The rerank slot (issue 29): rerankers on their real code paths (MiniLM from its package, a tiny
randomly initialised cross-encoder built in a temp dir, a real HTTP server on 127.0.0.1), the
pipeline's first-stage / final attribution, the cache hits when only the reranker changes, the
config checks (exit 2 naming the key) and hybrid fusion as a factor."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rag_experiments.core.cache import CachedEmbedder, StageCache
from rag_experiments.core.identity import semantic_config
from rag_experiments.evaluation.registry import parse
from rag_experiments.run.assemble import build_reranker  # also registers ${sample_dir:}
from rag_experiments.run.config_schema import unknown_group_options, validate
from rag_experiments.run.pipeline import run_pipeline
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages.chunking import MarkdownChunker
from rag_experiments.stages.embedding import SentenceTransformerEmbedder, minilm_path
from rag_experiments.stages.rerank import (
    CrossEncoderReranker,
    DenseReranker,
    EndpointReranker,
    RerankError,
    is_cross_encoder,
    rerank_order,
)
from rag_experiments.stages.retrieval import BM25Retriever, HybridRetriever, minmax, rrf_fuse, weighted_fuse
from tests.http_fakes import FakeHTTP, Reply, Request
from tests.llm_fixtures import ChatServer
from tests.sweep_helpers import REPO, make_tiny, run_sweep, sweep_args, tiny_inputs

CONF = str(REPO / "rag_experiments" / "conf")


# ----------------------------------------------------------------------------- pure parts


def test_rerank_order_sorts_the_head_and_keeps_the_tail() -> None:
    first = np.array([7, 3, 9, 4, 1, -1])
    # candidates 7, 3, 9 re-scored; 3 and 9 tie: first-stage order (3 before 9); the tail stays
    assert rerank_order(first, np.array([0.1, 0.5, 0.5])).tolist() == [3, 9, 7, 4, 1, -1]
    assert rerank_order(first, np.array([])).tolist() == first.tolist()


def test_weighted_fusion_by_hand() -> None:
    dense = np.array([[0, 1, 2]])
    d_sc = np.array([[0.9, 0.5, 0.1]])  # minmax: 1, 0.5, 0
    bm25 = np.array([[2, 3, -1]])
    b_sc = np.array([[8.0, 4.0, -np.inf]])  # minmax: 1, 0 (the pad is not a result)
    idx, sc = weighted_fuse([dense, bm25], [d_sc, b_sc], [0.25, 0.75], n_items=5, k=5)
    # 0: .25*1 = .25; 1: .25*.5 = .125; 2: .25*0 + .75*1 = .75; 3: .75*0 = 0; 4: never reached
    assert idx[0].tolist()[:4] == [2, 0, 1, 3]
    assert np.allclose(sc[0][:4], [0.75, 0.25, 0.125, 0.0])
    assert sc[0][4] == -np.inf
    assert minmax(np.array([[3.0, 3.0]]), np.array([[True, True]])).tolist() == [[1.0, 1.0]]


def test_fusion_in_query_blocks_equals_one_matrix() -> None:
    # 1,190 queries × 1M chunks in one float64 matrix is 9.5 GB: fusion runs on blocks of queries;
    # rows are independent, so any block size gives the same rankings, ties and pads included
    rng = np.random.default_rng(3)
    n_q, n_items, depth = 37, 60, 8
    lists = [np.stack([rng.permutation(n_items)[:depth] for _ in range(n_q)]) for _ in range(2)]
    lists[1][::5, -2:] = -1  # short lists (fewer chunks than candidates)
    scores = [np.sort(rng.integers(0, 4, (n_q, depth)).astype(float), axis=1)[:, ::-1] for _ in range(2)]
    scores[1][lists[1] < 0] = -np.inf
    for max_cells in (1, n_items * 4, n_items * 7 + 3):
        whole = rrf_fuse(lists, [1.0, 0.5], n_items, k=12)
        blocked = rrf_fuse(lists, [1.0, 0.5], n_items, k=12, max_cells=max_cells)
        assert all(np.array_equal(a, b) for a, b in zip(whole, blocked, strict=True))
        whole = weighted_fuse(lists, scores, [0.3, 0.7], n_items, k=12)
        blocked = weighted_fuse(lists, scores, [0.3, 0.7], n_items, k=12, max_cells=max_cells)
        assert all(np.array_equal(a, b) for a, b in zip(whole, blocked, strict=True))
    assert blocked[0].shape == (n_q, 12)


def test_hybrid_rrf_keeps_its_identity_and_weighted_changes_it() -> None:
    class E:
        identity = "e"

    rrf = HybridRetriever(E())
    assert "fusion" not in rrf.identity  # rrf rankings computed before fusion existed stay cached
    assert HybridRetriever(E(), fusion="weighted", alpha=0.3).identity != rrf.identity
    with pytest.raises(ValueError, match="retriever.fusion"):
        HybridRetriever(E(), fusion="max")


def test_first_stage_keys_are_registered() -> None:
    s, params = parse("first_stage/hit_at_5")
    assert s.pattern == "hit_at_{k}" and params["form"] == "first_stage"
    assert parse("latency_rerank_s") is not None


# ----------------------------------------------------------------------------- models


def tiny_cross_encoder(root) -> str:
    """A randomly initialised 2-layer BERT cross-encoder (hidden 32, one label) with MiniLM's
    tokenizer files: the real CrossEncoder code path, no download."""
    from transformers import BertConfig, BertForSequenceClassification

    vocab = (minilm_path() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    cfg = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=1,
    )
    import torch

    torch.manual_seed(0)
    path = root / "tiny-ce"
    BertForSequenceClassification(cfg).save_pretrained(str(path))
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_path() / name, path / name)
    return str(path)


def test_cross_encoder_scores_pairs_and_rejects_a_bi_encoder(tmp_path) -> None:
    path = tiny_cross_encoder(tmp_path)
    assert is_cross_encoder(path) and not is_cross_encoder(minilm_path())
    ce = CrossEncoderReranker(path, candidates=3, batch_size=2, max_length=64)
    out = ce.score(["refund policy", "retry"], [["a refund", "b", "c"], ["retries happen"]])
    assert [len(x) for x in out] == [3, 1] and all(np.isfinite(x).all() for x in out)
    # deterministic (eval mode) and the pair matters: the same text scores differently per query
    again = ce.score(["refund policy"], [["a refund", "b", "c"]])[0]
    assert np.allclose(again, out[0], atol=1e-6)
    # identity: the weights' bytes, not the path
    moved = shutil.copytree(path, tmp_path / "elsewhere")
    assert CrossEncoderReranker(str(moved)).identity == CrossEncoderReranker(path).identity
    with pytest.raises(FileNotFoundError, match="rerank.path: not a cross-encoder"):
        CrossEncoderReranker(str(minilm_path()))


def test_dense_reranker_is_cosine_of_the_bi_encoder(tmp_path) -> None:
    emb = SentenceTransformerEmbedder(show_progress=False)
    r = DenseReranker(CachedEmbedder(emb, StageCache(tmp_path)), candidates=3)
    texts = ["Refunds are issued within 5 days.", "Webhooks retry with backoff.", "Rate limits apply."]
    got = r.score(["how long do refunds take"], [texts])[0]
    q = emb.encode(["how long do refunds take"], kind="query")[0]
    assert np.allclose(got, emb.encode(texts) @ q, atol=1e-5)
    assert int(np.argmax(got)) == 0


# ----------------------------------------------------------------------------- endpoint


class RerankServer:
    """A rerank endpoint (``tests.http_fakes.FakeHTTP``) answering POST /rerank in the Cohere/Jina
    shape: score = how many query words the document contains. ``script``: statuses to answer first
    (503: retry); ``bodies``: (path, body, Authorization) of every request."""

    def __init__(self, script=(), echo_secret: str = "") -> None:
        self.script, self.echo_secret = list(script), echo_secret
        self.http = FakeHTTP(self._reply)
        self.url = self.http.url

    @property
    def calls(self) -> int:
        return len(self.http.requests)

    @property
    def bodies(self) -> list[tuple[str, dict, str | None]]:
        return [(r.path, r.body, r.headers.get("Authorization")) for _, r in self.http.requests]

    def _reply(self, r: Request) -> Reply | dict:
        status = self.script.pop(0) if self.script else 200
        if status != 200:
            msg = f"overloaded; your key was {self.echo_secret}" if self.echo_secret else "overloaded"
            return Reply(status, json.dumps({"error": msg}).encode())
        words = set(r.body["query"].lower().split())
        res = [{"index": i, "relevance_score": float(sum(w in d.lower() for w in words))}
               for i, d in enumerate(r.body["documents"])]  # fmt: skip
        return {"results": sorted(res, key=lambda x: -x["relevance_score"])}

    def close(self):
        self.http.close()


def test_endpoint_reranker_retries_redacts_and_reads_scores_by_index(monkeypatch) -> None:
    monkeypatch.setenv("RERANK_TEST_KEY", "sekrit-value-123456")
    srv = RerankServer(script=[503])
    try:
        r = EndpointReranker(srv.url, model="m", api_key_env="RERANK_TEST_KEY", backoff_s=0.01)
        got = r.score(["refund days"], [["no", "refund within days", "refund"]])[0]
        assert got.tolist() == [0.0, 2.0, 1.0]  # by index, whatever order the reply lists them in
        assert srv.calls == 2  # a 503, then the answer
        path, body, auth = srv.bodies[-1]
        assert path == "/v1/rerank" and body["top_n"] == 3 and body["model"] == "m"
        assert auth == "Bearer sekrit-value-123456"
    finally:
        srv.close()
    srv = RerankServer(script=[400], echo_secret="sekrit-value-123456")
    try:
        r = EndpointReranker(srv.url, api_key_env="RERANK_TEST_KEY", backoff_s=0.01)
        with pytest.raises(RerankError) as e:
            r.score(["q"], [["d"]])
        assert "not retried" in str(e.value) and "sekrit" not in str(e.value) and srv.calls == 1
    finally:
        srv.close()


# ----------------------------------------------------------------------------- pipeline


def _run(inputs, reranker, retriever=None, k: int = 3):
    corpus, items, cache = inputs
    stages = Stages(
        chunker=MarkdownChunker(),
        chunking_cfg={"_target_": "rag_experiments.stages.chunking.MarkdownChunker"},
        retriever=retriever or BM25Retriever(k=k),
        reranker=reranker,
    )
    settings = RunSettings(k=k, ks=(1, 3), n_resamples=50, progress=False)
    before = dict(cache.stats)
    res = run_pipeline(stages, PipelineData(corpus.docs, corpus.digest, items), settings, cache)
    return res, {k_: v - before.get(k_, 0) for k_, v in cache.stats.items() if v - before.get(k_, 0)}


def test_pipeline_attributes_first_stage_and_only_the_reranker_is_recomputed(tmp_path) -> None:
    inputs = tiny_inputs(tmp_path, n_items=8)
    cache = inputs[2]
    emb = CachedEmbedder(SentenceTransformerEmbedder(show_progress=False), cache)
    from rag_experiments.stages.retrieval import DenseRetriever

    base, _ = _run(inputs, None, DenseRetriever(emb, k=3))
    assert not any(c.startswith("first_stage/") for c in base.aggregates)
    dense, stats = _run(inputs, DenseReranker(emb, candidates=10), DenseRetriever(emb, k=3))
    assert stats.get("chunks.hit") == 1 and stats.get("rankings.hit") == 1, stats
    assert stats["rerank.miss"] == 8 and "rankings.miss" not in stats and "chunks.miss" not in stats
    # the first stage is the run without a reranker, metric by metric
    for key in ("hit_at_1", "hit_at_3", "mrr", "hit_at_512tok"):
        assert dense.aggregates[f"first_stage/{key}"] == pytest.approx(base.aggregates[key], nan_ok=True)
    assert (dense.per_query["latency_rerank_s"] > 0).all()
    # select trades it: the serving latency adds the reranker's seconds to retrieval's
    from rag_experiments.evaluation.cost import serving_latency_ms

    served = serving_latency_ms(dense.per_query) - 1000 * dense.per_query["latency_retrieval_s"]
    assert np.allclose(served, 1000 * dense.per_query["latency_rerank_s"])
    assert dense.aggregates["latency_p50_ms/rerank"] > 0
    assert dense.aggregates["n_rerank_errors"] == 0
    # same bi-encoder as the retriever: re-scoring its own top 10 by cosine keeps the top 3
    top3 = [[r["chunk_id"] for r in x[:3]] for x in base.per_query["retrieved"]]
    assert [[r["chunk_id"] for r in x[:3]] for x in dense.per_query["retrieved"]] == top3

    # another reranker: chunks, embedding and the first stage all hit; only reranking runs
    ce = CrossEncoderReranker(tiny_cross_encoder(tmp_path), candidates=10, batch_size=16, max_length=128)
    res, stats = _run(inputs, ce, DenseRetriever(emb, k=3))
    assert stats.get("chunks.hit") == 1 and stats.get("rankings.hit") == 1, stats
    assert stats["rerank.miss"] == 8 and not any(k.startswith("vectors") and "miss" in k for k in stats)
    assert res.cache_keys["rankings"] == dense.cache_keys["rankings"] != None  # noqa: E711
    assert res.cache_keys["rerank"] != dense.cache_keys["rerank"]
    # a rerun reads every query's scores (and their measured seconds) from the cache
    again, stats = _run(inputs, ce, DenseRetriever(emb, k=3))
    assert stats.get("rerank.hit") == 8 and "rerank.miss" not in stats
    assert again.per_query["latency_rerank_s"].tolist() == res.per_query["latency_rerank_s"].tolist()
    assert again.per_query["retrieved"].tolist() == res.per_query["retrieved"].tolist()


def test_bm25_then_endpoint_reranks_the_final_list_and_failures_keep_first_stage(tmp_path) -> None:
    inputs = tiny_inputs(tmp_path, n_items=8)
    base, _ = _run(inputs, None)
    srv = RerankServer()
    try:
        res, _ = _run(inputs, EndpointReranker(srv.url, candidates=10))
        assert srv.calls == 8 and all(len(b["documents"]) == 10 for _, b, _ in srv.bodies)
        first_ids = [r[0]["chunk_id"] for r in base.per_query["retrieved"]]
        top = [r[0] for r in res.per_query["retrieved"]]
        # the generator's and the metrics' list is the reranked one: its top chunk has the most words
        best = [
            max(sum(w in d.lower() for w in b["query"].lower().split()) for d in b["documents"])
            for _, b, _ in srv.bodies
        ]
        assert [t["score"] for t in top] == best
        assert first_ids != [t["chunk_id"] for t in top]
        # the failure label reads the final list's hit@k
        assert (
            (res.per_query["rate_retrieval_failure"] == (res.per_query["hit_at_3"] == 0.0))
            .where(res.per_query["hit_at_3"].notna(), True)
            .all()
        )
    finally:
        srv.close()
    broken = RerankServer(script=[400] * 100)
    try:
        res, stats = _run(inputs, EndpointReranker(broken.url, candidates=10, backoff_s=0.0, model="x"))
        assert res.aggregates["n_rerank_errors"] == 8 and "rerank.hit" not in stats
        assert res.per_query["retrieved"].tolist() == base.per_query["retrieved"].tolist()
        assert res.per_query["rerank_error"].str.contains("HTTP 400").all()
        assert res.per_query["latency_rerank_s"].isna().all()  # no reranker latency to report
    finally:
        broken.close()


# ----------------------------------------------------------------------------- config


def _cfg(*overrides: str) -> dict:
    with initialize_config_dir(version_base="1.3", config_dir=CONF):
        cfg = compose("config", overrides=["generator=none", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def test_rerank_none_is_not_in_config_hash_and_options_are(tmp_path) -> None:
    none, dense = _cfg(), _cfg("rerank=dense")
    assert none["rerank"] == {"name": "none"} and "rerank" not in semantic_config(none)
    assert semantic_config(dense)["rerank"]["candidates"] == 50
    weighted = semantic_config(_cfg("retriever=hybrid", "retriever.fusion=weighted"))
    assert weighted["retriever"]["fusion"] == "weighted"
    assert "fusion" not in semantic_config(_cfg("retriever=hybrid"))["retriever"]
    assert validate(none) == [] and validate(dense) == []
    with initialize_config_dir(version_base="1.3", config_dir=CONF):
        built = build_reranker(compose("config", overrides=["rerank=dense"]).rerank, StageCache(tmp_path))
        assert build_reranker(compose("config").rerank, StageCache(tmp_path)) is None
    assert isinstance(built, DenseReranker) and isinstance(built.embedder, CachedEmbedder)
    assert built.candidates == 50 and json.loads(built.identity)["reranker"] == "dense"


def test_bad_rerank_input_names_the_key(tmp_path) -> None:
    assert validate(_cfg("rerank=dense", "rerank.candidates=3", "retriever.k=5")) == [
        "conf/rerank: candidates: must be >= retriever.k=5, the chunks the reranker keeps (got 3)"
    ]
    probs = validate(_cfg("rerank=cross_encoder", f"rerank.path={minilm_path()}"))
    assert len(probs) == 1 and probs[0].startswith("conf/rerank: path: not a cross-encoder")
    assert validate(_cfg("rerank=endpoint", "rerank.base_url=ftp://x"))[0].startswith(
        "conf/rerank: base_url:"
    )
    assert validate(_cfg("retriever=hybrid", "retriever.fusion=max")) == [
        "conf/retriever: fusion: must be one of rrf, weighted (got 'max')"
    ]
    assert unknown_group_options(["rerank=colbert"])[0].startswith("conf/rerank: unknown option 'colbert'")
    # end to end: exit 2 before any run, naming the key
    docs, ev = make_tiny(tmp_path)
    p = run_sweep(
        tmp_path,
        *sweep_args(tmp_path, docs, ev),
        "generator=none",
        "rerank=dense",
        "rerank.candidates=2",
        "retriever.k=5",
        check=False,
    )
    assert p.returncode == 2 and "conf/rerank: candidates: must be >= retriever.k=5" in p.stderr
    assert not (tmp_path / "mlflow.db").exists() or "test" not in p.stdout


def test_a_run_cut_short_resumes_with_only_the_missing_queries(tmp_path) -> None:
    """The endpoint answers 3 queries, then refuses (as a killed or broken run would leave it): the
    3 answers are committed; the re-run sends only the other 5 and ends with every query reranked."""
    inputs = tiny_inputs(tmp_path, n_items=8)
    srv = RerankServer(script=[200, 200, 200] + [400] * 5)
    try:
        reranker = EndpointReranker(srv.url, candidates=10, backoff_s=0.0)
        first, stats = _run(inputs, reranker)
        assert first.aggregates["n_rerank_errors"] == 5 and stats["rerank.miss"] == 8
        assert srv.calls == 8
        second, stats = _run(inputs, reranker)
        assert stats["rerank.hit"] == 3 and stats["rerank.miss"] == 5
        assert srv.calls == 13 and second.aggregates["n_rerank_errors"] == 0
        third, stats = _run(inputs, reranker)
        assert stats["rerank.hit"] == 8 and srv.calls == 13
        assert third.per_query["retrieved"].tolist() == second.per_query["retrieved"].tolist()
    finally:
        srv.close()


def test_trace_has_a_rerank_span_between_retrieve_and_generate() -> None:
    from rag_experiments.core.types import EvalItem
    from rag_experiments.tracking.mlflow_adapter import to_spans
    from rag_experiments.tracking.traces import build_spans

    retrieved = [{"chunk_id": "d#0-5", "doc_id": "d", "start": 0, "end": 5, "score": 1.0, "rank": 1}]
    row = {
        "id": "q1", "retrieved": retrieved, "answer": "hello", "verdicts": [], "claims": [],
        "latency_retrieval_s": 0.1, "latency_rerank_s": 0.3, "latency_generation_s": 1.0, "latency_judge_s": 0.5,
        "rerank_error": None,
    }  # fmt: skip
    item = EvalItem(id="q1", query="q?", gold_spans=[], tags=[])
    specs, end = build_spans(row, item, {"d": "hello world"}, 0, 1)
    spans = {s.name: s for s in to_spans(specs)}
    assert spans["rerank"].span_type == "RERANKER"
    assert spans["rerank"].start_time_ns == int(0.1e9) and spans["rerank"].end_time_ns == int(0.4e9)
    assert spans["generate"].start_time_ns == int(0.4e9) and end == int(1.9e9)
    no_rerank = {k: v for k, v in row.items() if k not in ("latency_rerank_s", "rerank_error")}
    assert "rerank" not in {s.name for s in to_spans(build_spans(no_rerank, item, {"d": "x"}, 0, 1)[0])}


def test_every_rerank_option_builds_from_its_yaml(tmp_path) -> None:
    """conf/rerank/*.yaml → the reranker class, through the same ``build_reranker`` the sweep uses."""
    ce_path = tiny_cross_encoder(tmp_path)
    with initialize_config_dir(version_base="1.3", config_dir=CONF):
        ce = build_reranker(
            compose("config", overrides=["rerank=cross_encoder", f"rerank.path={ce_path}"]).rerank,
            StageCache(tmp_path),
        )
        ep = build_reranker(
            compose("config", overrides=["rerank=endpoint", "rerank.base_url=http://127.0.0.1:9/v1"]).rerank,
            StageCache(tmp_path),
        )
    assert isinstance(ce, CrossEncoderReranker) and (ce.batch_size, ce.max_length, ce.candidates) == (
        32,
        512,
        50,
    )
    assert isinstance(ep, EndpointReranker) and ep.settings.max_retries == 3 and ep.query_batch == 1
    assert validate(_cfg("rerank=cross_encoder", f"rerank.path={ce_path}")) == []
    from rag_experiments.run.config_schema import ConfigError, check

    with initialize_config_dir(version_base="1.3", config_dir=CONF):
        with pytest.raises(ConfigError) as e:
            check(compose("config", overrides=["generator=none", "rerank=cross_encoder"]))
    assert e.value.problems == ["conf/rerank: path: missing (set rerank.path=...)"]


def _rating(body: dict) -> str:
    """A rater: how many question words the passage contains; the model ``garbage`` replies with
    words only (an unparseable rating)."""
    text = body["messages"][-1]["content"]
    q = text.split("Question: ", 1)[1].split("\n", 1)[0].lower().split()
    passage = text.split("Passage:\n", 1)[1].lower()
    return "no idea" if body["model"] == "garbage" else str(sum(w in passage for w in q))


def test_llm_reranker_rates_pointwise_and_an_unparseable_reply_keeps_first_stage(tmp_path) -> None:
    from rag_experiments.stages.rerank import LLMReranker

    srv = ChatServer(_rating)
    try:
        r = LLMReranker(srv.url, "ok", candidates=3, concurrency=2, backoff_s=0.0)
        got = r.score(["refund days"], [["no", "refund within days", "refund"]])[0]
        assert got.tolist() == [0.0, 2.0, 1.0] and srv.calls == 3
        inputs = tiny_inputs(tmp_path, n_items=4)
        base, _ = _run(inputs, None)
        res, _ = _run(inputs, LLMReranker(srv.url, "ok", candidates=5, backoff_s=0.0))
        assert res.aggregates["n_rerank_errors"] == 0 and srv.calls == 3 + 4 * 5
        top = [x[0]["score"] for x in res.per_query["retrieved"]]
        assert all(float(t).is_integer() for t in top)  # the model's integer ratings, not BM25's
        bad, _ = _run(inputs, LLMReranker(srv.url, "garbage", candidates=5, backoff_s=0.0))
        assert bad.aggregates["n_rerank_errors"] == 4
        assert bad.per_query["rerank_error"].str.contains("unparseable reply 'no idea'").all()
        assert bad.per_query["retrieved"].tolist() == base.per_query["retrieved"].tolist()
    finally:
        srv.close()
    probs = validate(
        _cfg(
            "rerank=llm", "rerank.base_url=http://127.0.0.1:9/v1", "rerank.model=m", "+rerank.prompt=rate it"
        )
    )
    assert probs == ["conf/rerank: prompt: must contain {query} and {passage} (got 'rate it')"]
    from rag_experiments.run.config_schema import ConfigError, check

    with initialize_config_dir(version_base="1.3", config_dir=CONF):
        with pytest.raises(ConfigError) as e:  # generator=none and no endpoint of its own
            check(compose("config", overrides=["generator=none", "rerank=llm"]))
    assert e.value.problems[0].startswith("conf/rerank: base_url: missing (set rerank.base_url=...)")


def test_a_huge_candidate_pool_is_said_before_it_is_paid(caplog):
    """Issue 42 (12): rerank.candidates beyond the chunks reranks every chunk, and the LLM reranker
    makes one call per candidate: both said before the step runs."""
    import logging
    from types import SimpleNamespace

    from rag_experiments.run.retrieval import warn_rerank_cost

    llm = SimpleNamespace(candidates=1_000_000, calls_per_candidate=1)
    with caplog.at_level(logging.WARNING, logger="rag_experiments.run.retrieval"):
        assert warn_rerank_cost(llm, 284, 10) == 284
    assert "exceeds the 284 chunks" in caplog.text and "284 model calls per query (2840 in all" in caplog.text
    caplog.clear()
    assert warn_rerank_cost(SimpleNamespace(candidates=50), 284, 10) == 0 and not caplog.text  # a bi-encoder
