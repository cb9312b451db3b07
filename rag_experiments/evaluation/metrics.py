"""Retrieval metrics (docs/metrics.md): pure numpy functions, one per metric, per-query values.

The bridge from gold evidence spans to chunks is :func:`relevance`, defined once here and used by
everything else (through :func:`relevance_arrays`). Each metric function takes boolean matrices over
(query, rank) and returns a float array with one value per query; averaging is a separate step
(``evaluation.aggregate.mean_ci``), so per-query tables and paired tests come for free. The ranking is computed once,
at the largest k, and every metric at every k is derived from it (:func:`retrieval_metrics`).

Conventions shared by the metric functions:

- ``rel``: bool array (n_queries, max_retrieved); ``rel[q, r]`` is True when the chunk at rank
  ``r + 1`` of query q is relevant to any of q's evidence spans. Lists shorter than max_retrieved are
  padded with False, so "fewer than k retrieved" needs no special case.
- ranks are 1-based in the formulas; k >= 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from rag_experiments.types import Chunk, ScoredChunk, Span

__all__ = [
    "context_precision_at_k",
    "evidence_recall_at_k",
    "hit_at_k",
    "ndcg_at_k",
    "reciprocal_rank",
    "relevance",
    "relevance_arrays",
    "retrieval_metrics",
]


# --------------------------------------------------------------------------- relevance


def _relevance_mask(c_doc, c_start, c_end, s_doc, s_start, s_end, min_coverage: float):
    """Element-wise (broadcasting) form of :func:`relevance`; the single definition of it."""
    overlap = np.maximum(np.minimum(c_end, s_end) - np.maximum(c_start, s_start), 0)
    inside = (c_start >= s_start) & (c_end <= s_end)
    enough = overlap >= min_coverage * (np.asarray(s_end) - np.asarray(s_start))
    return (np.asarray(c_doc) == np.asarray(s_doc)) & (overlap > 0) & (enough | inside)


def relevance(chunk: Chunk, span: Span, min_coverage: float = 0.5) -> bool:
    """Is ``chunk`` relevant to the gold evidence ``span``?

    True when both are in the same document, they share at least one character, and either
    ``overlap(chunk, span) >= min_coverage * (span.end - span.start)`` (the chunk carries at least that
    fraction of the evidence) or the chunk lies wholly inside the span (a long span cut into several
    small chunks: each piece counts). ``overlap`` is the number of shared characters. An empty span
    is relevant to nothing (the eval-set loader rejects those).
    """
    return bool(
        _relevance_mask(chunk.doc_id, chunk.start, chunk.end, span.doc_id, span.start, span.end, min_coverage)
    )


def _as_chunk(x: Chunk | ScoredChunk) -> Chunk:
    return x.chunk if isinstance(x, ScoredChunk) else x


def relevance_arrays(
    ranked: Sequence[Sequence[Chunk | ScoredChunk]],
    gold: Sequence[Sequence[Span]],
    all_chunks: Iterable[Chunk],
    min_coverage: float = 0.5,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Relevance of ranked chunks to each query's gold spans, via :func:`relevance` (vectorised).

    Returns ``(rel, span_hit, n_relevant)``:

    - ``span_hit``: bool (n_queries, max_retrieved, max_spans); ``span_hit[q, r, s]`` is True when
      the chunk at rank r+1 of query q is relevant to span s of q. Padded with False.
    - ``rel``: ``span_hit.any(axis=2)``.
    - ``n_relevant``: int (n_queries,), the number of distinct chunks relevant to q in the whole chunk
      set (``all_chunks`` plus any retrieved chunk missing from it): the ideal-DCG denominator.
    """
    n_q = len(ranked)
    if len(gold) != n_q:
        raise ValueError(f"ranked has {n_q} queries but gold has {len(gold)}")
    ranked_c = [[_as_chunk(x) for x in row] for row in ranked]
    n_r = max((len(row) for row in ranked_c), default=0)
    n_s = max((len(g) for g in gold), default=0)

    codes: dict[str, int] = {}

    def code(doc_id: str) -> int:
        return codes.setdefault(doc_id, len(codes))

    c_doc = np.full((n_q, n_r), -1, dtype=np.int64)  # -1 / -2 padding never match each other
    c_start = np.zeros((n_q, n_r), dtype=np.int64)
    c_end = np.zeros((n_q, n_r), dtype=np.int64)
    for q, row in enumerate(ranked_c):
        for r, c in enumerate(row):
            c_doc[q, r], c_start[q, r], c_end[q, r] = code(c.doc_id), c.start, c.end
    s_doc = np.full((n_q, n_s), -2, dtype=np.int64)
    s_start = np.zeros((n_q, n_s), dtype=np.int64)
    s_end = np.zeros((n_q, n_s), dtype=np.int64)
    for q, spans in enumerate(gold):
        for s, sp in enumerate(spans):
            s_doc[q, s], s_start[q, s], s_end[q, s] = code(sp.doc_id), sp.start, sp.end

    span_hit = _relevance_mask(
        c_doc[:, :, None],
        c_start[:, :, None],
        c_end[:, :, None],
        s_doc[:, None, :],
        s_start[:, None, :],
        s_end[:, None, :],
        min_coverage,
    )
    span_hit = np.asarray(span_hit, dtype=bool).reshape(n_q, n_r, n_s)
    rel = span_hit.any(axis=2)

    # The whole chunk set, grouped by document so each span is compared with its own doc's chunks.
    by_doc: dict[str, dict[str, tuple[int, int]]] = {}
    for c in all_chunks:
        by_doc.setdefault(c.doc_id, {})[c.chunk_id] = (c.start, c.end)
    for row in ranked_c:
        for c in row:
            by_doc.setdefault(c.doc_id, {}).setdefault(c.chunk_id, (c.start, c.end))
    arrays = {
        d: (list(m), np.array([v[0] for v in m.values()]), np.array([v[1] for v in m.values()]))
        for d, m in by_doc.items()
    }
    n_relevant = np.zeros(n_q, dtype=np.int64)
    for q, spans in enumerate(gold):
        hits: set[str] = set()
        for sp in spans:
            if sp.doc_id not in arrays:
                continue
            ids, starts, ends = arrays[sp.doc_id]
            mask = _relevance_mask(0, starts, ends, 0, sp.start, sp.end, min_coverage)
            hits.update(ids[i] for i in np.flatnonzero(mask))
        n_relevant[q] = len(hits)
    return rel, span_hit, n_relevant


