"""Retrieval metrics (docs/metrics.md): pure numpy functions, one per metric, per-query values.

The bridge from gold evidence spans to chunks is :func:`relevance`, defined once here and used by
everything else (through :func:`relevance_arrays`). Each metric function takes boolean matrices over
(query, rank) and returns a float array with one value per query; averaging is a separate step
(``evaluation.aggregate.mean_ci``), so per-query tables and paired tests come for free. The ranking
is computed once, at the largest depth, and every metric at every k is derived from it
(:func:`retrieval_metrics`).

Conventions shared by the metric functions:

- ``rel``: bool array (n_queries, max_retrieved); ``rel[q, r]`` is True when the chunk at rank
  ``r + 1`` of query q is relevant to any of q's evidence spans. Lists shorter than max_retrieved are
  padded with False, so "fewer than k retrieved" needs no special case.
- ranks are 1-based in the formulas; k >= 1.
- Character coverage (:func:`coverage_arrays`): the evidence-recall and token-level metrics count
  *characters*, from the chunks' offsets, so a chunk is credited only with what it covers, and
  the union of several chunks counts overlapping text once. Token-budgeted metrics (the context
  cut at B tokens, :func:`budget_ends`) live in :mod:`rag_experiments.evaluation.budget`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from rag_experiments.core.types import Chunk, ScoredChunk, Span
from rag_experiments.evaluation.defaults import MIN_COVERAGE, check_metrics_config
from rag_experiments.evaluation.walk import walk

__all__ = [
    "Coverage",
    "RankedArrays",
    "check_metrics_config",
    "context_precision_at_k",
    "coverage_arrays",
    "covered_chars",
    "evidence_recall_at_k",
    "span_recalled",
    "hit_at_k",
    "mask_unanswerable",
    "ndcg_at_k",
    "reciprocal_rank",
    "relevance",
    "relevance_arrays",
    "ranked_arrays",
    "retrieval_metrics",
    "span_hits",
    "token_iou_at_k",
    "token_metrics",
    "token_precision_at_k",
    "token_recall_at_k",
]


# --------------------------------------------------------------------------- relevance


def _relevance_mask(c_doc, c_start, c_end, s_doc, s_start, s_end, min_coverage: float):
    """Element-wise (broadcasting) form of :func:`relevance`; the single definition of it."""
    overlap = np.maximum(np.minimum(c_end, s_end) - np.maximum(c_start, s_start), 0)
    inside = (c_start >= s_start) & (c_end <= s_end)
    enough = overlap >= min_coverage * (np.asarray(s_end) - np.asarray(s_start))
    return (np.asarray(c_doc) == np.asarray(s_doc)) & (overlap > 0) & (enough | inside)


def relevance(chunk: Chunk, span: Span, min_coverage: float = MIN_COVERAGE) -> bool:
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


@dataclass(frozen=True)
class RankedArrays:
    """Ranked chunks and gold spans as padded integer arrays (documents coded as integers).

    ``c_*``: (n_queries, max_retrieved); padding has ``c_doc = -1`` and ``start = end = 0``.
    ``s_*``: (n_queries, max_spans); padding has ``s_doc = -2`` and ``start = end = 0``.
    Padding never matches anything and covers no character.
    """

    c_doc: np.ndarray
    c_start: np.ndarray
    c_end: np.ndarray
    s_doc: np.ndarray
    s_start: np.ndarray
    s_end: np.ndarray
    n_spans: np.ndarray
    codes: dict[str, int]


def ranked_arrays(
    ranked: Sequence[Sequence[Chunk | ScoredChunk]], gold: Sequence[Sequence[Span]]
) -> RankedArrays:
    """Pad the ranked chunks and gold spans of every query into a :class:`RankedArrays`."""
    n_q = len(ranked)
    if len(gold) != n_q:
        raise ValueError(f"ranked has {n_q} queries but gold has {len(gold)}")
    n_r = max((len(row) for row in ranked), default=0)
    n_s = max((len(g) for g in gold), default=0)
    codes: dict[str, int] = {}
    c = np.zeros((3, n_q, n_r), dtype=np.int64)
    c[0] = -1
    for q, row in enumerate(ranked):
        for r, x in enumerate(row):
            x = _as_chunk(x)
            c[:, q, r] = codes.setdefault(x.doc_id, len(codes)), x.start, x.end
    s = np.zeros((3, n_q, n_s), dtype=np.int64)
    s[0] = -2
    for q, spans in enumerate(gold):
        for j, sp in enumerate(spans):
            s[:, q, j] = codes.setdefault(sp.doc_id, len(codes)), sp.start, sp.end
    n_spans = np.array([len(g) for g in gold], dtype=np.int64)
    return RankedArrays(c[0], c[1], c[2], s[0], s[1], s[2], n_spans, codes)


def span_hits(a: RankedArrays, min_coverage: float, c_end: np.ndarray | None = None) -> np.ndarray:
    """bool (n_queries, max_retrieved, max_spans): :func:`relevance` of every ranked chunk to every
    span. ``c_end`` replaces the chunks' ends (a context cut inside a chunk, see budget.py)."""
    end = a.c_end if c_end is None else c_end
    hit = _relevance_mask(
        a.c_doc[:, :, None],
        a.c_start[:, :, None],
        end[:, :, None],
        a.s_doc[:, None, :],
        a.s_start[:, None, :],
        a.s_end[:, None, :],
        min_coverage,
    )
    return np.asarray(hit, dtype=bool).reshape(*a.c_doc.shape, a.s_doc.shape[1])


