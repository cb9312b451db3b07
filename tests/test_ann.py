"""Large-corpus dense retrieval: blocked exact search, the memmap vector store, FAISS indexes, ANN recall."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag_experiments.core.cache import CachedEmbedder, StageCache
from rag_experiments.evalset.corpus import Corpus
from rag_experiments.evalset.load import EvalSet
from rag_experiments.run.pipeline import run_pipeline
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages.chunking import FixedSizeChunker
from rag_experiments.stages.embedding import SentenceTransformerEmbedder
from rag_experiments.stages.retrieval import DenseRetriever, ann_recall, exact_search, top_k
from rag_experiments.stages.vector_store import VectorStore, build_faiss, vectors_key
from tests.sweep_helpers import make_tiny


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _clustered(n: int, d: int, seed: int = 0) -> np.ndarray:
    """Points around 50 centres: the structure real embeddings have and ANN indexes exploit."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(50, d))
    return _unit(centres[rng.integers(0, 50, n)] + 0.35 * rng.normal(size=(n, d)))


@pytest.mark.parametrize(("n", "block"), [(1000, 128), (1000, 5000), (5, 2)])
def test_blocked_exact_search_equals_full_top_k(n, block):
    m = _clustered(n, 16)
    q = _clustered(37, 16, seed=1)
    want_i, want_s = top_k(q @ m.T, 10)
    got_i, got_s = exact_search(q, m, 10, q_batch=7, block_rows=block)
    assert np.array_equal(got_i, want_i)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-5)
    if n < 10:
        assert (got_i[:, n:] == -1).all() and np.isneginf(got_s[:, n:]).all()


def test_ann_recall_definition():
    exact = np.array([[0, 1, 2], [3, 4, -1], [-1, -1, -1]])
    ann = np.array([[0, 2, 9], [4, 8, -1], [-1, -1, -1]])
    r = ann_recall(ann, exact, 3)
    assert r[0] == pytest.approx(2 / 3) and r[1] == pytest.approx(1 / 2) and np.isnan(r[2])
    assert ann_recall(ann, exact, 1)[:2].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_vector_store_streams_batches_to_a_memmap_and_reuses_it(tmp_path, dtype):
    vecs = _clustered(1050, 8)
    texts = [f"t{i}" for i in range(len(vecs))]
    calls: list[int] = []

    def encode(batch: list[str]) -> np.ndarray:
        calls.append(len(batch))
        return vecs[[int(t[1:]) for t in batch]]

    store = VectorStore(tmp_path)
    key = vectors_key("emb", texts, dtype)
    m, hit = store.vectors(key, encode, texts, dtype, batch=100)
    assert not hit and calls == [100] * 10 + [50]  # never more than one batch in memory
    assert isinstance(m, np.memmap) and m.dtype == np.dtype(dtype) and m.shape == vecs.shape
    np.testing.assert_allclose(np.asarray(m, dtype=np.float32), vecs, atol=1e-3 if dtype == "float16" else 0)
    again, hit = store.vectors(key, encode, texts, dtype, batch=100)
    assert hit and len(calls) == 11 and np.array_equal(np.asarray(again), np.asarray(m))
    assert key != vectors_key("emb", texts[:-1], dtype) != vectors_key("emb2", texts, dtype)
    assert not list(tmp_path.rglob("*.tmp")), "no temp file left behind"


def test_faiss_indexes_against_exact_search():
    m = _clustered(4000, 32)
    q = _clustered(100, 32, seed=2)
    exact, _ = exact_search(q, m, 10)
    params = {"hnsw_m": 16, "ef_construction": 40, "ef_search": 64, "ivf_nlist": 64, "ivf_nprobe": 1}
    hnsw = build_faiss("faiss_hnsw", m, params, batch=1000)
    hnsw.hnsw.efSearch = 64
    _, idx = hnsw.search(q, 10)
    assert np.nanmean(ann_recall(idx, exact, 10)) >= 0.9
    ivf = build_faiss("faiss_ivf", m, params, batch=1000)
    ivf.nprobe = 64  # every cell probed: exhaustive, so exact
    _, idx = ivf.search(q, 10)
    assert np.nanmean(ann_recall(idx, exact, 10)) == pytest.approx(1.0)
    ivf.nprobe = 1  # one cell of 64: neighbours in other cells are lost, and the metric shows it
    _, idx = ivf.search(q, 10)
    assert np.nanmean(ann_recall(idx, exact, 10)) < 0.95


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("ann")
    docs, ev = make_tiny(root, n_items=6)
    corpus = Corpus(str(docs))
    return root, corpus, EvalSet(str(ev), corpus).items, SentenceTransformerEmbedder(show_progress=False)


