"""Retrievers: exact dense cosine, BM25 (bm25s) and reciprocal-rank fusion of the two.

``index(chunks)`` then ``search(queries, k)``; results are ``(indices, scores)`` arrays of shape
(n_queries, k) into the indexed chunk list, best first (index -1 pads when fewer than k chunks
exist). ``identity`` names everything that determines a ranking except the chunks and queries,
which the pipeline adds to the ranking cache key.
"""

from __future__ import annotations

import json
from typing import Protocol

import numpy as np

from rag_experiments.types import Chunk


class Retriever(Protocol):
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


class DenseRetriever:
    """Exact cosine search: one batched matrix product of normalised vectors, then top_k."""

    def __init__(self, embedder, k: int = 5, batch_size: int = 256) -> None:
        self.embedder = embedder
        self.k = k
        self.batch_size = batch_size
        self.identity = json.dumps({"retriever": "dense", "embedder": embedder.identity}, sort_keys=True)
        self._matrix: np.ndarray | None = None

    def index(self, chunks: list[Chunk]) -> None:
        self._matrix = self.embedder.encode([c.text for c in chunks], kind="passage")

    def scores(self, queries: list[str]) -> np.ndarray:
        q = self.embedder.encode(queries, kind="query")
        return q @ self._matrix.T

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        out_i, out_s = [], []
        q = self.embedder.encode(queries, kind="query")
        for i in range(0, len(queries), self.batch_size):  # bounded memory on big eval sets
            idx, sc = top_k(q[i : i + self.batch_size] @ self._matrix.T, k)
            out_i.append(idx)
            out_s.append(sc)
        return np.vstack(out_i), np.vstack(out_s)


class BM25Retriever:
    """Okapi BM25 via ``bm25s`` (sparse matrices, no Python loop over documents)."""

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


def rrf_fuse(rankings: list[np.ndarray], weights: list[float], n_items: int, k: int, c: int = 60):
    """Weighted reciprocal-rank fusion: score(d) = Σ_r w_r / (c + rank_r(d)), ranks from 1.

    Items absent from a ranking get nothing from it. Returns top_k of the fused scores.
    """
    n_q = rankings[0].shape[0]
    fused = np.zeros((n_q, n_items), dtype=np.float64)
    rows = np.arange(n_q)[:, None]
    for ranking, w in zip(rankings, weights, strict=True):
        ranks = np.arange(1, ranking.shape[1] + 1)[None, :]
        valid = ranking >= 0
        np.add.at(
            fused,
            (np.broadcast_to(rows, ranking.shape)[valid], ranking[valid]),
            (w / (c + np.broadcast_to(ranks, ranking.shape)))[valid],
        )
    return top_k(fused, k)


class HybridRetriever:
    """Reciprocal-rank fusion of dense and BM25, each searched to ``candidates`` deep."""

    def __init__(
        self,
        embedder,
        k: int = 5,
        dense_weight: float = 1.0,
        bm25_weight: float = 1.0,
        rrf_c: int = 60,
        candidates: int = 50,
        bm25: dict | None = None,
    ) -> None:
        self.k = k
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
            },
            sort_keys=True,
        )
        self._n = 0

    def index(self, chunks: list[Chunk]) -> None:
        self.dense.index(chunks)
        self.bm25.index(chunks)
        self._n = len(chunks)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        depth = max(k, self.candidates)
        d_idx, _ = self.dense.search(queries, depth)
        b_idx, _ = self.bm25.search(queries, depth)
        idx, sc = rrf_fuse([d_idx, b_idx], self.weights, self._n, k, self.rrf_c)
        idx = np.where(np.isfinite(sc) & (sc > 0), idx, -1)  # unreached items are not results
        return idx, sc
