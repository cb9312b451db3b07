"""``embedding=openai`` against real local servers: a ``/v1/embeddings`` server wrapping the
packaged MiniLM (tests/embedding_server.py) and llama.cpp's server in embedding mode on the
packaged SmolLM2 GGUF. Identity is content (the probe's fingerprint), the config check probes
once and names the key, and a sweep ``embedding=minilm,<the MiniLM server>`` gives identical
retrieval metrics."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from rag_experiments.core.cache import CachedEmbedder, StageCache
from rag_experiments.run.config_schema import ConfigError, check
from rag_experiments.run.pipeline import run_pipeline
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages import api_embedding, endpoint
from rag_experiments.stages.api_embedding import (
    EmbeddingEndpointError,
    GiveUp,
    OpenAIEmbedder,
    batches,
    fingerprint,
    parse_embeddings,
)
from rag_experiments.stages.chunking import MarkdownChunker
from rag_experiments.stages.embedding import SentenceTransformerEmbedder
from rag_experiments.stages.retrieval import DenseRetriever
from tests.embedding_server import MiniLMServer, llama_embedding_server
from tests.llm_fixtures import closed_port_url, requires_smollm2, smollm2_path  # noqa: F401 - fixtures
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args, tiny_inputs

MODEL = "all-MiniLM-L6-v2"
TEXTS = [
    "Refunds are returned to the original payment method within 5 business days.",
    "Webhooks are retried with exponential backoff for up to 3 days.",
    "The API allows 100 requests per second per key.",
    "Idempotency keys expire after 24 hours.",
    "",
]


@pytest.fixture(scope="module")
def server():
    s = MiniLMServer()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _fresh_probes():
    api_embedding._PROBES.clear()  # each test probes its own server state
    yield
    api_embedding._PROBES.clear()


def embedder(server, **kw) -> OpenAIEmbedder:
    return OpenAIEmbedder(base_url=server.base_url, model=MODEL, api_key_env=None, **kw)


# -- pure pieces ---------------------------------------------------------------------------------
def test_batches_bound_texts_and_characters_per_request():
    texts = ["a" * 10] * 7
    assert batches(texts, 3, 1000) == [(0, 3), (3, 6), (6, 7)]
    assert batches(texts, 100, 25) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert batches(["x" * 50, "y"], 10, 20) == [(0, 1), (1, 2)]  # an over-long text goes alone
    assert batches([], 3, 10) == []


def test_fingerprint_ignores_scale_and_noise_but_not_another_model():
    rng = np.random.default_rng(0)
    v = rng.normal(size=384)
    assert fingerprint(v) == fingerprint(3 * v)
    noisy = v / np.linalg.norm(v) + 1e-7 * rng.normal(size=384)
    same = sum(fingerprint(noisy * (1 + 1e-9 * i)) == fingerprint(v) for i in range(3))
    assert same >= 2  # 1e-7 noise crosses a 3-decimal boundary rarely; another model always differs
    assert fingerprint(v[::-1]) != fingerprint(v)


def test_a_reply_with_nan_or_the_wrong_count_is_refused():
    ok = json.dumps({"data": [{"index": 1, "embedding": [0.0, 1.0]}, {"index": 0, "embedding": [1.0, 0.0]}],
                     "usage": {"prompt_tokens": 7}}).encode()  # fmt: skip
    vecs, tokens = parse_embeddings(ok, 2)
    assert vecs == [[1.0, 0.0], [0.0, 1.0]] and tokens == 7  # put back in input order
    with pytest.raises(ValueError, match="1 vectors for 2 inputs"):
        parse_embeddings(json.dumps({"data": [{"index": 0, "embedding": [1.0]}]}).encode(), 2)
    with pytest.raises(GiveUp, match="NaN"):
        parse_embeddings(b'{"data": [{"index": 0, "embedding": [NaN, 1.0]}]}', 1)


# -- against the MiniLM server -------------------------------------------------------------------
def test_vectors_equal_local_minilm_and_usage_counts_the_tokens(server):
    local = SentenceTransformerEmbedder(show_progress=False).encode(TEXTS, kind="passage")
    before = endpoint.usage()
    remote = embedder(server, batch_size=2).encode(TEXTS, kind="passage")
    assert remote.shape == local.shape == (5, 384) and remote.dtype == np.float32
    assert np.abs(remote - local).max() < 1e-5
    used = endpoint.usage_since(before)[f"{server.base_url}#{MODEL}"]
    assert used["calls"] == 1 + 3 and used["failed"] == 0  # the probe, then 5 texts in batches of 2
    assert used["tokens"] > len(TEXTS)  # the server's prompt_tokens, summed


def test_identity_is_content_and_the_cache_says_why_it_missed(server, tmp_path):
    cache = StageCache(tmp_path / "cache")
    a = embedder(server)
    ident = json.loads(a.identity)
    assert ident["model"] == MODEL and ident["dimensions"] == 384 and len(ident["fingerprint"]) == 16
    assert "base_url" not in ident  # two servers of one model share their vectors
    first = CachedEmbedder(a, cache, progress=False)
    assert first.miss_reason == ""
    first.encode(TEXTS[:2])
    assert CachedEmbedder(embedder(server), cache, progress=False).miss_reason == ""  # same model: same identity
    server.swap = True  # another model behind the same name
    try:
        api_embedding._PROBES.clear()
        b = embedder(server)
        assert b.identity != a.identity and json.loads(b.identity)["model"] == MODEL
        swapped = CachedEmbedder(b, cache, progress=False)
        assert "another model behind the same name" in swapped.miss_reason
        assert a.fingerprint in swapped.miss_reason and b.fingerprint in swapped.miss_reason
        n = server.inputs
        swapped.encode(TEXTS[:2])
        assert server.inputs == n + 2  # embedded anew, not served the other model's vectors
    finally:
        server.swap = False


def test_nan_vectors_fail_the_encode_and_are_not_cached(server, tmp_path):
    e = embedder(server, max_retries=0)
    server.nan = True
    try:
        with pytest.raises(RuntimeError, match="NaN"):
            CachedEmbedder(e, StageCache(tmp_path / "c"), progress=False).encode(TEXTS[:2])
    finally:
        server.nan = False


@pytest.mark.parametrize("fault", ["500", "429"])
def test_500s_and_429s_are_retried_and_the_vectors_are_whole(server, fault):
    e = embedder(server, batch_size=2, concurrency=1, max_retries=1, backoff_s=0.01)
    local = SentenceTransformerEmbedder(show_progress=False).encode(TEXTS, kind="passage")
    before = endpoint.usage()
    server.fault = fault
    try:
        v = e.encode(TEXTS)
    finally:
        server.fault = ""
    assert np.abs(v - local).max() < 1e-5
    used = endpoint.usage_since(before)[f"{server.base_url}#{MODEL}"]
    assert used["calls"] == 3 and used["failed"] == 0 and used["retries"] >= 1
    assert used["http_429"] == (used["retries"] if fault == "429" else 0)


def test_a_dead_endpoint_fails_the_encode_naming_it_and_never_shows_the_key(monkeypatch):
    s = MiniLMServer(key="sk-secret-embed-789")
    monkeypatch.setenv("EMB_SECRET", "sk-secret-embed-789")
    e = OpenAIEmbedder(base_url=s.base_url, model=MODEL, api_key_env="EMB_SECRET", max_retries=1, backoff_s=0.01)
    s.fault = "echo_key"  # a 500 whose body carries the key
    with pytest.raises(RuntimeError) as err:
        e.encode(TEXTS[:2])
    assert f"{s.base_url}/embeddings" in str(err.value) and "sk-secret-embed-789" not in str(err.value)
    s.close()  # dead
    with pytest.raises(RuntimeError, match="embedding: .*failed after 2 attempts"):
        e.encode(TEXTS[:2])


def _cfg(base_url: str, **kw) -> dict:
    node = {"_target_": "rag_experiments.stages.api_embedding.OpenAIEmbedder", "base_url": base_url,
            "model": MODEL, "api_key_env": None, "batch_size": 8} | kw  # fmt: skip
    return {"experiment_name": "t", "seed": 0, "embedding": node, "metrics": {"ks": [1], "bootstrap_resamples": 1000}}


def _problems(cfg: dict) -> list[str]:
    with pytest.raises(ConfigError) as e:
        check(cfg)
    return [p for p in e.value.problems if p.startswith("conf/embedding")]


def test_the_config_check_probes_once_and_names_the_key(server, closed_port_url):  # noqa: F811
    n = server.requests
    check(_cfg(server.base_url))
    check(_cfg(server.base_url))
    assert server.requests == n + 1  # one probe per process, reused
    (p,) = _problems(_cfg(closed_port_url))
    assert p.startswith("conf/embedding: base_url:") and "did not answer" in p
    (p,) = _problems(_cfg(server.base_url, model="text-embedding-3-large"))
    assert p.startswith("conf/embedding: model:")
    (p,) = _problems(_cfg(server.base_url, dimensions=256))
    assert p.startswith("conf/embedding: dimensions:") and "384-d" in p
    (p,) = _problems(_cfg(server.base_url, rpm=0))
    assert p.startswith("conf/embedding: rpm:")


def test_an_unauthorised_key_is_named_and_the_key_never_shown(monkeypatch):
    s = MiniLMServer(key="right-key-123")
    try:
        monkeypatch.setenv("EMB_TEST_KEY", "wrong-key-456")
        (p,) = _problems(_cfg(s.base_url, api_key_env="EMB_TEST_KEY"))
        assert p.startswith("conf/embedding: api_key_env:") and "EMB_TEST_KEY" in p and "HTTP 401" in p
        assert "wrong-key-456" not in p
        with pytest.raises(EmbeddingEndpointError, match="api_key_env"):
            OpenAIEmbedder(base_url=s.base_url, model=MODEL, api_key_env="EMB_TEST_KEY")
        monkeypatch.setenv("EMB_TEST_KEY", "right-key-123")
        assert OpenAIEmbedder(base_url=s.base_url, model=MODEL, api_key_env="EMB_TEST_KEY").dim == 384
    finally:
        s.close()


def test_sweep_minilm_and_the_minilm_server_give_identical_retrieval_metrics(server, tmp_path):
    from mlflow import MlflowClient

    docs, ev = make_tiny(tmp_path, n_items=8)
    conf = tmp_path / "myconf" / "embedding"
    conf.mkdir(parents=True)
    (conf / "minilm_api.yaml").write_text(textwrap.dedent(f"""\
        defaults:
          - openai
          - _self_
        base_url: {server.base_url}
        model: {MODEL}
        api_key_env: null
        """))  # fmt: skip
    n = server.inputs
    run_sweep(tmp_path, "-m", "--config-dir", str(tmp_path / "myconf"), *sweep_args(tmp_path, docs, ev),
              "generator=none", "retriever=dense", "metrics.bootstrap_resamples=100",
              "embedding=minilm,minilm_api")  # fmt: skip
    assert server.inputs > n  # the second config did embed through the server
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    by = {r.data.params.get("embedding"): r for r in runs if r.data.tags.get("is_parent") != "true"}
    local, remote = by["minilm"], by["minilm_api"]
    assert local.info.status == remote.info.status == "FINISHED"
    keys = [k for k in local.data.metrics if any(m in k for m in ("recall", "mrr", "ndcg", "hit", "precision"))]
    assert len(keys) >= 4, sorted(local.data.metrics)
    assert {k: local.data.metrics[k] for k in keys} == {k: remote.data.metrics[k] for k in keys}
    assert local.data.tags["config_hash"] != remote.data.tags["config_hash"]  # two embedders, two identities
    usage = json.loads(remote.data.tags["endpoint_usage"])
    assert usage[f"{server.base_url}#{MODEL}"]["tokens"] > 0


# -- against llama.cpp's server ------------------------------------------------------------------
@requires_smollm2
def test_llama_cpp_server_serves_embeddings_for_a_dense_run(tmp_path):
    srv, base_url = llama_embedding_server(smollm2_path(), n_threads=1)
    try:
        e = OpenAIEmbedder(base_url=base_url, model="smollm2", api_key_env=None, batch_size=4, concurrency=1)
        assert e.dim == 576 and json.loads(e.identity)["fingerprint"] == e.fingerprint
        again = OpenAIEmbedder(base_url=base_url, model="smollm2", api_key_env=None)
        assert again.identity == e.identity  # deterministic: the same model, the same fingerprint
        v = e.encode(TEXTS[:4], kind="passage")
        assert v.shape == (4, 576) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
        assert np.isfinite(v).all() and len({tuple(np.round(r, 4)) for r in v}) == 4
        corpus, items, cache = tiny_inputs(tmp_path, n_items=4)
        emb = CachedEmbedder(e, cache, progress=False)
        built = Stages(chunker=MarkdownChunker(), chunking_cfg={"_target_": "rag_experiments.stages.chunking.MarkdownChunker"},
                       retriever=DenseRetriever(emb, k=3), embedder=emb)  # fmt: skip
        settings = RunSettings(k=3, ks=(1, 3), n_resamples=50, progress=False)
        res = run_pipeline(built, PipelineData(corpus.docs, corpus.digest, items), settings, cache)
        assert len(res.per_query) == 4 and res.n_chunks > 0
        assert any("recall" in k for k in res.aggregates)
    finally:
        del srv