# --------------------------------------------------------------------------- metrics


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


def hit_at_k(rel: np.ndarray, k: int) -> np.ndarray:
    """hit@k (the seed's "recall@k"): 1 if any of the top k chunks is relevant, else 0.

    ``hit@k[q] = 1[∃ r ≤ k : rel[q, r]]``. Fewer than k retrieved: only those count. No relevant
    chunk retrieved (or none exists): 0.
    """
    _check_k(k)
    return np.asarray(rel, dtype=bool)[:, :k].any(axis=1).astype(float)


def evidence_recall_at_k(span_hit: np.ndarray, n_spans: np.ndarray, k: int) -> np.ndarray:
    """evidence_recall@k: fraction of the query's evidence spans covered by some top-k chunk.

    ``recall[q] = |{s < n_spans[q] : ∃ r ≤ k, span_hit[q, r, s]}| / n_spans[q]``. For multi-chunk
    questions. Padding spans (s >= n_spans[q]) are False by construction. ``n_spans[q] == 0``
    (unanswerable): NaN.
    """
    _check_k(k)
    span_hit = np.asarray(span_hit, dtype=bool)
    n_spans = np.asarray(n_spans, dtype=float)
    covered = span_hit[:, :k, :].any(axis=1).sum(axis=1).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_spans > 0, covered / np.maximum(n_spans, 1), np.nan)


