"""Retrievers: dense cosine (exact or FAISS ANN), BM25 (bm25s) and reciprocal-rank fusion of the two.

``index(chunks)`` then ``search(queries, k)``; results are ``(indices, scores)`` arrays of shape
(n_queries, k) into the indexed chunk list, best first (index -1 pads when fewer than k chunks
exist). ``identity`` names everything that determines a ranking except the chunks and queries,
which the pipeline adds to the ranking cache key.
"""

from __future__ import annotations

import json
from typing import Protocol

import numpy as np

from rag_experiments.core.cache import EmbedProgress, stable_hash
from rag_experiments.core.types import Chunk
from rag_experiments.stages.vector_store import DTYPES, VectorStore, build_faiss, vectors_key


class Retriever(Protocol):
    """``uses_embedder`` (optional class attribute, True when absent): whether ``search`` calls the
    embedder it is built with (``conf_groups.embedding_used``: the report's "Held fixed")."""

    identity: str
    k: int

    def index(self, chunks: list[Chunk]) -> None: ...

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise top-k of a (n_queries, n_items) score matrix, best first.

    ``argpartition`` selects the k best in O(n) per row, then only those k are sorted. Ties are
    broken by item index (stable), so rankings are deterministic.
    """
    n_q, n = scores.shape
    kk = min(k, n)
    if kk == 0:
        return np.full((n_q, k), -1), np.full((n_q, k), -np.inf, dtype=np.float32)
    part = np.argpartition(-scores, kk - 1, axis=1)[:, :kk] if kk < n else np.tile(np.arange(n), (n_q, 1))
    part_scores = np.take_along_axis(scores, part, axis=1)
    order = np.lexsort((part, -part_scores), axis=1)
    idx = np.take_along_axis(part, order, axis=1)
    sc = np.take_along_axis(part_scores, order, axis=1).astype(np.float32)
    if kk < k:  # fewer chunks than k: pad so every row has the same shape
        idx = np.pad(idx, ((0, 0), (0, k - kk)), constant_values=-1)
        sc = np.pad(sc, ((0, 0), (0, k - kk)), constant_values=-np.inf)
    return idx, sc


def merge_top_k(idx: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise best k of candidate (index, score) pairs: score descending, then index ascending.

    The order ``top_k`` gives over a whole matrix, so merging per-block top-k lists reproduces it.
    Padding (index -1, score -inf) sorts last.
    """
    tie = np.where(idx < 0, np.iinfo(np.int64).max, idx)
    order = np.lexsort((tie, -scores), axis=1)[:, :k]
    return np.take_along_axis(idx, order, axis=1), np.take_along_axis(scores, order, axis=1)