def relevance_arrays(
    ranked: Sequence[Sequence[Chunk | ScoredChunk]],
    gold: Sequence[Sequence[Span]],
    all_chunks: Iterable[Chunk],
    min_coverage: float = MIN_COVERAGE,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Relevance of ranked chunks to each query's gold spans, via :func:`relevance` (vectorised).

    Returns ``(rel, span_hit, n_relevant)``:

    - ``span_hit``: bool (n_queries, max_retrieved, max_spans); ``span_hit[q, r, s]`` is True when
      the chunk at rank r+1 of query q is relevant to span s of q. Padded with False.
    - ``rel``: ``span_hit.any(axis=2)``.
    - ``n_relevant``: int (n_queries,), the number of distinct chunks relevant to q in the whole chunk
      set (``all_chunks`` plus any retrieved chunk missing from it): the ideal-DCG denominator.
    """
    ranked_c = [[_as_chunk(x) for x in row] for row in ranked]
    span_hit = span_hits(ranked_arrays(ranked_c, gold), min_coverage)
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
    n_relevant = np.zeros(len(ranked_c), dtype=np.int64)
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


# --------------------------------------------------------------------------- character coverage

_DOC_STRIDE = np.int64(1) << 40  # documents laid end to end on one axis: code * stride + offset


@dataclass(frozen=True)
class Coverage:
    """Characters first covered at each rank, per query (the union of ranks 1..r grows by these).

    - ``new_text[q, r]``: characters of the chunk at rank r+1 not in any higher-ranked chunk;
      ``new_text[q, :k].sum()`` = size of the union of the top k.
    - ``new_gold[q, r]``: of those, characters inside some gold span of q.
    - ``span_new[q, r, s]``: of those, characters inside span s (spans may overlap each other).
    - ``gold_len[q]``: characters in the union of q's gold spans; ``span_len[q, s]`` = end - start.
    """

    new_text: np.ndarray
    new_gold: np.ndarray
    span_new: np.ndarray
    gold_len: np.ndarray
    span_len: np.ndarray


def _coverage_one(p_lo, p_hi, s_lo, s_hi):
    """One query on the global character axis, by elementary segments.

    The sorted distinct endpoints cut the axis into segments that are each wholly inside or
    wholly outside every chunk and span; a segment belongs to the rank that covers it first.
    """
    n_r = len(p_lo)
    pts = np.unique(np.concatenate([p_lo, p_hi, s_lo, s_hi]))
    lo, hi = pts[:-1], pts[1:]
    length = (hi - lo).astype(float)
    in_p = (p_lo[:, None] <= lo) & (hi <= p_hi[:, None])
    in_s = (s_lo[:, None] <= lo) & (hi <= s_hi[:, None])
    first = np.where(in_p.any(axis=0), in_p.argmax(axis=0), n_r) if n_r else np.zeros(len(lo), int)
    w = (first[None, :] == np.arange(n_r)[:, None]) * length  # (n_r, n_seg)
    in_gold = in_s.any(axis=0)
    return w.sum(axis=1), w @ in_gold, w @ in_s.T.astype(float), float(length @ in_gold)


def coverage_arrays(a: RankedArrays, c_end: np.ndarray | None = None) -> Coverage:
    """Character coverage of the gold spans by the ranked chunks (see :class:`Coverage`).

    Exact interval arithmetic from the offsets: overlapping chunks count shared text once; a chunk
    in another document covers nothing; padding covers nothing. ``c_end`` replaces the chunks'
    ends (a context cut inside a chunk, see budget.py).
    """
    end = a.c_end if c_end is None else c_end
    n_q, n_r = a.c_doc.shape
    n_s = a.s_doc.shape[1]
    base_c = a.c_doc * _DOC_STRIDE
    base_s = a.s_doc * _DOC_STRIDE
    p_lo, p_hi = base_c + a.c_start, base_c + np.maximum(end, a.c_start)
    s_lo, s_hi = base_s + a.s_start, base_s + np.maximum(a.s_end, a.s_start)
    new_text, new_gold = np.zeros((n_q, n_r)), np.zeros((n_q, n_r))
    span_new, gold_len = np.zeros((n_q, n_r, n_s)), np.zeros(n_q)
    for q in range(n_q):
        new_text[q], new_gold[q], span_new[q], gold_len[q] = _coverage_one(p_lo[q], p_hi[q], s_lo[q], s_hi[q])
    span_len = np.maximum(a.s_end - a.s_start, 0).astype(float)
    return Coverage(new_text, new_gold, span_new, gold_len, span_len)


# --------------------------------------------------------------------------- metrics


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


def _ratio(num: np.ndarray, den: np.ndarray, empty: float) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), empty)


def hit_at_k(rel: np.ndarray, k: int) -> np.ndarray:
    """hit@k (the seed's "recall@k"): 1 if any of the top k chunks is relevant, else 0.

    ``hit@k[q] = 1[∃ r ≤ k : rel[q, r]]``. Fewer than k retrieved: only those count. No relevant
    chunk retrieved (or none exists): 0.
    """
    _check_k(k)
    return np.asarray(rel, dtype=bool)[:, :k].any(axis=1).astype(float)


def span_recalled(covered, span_len, min_coverage: float = MIN_COVERAGE):
    """The recall rule (scalars or arrays): ``covered > 0 and covered >= min_coverage * span_len``,
    ``covered`` the span's characters inside the union of the top k (``covered_chars``)."""
    return np.logical_and(
        np.greater(covered, 0), np.greater_equal(covered, min_coverage * np.asarray(span_len))
    )


def covered_chars(ranges: Iterable[tuple[int, int]], start: int, end: int) -> int:
    """Characters of ``[start, end)`` inside the union of the half-open ``ranges`` (one document),
    overlaps counted once: the scalar form of ``Coverage.span_new`` summed over the top k."""
    covered, reach = 0, start
    for lo, hi in sorted((max(lo, start), min(hi, end)) for lo, hi in ranges):
        lo = max(lo, reach)
        if hi > lo:
            covered, reach = covered + hi - lo, hi
    return covered


def evidence_recall_at_k(
    span_new: np.ndarray,
    span_len: np.ndarray,
    n_spans: np.ndarray,
    k: int,
    min_coverage: float = MIN_COVERAGE,
) -> np.ndarray:
    """evidence_recall@k: share of the query's evidence spans that the top k chunks cover.

    Coverage-based: span s is recalled when the union of the top-k chunks covers at least
    ``min_coverage`` of its characters (and at least one): ``cov[q, s] = Σ_{r ≤ k} span_new[q, r,
    s]`` (characters of s first covered at rank r, :class:`Coverage`), recalled when ``cov >=
    min_coverage * span_len[q, s]`` and ``cov > 0``; ``recall[q] = |recalled| / n_spans[q]``. A
    tiny chunk inside a long span credits only the characters it covers (unlike the hit rule);
    several chunks together can recall a span none of them covers alone. Padding spans have length
    0 and are never recalled. ``n_spans[q] == 0`` (unanswerable): NaN.
    """
    _check_k(k)
    cov = np.asarray(span_new, dtype=float)[:, :k, :].sum(axis=1)
    recalled = span_recalled(cov, np.asarray(span_len, dtype=float), min_coverage)
    n_spans = np.asarray(n_spans, dtype=float)
    return _ratio(recalled.sum(axis=1).astype(float), n_spans, np.nan)


def reciprocal_rank(rel: np.ndarray, depth: int | None = None) -> np.ndarray:
    """Reciprocal rank: ``1 / rank`` of the first relevant chunk within the top ``depth``.

    ``RR[q] = 1 / min{r ≤ depth : rel[q, r]}``, 0 when none of the top ``depth`` is relevant. Its
    mean over queries is MRR (key ``mrr``, at ``metrics.rank_depth``). ``depth=None``: the whole
    list. Fewer than ``depth`` retrieved: over those.
    """
    rel = np.asarray(rel, dtype=bool)
    if depth is not None:
        _check_k(depth)
        rel = rel[:, :depth]
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
    return _ratio(dcg, idcg, 0.0)


def token_recall_at_k(new_gold: np.ndarray, gold_len: np.ndarray, k: int) -> np.ndarray:
    """token_recall@k: share of the gold-evidence characters inside the union of the top k chunks.

    ``|G ∩ U_k| / |G|`` with G the union of the query's gold spans and U_k the union of its top-k
    chunks (characters; ``|G ∩ U_k| = Σ_{r ≤ k} new_gold[q, r]``, :class:`Coverage`). Fewer than
    k retrieved: those. No gold character (unanswerable): NaN.
    """
    _check_k(k)
    inter = np.asarray(new_gold, dtype=float)[:, :k].sum(axis=1)
    return _ratio(inter, np.asarray(gold_len, dtype=float), np.nan)


def token_precision_at_k(new_gold: np.ndarray, new_text: np.ndarray, k: int) -> np.ndarray:
    """token_precision@k: share of the top-k text that is gold evidence.

    ``|G ∩ U_k| / |U_k|`` (characters; overlapping chunks count their shared text once). Nothing
    retrieved (``|U_k| = 0``): 0 — an empty context delivers no evidence.
    """
    _check_k(k)
    inter = np.asarray(new_gold, dtype=float)[:, :k].sum(axis=1)
    union = np.asarray(new_text, dtype=float)[:, :k].sum(axis=1)
    return _ratio(inter, union, 0.0)


def token_iou_at_k(new_gold: np.ndarray, new_text: np.ndarray, gold_len: np.ndarray, k: int) -> np.ndarray:
    """token_iou@k: ``|G ∩ U_k| / |G ∪ U_k|`` = ``inter / (|G| + |U_k| - inter)`` in characters.

    Never above token precision or token recall. No gold and nothing retrieved: NaN.
    """
    _check_k(k)
    inter = np.asarray(new_gold, dtype=float)[:, :k].sum(axis=1)
    union = np.asarray(new_text, dtype=float)[:, :k].sum(axis=1)
    return _ratio(inter, np.asarray(gold_len, dtype=float) + union - inter, np.nan)


def retrieval_metrics(
    ranked: Sequence[Sequence[Chunk | ScoredChunk]],
    gold: Sequence[Sequence[Span]],
    all_chunks: Iterable[Chunk],
    ks: Iterable[int],
    min_coverage: float = MIN_COVERAGE,
    rank_depth: int | None = None,
) -> dict[str, np.ndarray]:
    """Every chunk-level retrieval metric at every k from one ranking per query, by walking the
    registry (:func:`rag_experiments.evaluation.walk.walk`) over the relevance and coverage arrays:
    for each k the ``{k}`` metrics in registry order, then those without k (``mrr``).

    Keys (the MLflow metric keys): ``hit_at_{k}``, ``evidence_recall_at_{k}``,
    ``context_precision_at_{k}``, ``ndcg_at_{k}`` for each k, and ``mrr`` (per-query reciprocal rank
    within the top ``rank_depth``, the whole list when None; the logged aggregate is the mean of
    this column). Values are per query. Queries without gold spans (unanswerable) get NaN
    everywhere: they are excluded from retrieval means and counted separately by the caller.
    """
    ks = list(dict.fromkeys(int(k) for k in ks))
    rel, span_hit, n_relevant = relevance_arrays(ranked, gold, all_chunks, min_coverage)
    cov = coverage_arrays(ranked_arrays(ranked, gold))
    n_spans = np.array([len(g) for g in gold], dtype=np.int64)
    shared = dict(
        rel=rel, n_relevant=n_relevant, span_new=cov.span_new, span_len=cov.span_len, n_spans=n_spans,
        min_coverage=min_coverage, depth=rank_depth,
    )  # fmt: skip
    out: dict[str, np.ndarray] = {}
    for k in ks:
        out |= walk(shared, "retrieval", k=k)
    out |= walk(shared, "retrieval")
    return mask_unanswerable(out, n_spans)


def token_metrics(
    ranked: Sequence[Sequence[Chunk | ScoredChunk]], gold: Sequence[Sequence[Span]], ks: Iterable[int]
) -> dict[str, np.ndarray]:
    """``token_recall_at_{k}``, ``token_precision_at_{k}``, ``token_iou_at_{k}`` per query, for each
    k, from character offsets (docs/metrics.md), by walking the registry
    (:func:`rag_experiments.evaluation.walk.walk`) over the coverage arrays. Unanswerable queries: NaN."""
    a = ranked_arrays(ranked, gold)
    cov = coverage_arrays(a)
    shared = dict(new_gold=cov.new_gold, new_text=cov.new_text, gold_len=cov.gold_len)
    out: dict[str, np.ndarray] = {}
    for k in dict.fromkeys(int(k) for k in ks):
        out |= walk(shared, "retrieval", k=k)
    return mask_unanswerable(out, a.n_spans)


def mask_unanswerable(out: dict[str, np.ndarray], n_spans: np.ndarray) -> dict[str, np.ndarray]:
    """NaN for queries without gold spans: retrieval metrics exclude unanswerable items."""
    answerable = np.asarray(n_spans) > 0
    return {key: np.where(answerable, v, np.nan) for key, v in out.items()}