def _run(tiny, cache, **index):
    root, corpus, items, st = tiny
    stages = Stages(
        chunker=FixedSizeChunker(size=300, overlap=50),
        chunking_cfg={"kind": "fixed", "size": 300, "overlap": 50},
        retriever=DenseRetriever(CachedEmbedder(st, cache), k=3, embed_batch=16, **index),
    )
    settings = RunSettings(k=3, ks=(1, 3, 10), n_resamples=50, progress=False)
    return run_pipeline(stages, PipelineData(corpus.docs, corpus.digest, items), settings, cache)


def test_pipeline_logs_ann_recall_and_caches_vectors_and_index(tiny):
    root, *_ = tiny
    cache = StageCache(root / "cache")
    exact = _run(tiny, cache)
    assert not any(k.startswith("ann_") for k in exact.aggregates), "exact search has nothing to report"
    assert cache.stats["vectors_mm.miss"] == 1
    hnsw = _run(tiny, cache, index="faiss_hnsw", hnsw_m=8)
    agg = hnsw.aggregates
    assert {"ann_recall_at_1", "ann_recall_at_3", "ann_recall_at_10", "ann_check_queries"} <= set(agg)
    assert all(0.0 <= agg[f"ann_recall_at_{k}"] <= 1.0 for k in (1, 3, 10))
    assert agg["ann_check_queries"] == len(exact.per_query)
    # same vectors: the exact run's memmap is reused, the index is built once and stored
    assert cache.stats["vectors_mm.hit"] >= 1 and cache.stats["ann_index.miss"] == 1
    assert len(list((root / "cache" / "ann").rglob("*.faiss"))) == 1
    # an HNSW graph over ~60 vectors is searched exhaustively: ANN rankings equal exact ones
    assert agg["ann_recall_at_10"] == pytest.approx(1.0)
    assert [r[0]["chunk_id"] for r in hnsw.per_query["retrieved"]] == [
        r[0]["chunk_id"] for r in exact.per_query["retrieved"]
    ]
    again = _run(tiny, cache, index="faiss_hnsw", hnsw_m=8)  # ranking and recall both from the cache
    assert (
        again.calls.get("retrieval", 0) == 0 and again.aggregates["ann_recall_at_3"] == agg["ann_recall_at_3"]
    )


def test_a_wider_search_beam_reuses_the_built_index(tiny, tmp_path):
    cache = StageCache(tmp_path / "cache")
    _run(tiny, cache, index="faiss_ivf", ivf_nlist=4, ivf_nprobe=1)
    narrow = dict(cache.stats)
    wide = _run(tiny, cache, index="faiss_ivf", ivf_nlist=4, ivf_nprobe=4)
    # nprobe is applied at search time: same index file, one build in all
    assert narrow["ann_index.miss"] == 1 and cache.stats["ann_index.miss"] == 1
    assert cache.stats["ann_index.hit"] == 1
    assert len(list((tmp_path / "cache" / "ann").rglob("*.faiss"))) == 1
    # every cell probed: exhaustive, so the wide beam's rankings are exact
    assert wide.aggregates["ann_recall_at_10"] == pytest.approx(1.0)


def test_index_choice_is_part_of_the_identity_and_validated():
    st = SentenceTransformerEmbedder(show_progress=False)
    exact = DenseRetriever(st)
    assert json.loads(exact.identity) == {"retriever": "dense", "embedder": st.identity}
    assert (
        len({DenseRetriever(st, index=i).identity for i in ("exact", "faiss_hnsw", "faiss_ivf", "auto")}) == 4
    )
    assert (
        DenseRetriever(st, index="faiss_hnsw", ef_search=8).identity
        != DenseRetriever(st, index="faiss_hnsw").identity
    )
    assert DenseRetriever(st, index="auto", exact_below=10).resolve_index(9) == "exact"
    assert DenseRetriever(st, index="auto", exact_below=10).resolve_index(10) == "faiss_hnsw"
    with pytest.raises(ValueError, match="retriever.index='hnsw'"):
        DenseRetriever(st, index="hnsw")