def reciprocal_rank(rel: np.ndarray) -> np.ndarray:
    """Reciprocal rank: ``1 / rank`` of the first relevant chunk in the whole retrieved list.

    0 when no retrieved chunk is relevant. Its mean over queries is MRR (key ``mrr``).
    """
    rel = np.asarray(rel, dtype=bool)
    if rel.shape[1] == 0:
        return np.zeros(rel.shape[0])
    first = rel.argmax(axis=1)
    return np.where(rel.any(axis=1), 1.0 / (first + 1), 0.0)


def context_precision_at_k(rel: np.ndarray, k: int) -> np.ndarray:
    """context_precision@k: relevant chunks in the top k, divided by k.

    ``P@k[q] = Σ_{r ≤ k} rel[q, r] / k`` — the seed's definition: it divides by k even when fewer
    than k chunks were retrieved (missing ranks count as not relevant). No relevant chunk: 0.
    """
    _check_k(k)
    return np.asarray(rel, dtype=bool)[:, :k].sum(axis=1) / float(k)


def ndcg_at_k(rel: np.ndarray, n_relevant: np.ndarray, k: int) -> np.ndarray:
    """nDCG@k with binary gains and log2 discount.

    ``DCG@k[q] = Σ_{r ≤ k} rel[q, r] / log2(r + 1)``;
    ``IDCG@k[q] = Σ_{r ≤ min(n_relevant[q], k)} 1 / log2(r + 1)`` — the ideal ranking puts every
    relevant chunk that exists in the chunk set first (not only the retrieved ones);
    ``nDCG@k = DCG@k / IDCG@k``. No relevant chunk exists (``n_relevant == 0``): 0. Fewer than k
    retrieved: missing ranks gain 0.
    """
    _check_k(k)
    rel = np.asarray(rel, dtype=bool)[:, :k]
    n_relevant = np.asarray(n_relevant)
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = (rel * discounts[: rel.shape[1]]).sum(axis=1)
    ideal_cum = np.concatenate([[0.0], np.cumsum(discounts)])
    idcg = ideal_cum[np.clip(n_relevant, 0, k)]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(idcg > 0, dcg / np.where(idcg > 0, idcg, 1.0), 0.0)


def retrieval_metrics(
    ranked: Sequence[Sequence[Chunk | ScoredChunk]],
    gold: Sequence[Sequence[Span]],
    all_chunks: Iterable[Chunk],
    ks: Iterable[int],
    min_coverage: float = 0.5,
) -> dict[str, np.ndarray]:
    """Every retrieval metric at every k from one ranking per query (retrieved once at max k).

    Keys (the MLflow metric keys): ``hit_at_{k}``, ``evidence_recall_at_{k}``,
    ``context_precision_at_{k}``, ``ndcg_at_{k}`` for each k, and ``mrr`` (per-query reciprocal rank
    over the whole list, so the logged aggregate is the mean of this column). Values are per query.
    Queries without gold spans (unanswerable) get NaN everywhere: they are excluded from retrieval
    means and counted separately by the caller.
    """
    ks = list(dict.fromkeys(int(k) for k in ks))
    rel, span_hit, n_relevant = relevance_arrays(ranked, gold, all_chunks, min_coverage)
    n_spans = np.array([len(g) for g in gold], dtype=np.int64)
    answerable = n_spans > 0
    out: dict[str, np.ndarray] = {}
    for k in ks:
        out[f"hit_at_{k}"] = hit_at_k(rel, k)
        out[f"evidence_recall_at_{k}"] = evidence_recall_at_k(span_hit, n_spans, k)
        out[f"context_precision_at_{k}"] = context_precision_at_k(rel, k)
        out[f"ndcg_at_{k}"] = ndcg_at_k(rel, n_relevant, k)
    out["mrr"] = reciprocal_rank(rel)
    for key, values in out.items():
        out[key] = np.where(answerable, values, np.nan)
    return out