def exact_search(
    q: np.ndarray, matrix: np.ndarray, k: int, q_batch: int = 256, block_rows: int = 65536
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k by inner product score(q, i) = q · m_i (cosine for normalised rows).

    ``matrix`` may be a float16/float32 memmap: it is read ``block_rows`` rows at a time (each
    block once), so memory is one block plus a (queries × k) running best list, never n × d.
    Equal to ``top_k(q @ matrix.T, k)``, ties broken by chunk index.
    """
    n_q, n = len(q), matrix.shape[0]
    best_i = np.full((n_q, k), -1, dtype=np.int64)
    best_s = np.full((n_q, k), -np.inf, dtype=np.float32)
    for b in range(0, n, block_rows):
        block = np.asarray(matrix[b : b + block_rows], dtype=np.float32)
        for a in range(0, n_q, q_batch):
            idx, sc = top_k(q[a : a + q_batch] @ block.T, k)
            idx = np.where(idx >= 0, idx + b, -1)
            best_i[a : a + q_batch], best_s[a : a + q_batch] = merge_top_k(
                np.hstack([best_i[a : a + q_batch], idx]), np.hstack([best_s[a : a + q_batch], sc]), k
            )
    return best_i, best_s


def ann_recall(ann_idx: np.ndarray, exact_idx: np.ndarray, k: int) -> np.ndarray:
    """Per query: recall@k = |ANN top-k ∩ exact top-k| / |exact top-k| (padding -1 excluded).

    The usual ANN-benchmark definition; 1.0 means the index lost nothing at depth k. A query
    with no exact result (empty corpus) gets NaN, never a silent 1.
    """
    out = np.full(len(exact_idx), np.nan)
    for r, (a, e) in enumerate(zip(ann_idx[:, :k], exact_idx[:, :k], strict=True)):
        truth = set(e[e >= 0].tolist())
        if truth:
            out[r] = len(truth & set(a[a >= 0].tolist())) / len(truth)
    return out


INDEX_KINDS = ("exact", "faiss_hnsw", "faiss_ivf", "auto")
#: ANN parameters applied at search time only (the built index does not depend on them).
SEARCH_PARAMS = ("ef_search", "ivf_nprobe")


class DenseRetriever:
    """Dense cosine search: exact (blocked matrix product + top_k) or a FAISS ANN index.

    ``index``: exact | faiss_hnsw | faiss_ivf | auto (exact below ``exact_below`` chunks, else
    faiss_hnsw). With an enabled stage cache, passage vectors stream in ``embed_batch`` batches
    into a memory-mapped ``vector_dtype`` file and the ANN index is cached too (``docs/scale.md``).
    ANN runs report ``ann_recall_at_{k}`` against exact search via ``run_metrics``.
    """

    def __init__(
        self,
        embedder,
        k: int = 5,
        batch_size: int = 256,
        index: str = "exact",
        exact_below: int = 1_000_000,
        vector_dtype: str = "float32",
        embed_batch: int = 4096,
        hnsw_m: int = 32,
        ef_construction: int = 80,
        ef_search: int = 128,
        ivf_nlist: int = 0,
        ivf_nprobe: int = 128,
        ann_check_queries: int = 200,
        block_rows: int = 65536,
    ) -> None:
        if index not in INDEX_KINDS:
            raise ValueError(f"retriever.index={index!r}: expected one of {', '.join(INDEX_KINDS)}")
        if vector_dtype not in DTYPES:
            raise ValueError(f"retriever.vector_dtype={vector_dtype!r}: expected one of {', '.join(DTYPES)}")
        self.embedder = embedder
        self.k = k
        self.batch_size = batch_size
        self.index_kind, self.exact_below = index, exact_below
        self.vector_dtype, self.embed_batch, self.block_rows = vector_dtype, embed_batch, block_rows
        self.ann_params = {
            "hnsw_m": hnsw_m,
            "ef_construction": ef_construction,
            "ef_search": ef_search,
            "ivf_nlist": ivf_nlist,
            "ivf_nprobe": ivf_nprobe,
        }
        self.ann_check_queries = ann_check_queries
        ident: dict = {"retriever": "dense", "embedder": embedder.identity}
        if vector_dtype != "float32":
            ident["vector_dtype"] = vector_dtype
        if index != "exact":  # exact keeps its identity: its rankings stay cached
            ident.update(index=index, ann=self.ann_params)
            if index == "auto":
                ident["exact_below"] = exact_below
        self.identity = json.dumps(ident, sort_keys=True)
        self._matrix: np.ndarray | None = None
        self._ann = None
        self._n = -1

    def resolve_index(self, n_chunks: int) -> str:
        if self.index_kind == "auto":
            return "exact" if n_chunks < self.exact_below else "faiss_hnsw"
        return self.index_kind

    def index(self, chunks: list[Chunk]) -> None:
        texts = [c.text for c in chunks]
        self._n, self._ann = len(texts), None
        cache = getattr(self.embedder, "cache", None)  # CachedEmbedder carries the stage cache
        inner = getattr(self.embedder, "inner", self.embedder)  # passages go to the memmap store instead
        store = VectorStore(cache.root, cache.writable) if cache is not None and cache.enabled and texts else None
        vkey = vectors_key(self.embedder.identity, texts, self.vector_dtype)
        if store is not None:
            # a line per 10 % with its ETA while the corpus is embedded (progress=false: none)
            show = bool(getattr(self.embedder, "progress", False)) and len(texts) >= 100  # ~5 s of MiniLM
            with EmbedProgress(inner, len(texts), show) as embedding:
                self._matrix, hit = store.vectors(
                    vkey, embedding.encode, texts, self.vector_dtype, self.embed_batch, inner
                )
            cache.stats[f"vectors_mm.{'hit' if hit else 'miss'}"] += 1
        else:
            self._matrix = self.embedder.encode(texts, kind="passage").astype(DTYPES[self.vector_dtype])
        kind = self.resolve_index(len(texts))
        if kind == "exact" or not texts:
            return

        def build():
            return build_faiss(kind, self._matrix, self.ann_params, self.block_rows)

        if store is None:
            self._ann = build()
        else:
            # search-time beams (ef_search, ivf_nprobe) do not change the index: not in its key
            build_params = {p: v for p, v in self.ann_params.items() if p not in SEARCH_PARAMS}
            self._ann, hit = store.index(stable_hash("ann_index", vkey, kind, build_params), build)
            cache.stats[f"ann_index.{'hit' if hit else 'miss'}"] += 1

    def _ann_search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import faiss

        kk = min(k, self._n)
        if isinstance(self._ann, faiss.IndexHNSW):
            self._ann.hnsw.efSearch = max(int(self.ann_params["ef_search"]), kk)
        else:
            faiss.extract_index_ivf(self._ann).nprobe = int(self.ann_params["ivf_nprobe"])
        sc, idx = self._ann.search(np.ascontiguousarray(q, dtype=np.float32), kk)
        sc = np.where(idx >= 0, sc, -np.inf).astype(np.float32)
        if kk < k:
            idx = np.pad(idx, ((0, 0), (0, k - kk)), constant_values=-1)
            sc = np.pad(sc, ((0, 0), (0, k - kk)), constant_values=-np.inf)
        return idx.astype(np.int64), sc

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.search_vectors(self.embedder.encode(queries, kind="query"), k)

    def search_vectors(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``search`` for query vectors already computed (query=hyde mixes two embeddings)."""
        if self._ann is not None:
            return self._ann_search(q, k)
        if self._n == 0:
            return top_k(np.zeros((len(q), 0), dtype=np.float32), k)
        return exact_search(q, self._matrix, k, self.batch_size, self.block_rows)

    def run_metrics(self, chunks: list[Chunk], chunks_key: str, queries: list[str], ks: list[int], cache):
        """``ann_recall_at_{k}`` of the ANN index against exact search, on at most
        ``ann_check_queries`` queries (a fixed sample), plus ``ann_check_queries``; ``{}`` when
        the search is exact. Cached by (identity, chunks, sample, ks) in the stage cache.
        """
        if self.resolve_index(len(chunks)) == "exact" or not queries or not chunks:
            return {}
        sample = list(queries)
        if len(sample) > self.ann_check_queries:
            pick = np.random.default_rng(0).choice(len(sample), self.ann_check_queries, replace=False)
            sample = [sample[i] for i in sorted(pick)]
        key = stable_hash("ann_recall", self.identity, chunks_key, sample, sorted(ks))
        found = cache.get_json_many("ann_recall", [key])
        if key in found:
            return found[key]
        if self._ann is None or self._n != len(chunks):
            self.index(chunks)
        q = self.embedder.encode(sample, kind="query")
        depth = max(ks)
        ann, _ = self._ann_search(q, depth)
        exact, _ = exact_search(q, self._matrix, depth, self.batch_size, self.block_rows)
        out = {f"ann_recall_at_{k}": float(np.nanmean(ann_recall(ann, exact, k))) for k in sorted(ks)}
        out["ann_check_queries"] = float(len(sample))
        cache.put_json_many("ann_recall", {key: out})
        return out


class BM25Retriever:
    """Okapi BM25 via ``bm25s`` (sparse matrices, no Python loop over documents)."""

    uses_embedder = False  # built with the run's embedder like every retriever, never calls it

    def __init__(
        self,
        k: int = 5,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        stopwords: str = "en",
        embedder=None,
    ) -> None:
        # ``embedder`` is accepted and ignored so every retriever is built the same way.
        self.k = k
        self.k1, self.b, self.method, self.stopwords = k1, b, method, stopwords
        self.identity = json.dumps(
            {"retriever": "bm25", "k1": k1, "b": b, "method": method, "stopwords": stopwords}, sort_keys=True
        )
        self._bm25 = None
        self._n = 0

    def _tokenize(self, texts: list[str]):
        import bm25s

        return bm25s.tokenize(texts, stopwords=self.stopwords or None, show_progress=False)

    def index(self, chunks: list[Chunk]) -> None:
        import bm25s

        self._bm25 = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        self._bm25.index(self._tokenize([c.text for c in chunks]), show_progress=False)
        self._n = len(chunks)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        kk = min(k, self._n)
        idx, sc = self._bm25.retrieve(self._tokenize(queries), k=kk, show_progress=False, n_threads=1)
        idx, sc = np.asarray(idx), np.asarray(sc, dtype=np.float32)
        if kk < k:
            idx = np.pad(idx, ((0, 0), (0, k - kk)), constant_values=-1)
            sc = np.pad(sc, ((0, 0), (0, k - kk)), constant_values=-np.inf)
        return idx, sc


#: Cells (queries × chunks) of one fused score block: fusion works on blocks of queries so its
#: memory stays at 8 bytes × this (128 MiB) at any corpus size; 1,190 queries × 1M chunks in one
#: matrix would be 9.5 GB. Rows are independent, so blocking changes no result.
FUSE_BLOCK_CELLS = 1 << 24


def _row_blocks(n_q: int, n_items: int, max_cells: int) -> list[slice]:
    """Consecutive query slices of at most ``max_cells // n_items`` rows (at least one row)."""
    step = max(1, max_cells // max(n_items, 1))
    return [slice(i, min(i + step, n_q)) for i in range(0, n_q, step)] or [slice(0, 0)]


def _stack(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def rrf_fuse(
    rankings: list[np.ndarray],
    weights: list[float],
    n_items: int,
    k: int,
    c: int = 60,
    max_cells: int = FUSE_BLOCK_CELLS,
):
    """Weighted reciprocal-rank fusion: score(d) = Σ_r w_r / (c + rank_r(d)), ranks from 1.

    Items absent from a ranking get nothing from it. Returns top_k of the fused scores, computed
    on blocks of queries of at most ``max_cells`` scores (``FUSE_BLOCK_CELLS``).
    """
    n_q = rankings[0].shape[0]
    parts = []
    for blk in _row_blocks(n_q, n_items, max_cells):
        block = [r[blk] for r in rankings]
        m = block[0].shape[0]
        fused = np.zeros((m, n_items), dtype=np.float64)
        rows = np.arange(m)[:, None]
        for ranking, w in zip(block, weights, strict=True):
            ranks = np.arange(1, ranking.shape[1] + 1)[None, :]
            valid = ranking >= 0
            np.add.at(
                fused,
                (np.broadcast_to(rows, ranking.shape)[valid], ranking[valid]),
                (w / (c + np.broadcast_to(ranks, ranking.shape)))[valid],
            )
        parts.append(top_k(fused, k))
    return _stack(parts)


def minmax(scores: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Row-wise (s - min) / (max - min) over the ``valid`` entries (invalid → 0); a row whose valid
    scores are all equal maps them to 1 (each is that list's best)."""
    s = np.where(valid, scores, np.nan).astype(np.float64)
    with np.errstate(all="ignore"):
        lo, hi = np.nanmin(s, axis=1, keepdims=True), np.nanmax(s, axis=1, keepdims=True)
        out = np.where(hi > lo, (s - lo) / (hi - lo), 1.0)
    return np.where(valid, out, 0.0)


def weighted_fuse(
    rankings, scores, weights: list[float], n_items: int, k: int, max_cells: int = FUSE_BLOCK_CELLS
):
    """Convex score fusion: score(d) = Σ_r w_r · minmax_r(d), each list's scores min-max normalised
    per query over its own candidates (``minmax``); items absent from a list get 0 from it. With
    weights (α, 1-α) this is the usual α·dense + (1-α)·BM25. Returns top_k of the fused scores,
    computed on blocks of queries of at most ``max_cells`` scores (``FUSE_BLOCK_CELLS``)."""
    n_q = rankings[0].shape[0]
    parts = []
    for blk in _row_blocks(n_q, n_items, max_cells):
        block, block_sc = [r[blk] for r in rankings], [s[blk] for s in scores]
        m = block[0].shape[0]
        fused = np.zeros((m, n_items), dtype=np.float64)
        rows = np.arange(m)[:, None]
        for ranking, sc, w in zip(block, block_sc, weights, strict=True):
            valid = (ranking >= 0) & np.isfinite(sc)
            norm = w * minmax(sc, valid)
            np.add.at(fused, (np.broadcast_to(rows, ranking.shape)[valid], ranking[valid]), norm[valid])
        reached = np.zeros((m, n_items), dtype=bool)
        for ranking in block:
            valid = ranking >= 0
            reached[np.broadcast_to(rows, ranking.shape)[valid], ranking[valid]] = True
        parts.append(top_k(np.where(reached, fused, -np.inf), k))
    return _stack(parts)


FUSIONS = ("rrf", "weighted")


class HybridRetriever:
    """Dense and BM25, each searched to ``candidates`` deep, fused by ``fusion``:

    - ``rrf``: weighted reciprocal-rank fusion, Σ_r w_r / (rrf_c + rank_r) with w = (dense_weight,
      bm25_weight) (``rrf_fuse``);
    - ``weighted``: α·minmax(dense score) + (1-α)·minmax(BM25 score) with α = ``alpha``
      (``weighted_fuse``).
    """

    def __init__(
        self,
        embedder,
        k: int = 5,
        dense_weight: float = 1.0,
        bm25_weight: float = 1.0,
        rrf_c: int = 60,
        candidates: int = 50,
        bm25: dict | None = None,
        fusion: str = "rrf",
        alpha: float = 0.5,
    ) -> None:
        if fusion not in FUSIONS:
            raise ValueError(f"retriever.fusion={fusion!r}: expected one of {', '.join(FUSIONS)}")
        self.k = k
        self.fusion, self.alpha = fusion, float(alpha)
        self.dense = DenseRetriever(embedder, k=k)
        self.bm25 = BM25Retriever(k=k, **(bm25 or {}))
        self.weights = [dense_weight, bm25_weight]
        self.rrf_c = rrf_c
        self.candidates = candidates
        self.identity = json.dumps(
            {
                "retriever": "hybrid",
                "dense": self.dense.identity,
                "bm25": self.bm25.identity,
                "weights": self.weights,
                "rrf_c": rrf_c,
                "candidates": candidates,
                # rrf keeps the identity it had before fusion was a setting: its rankings stay cached
                **({"fusion": fusion, "alpha": self.alpha} if fusion != "rrf" else {}),
            },
            sort_keys=True,
        )
        self._n = 0

    @property
    def embedder(self):
        """The dense half's embedder."""
        return self.dense.embedder

    def index(self, chunks: list[Chunk]) -> None:
        self.dense.index(chunks)
        self.bm25.index(chunks)
        self._n = len(chunks)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        depth = max(k, self.candidates)
        d_idx, d_sc = self.dense.search(queries, depth)
        b_idx, b_sc = self.bm25.search(queries, depth)
        if self.fusion == "weighted":
            idx, sc = weighted_fuse([d_idx, b_idx], [d_sc, b_sc], [self.alpha, 1 - self.alpha], self._n, k)
            return np.where(np.isfinite(sc), idx, -1), sc
        idx, sc = rrf_fuse([d_idx, b_idx], self.weights, self._n, k, self.rrf_c)
        idx = np.where(np.isfinite(sc) & (sc > 0), idx, -1)  # unreached items are not results
        return idx, sc
