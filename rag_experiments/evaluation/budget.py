"""Token-budgeted retrieval metrics: the ranked chunks fill a context of B tokens (docs/metrics.md).

Chunkers of different sizes are compared at equal context cost: the context for budget B is the
ranked chunks in order, each whole while it fits, the first one that does not fit cut after the
tokens that still fit, nothing after it. Tokens are counted by one fixed tokenizer
(:func:`rag_experiments.stages.text.minilm_tokenizer`, named in the run tag
``token_budget_tokenizer``) on each chunk's own text, as the generator receives it: text shared by
two overlapping chunks is paid for twice. Metrics are then computed on that context with the
same relevance and coverage rules as the top-k metrics (:mod:`rag_experiments.evaluation.metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from rag_experiments.core.types import Chunk, Span
from rag_experiments.evaluation.defaults import MIN_COVERAGE
from rag_experiments.evaluation.metrics import (
    coverage_arrays,
    evidence_recall_at_k,
    mask_unanswerable,
    ranked_arrays,
    span_hits,
    token_precision_at_k,
)
from rag_experiments.evaluation.walk import walk

__all__ = [
    "budget_ends",
    "budgeted_metrics",
    "evidence_recall_in_budget",
    "hit_in_budget",
    "token_precision_in_budget",
]


def budget_ends(
    idx: np.ndarray,
    c_start: np.ndarray,
    c_end: np.ndarray,
    tok_ends: np.ndarray,
    tok_ptr: np.ndarray,
    budget: int,
) -> np.ndarray:
    """Where each ranked chunk's part of a ``budget``-token context ends (character offset).

    ``idx``: (n_queries, n_ranks) chunk indices, -1 = padding; ``c_start``/``c_end``: the chunks'
    offsets at those ranks; ``tok_ends``/``tok_ptr``: token end offsets of every chunk, relative to
    its text (:func:`rag_experiments.stages.text.token_ends`). With ``n[q, r]`` the tokens of the
    chunk at rank r and ``before = Σ_{r' < r} n[q, r']``, the chunk gets ``take = clip(budget -
    before, 0, n)`` tokens: its end is ``c_end`` when ``take == n`` (whole), ``c_start +
    tok_ends[ptr + take - 1]`` when ``0 < take < n`` (cut), ``c_start`` when ``take == 0`` (not in
    the context: an empty piece, relevant to nothing). A chunk the tokenizer gives no token costs
    nothing and is kept while budget remains. Fewer ranked chunks than the budget holds: the
    context is just shorter.
    """
    if budget < 1:
        raise ValueError(f"token budget must be >= 1, got {budget}")
    idx = np.asarray(idx, dtype=np.int64)
    valid = idx >= 0
    safe = np.where(valid, idx, 0)
    n_tok = np.where(valid, tok_ptr[safe + 1] - tok_ptr[safe], 0)
    before = np.cumsum(n_tok, axis=1) - n_tok
    take = np.clip(budget - before, 0, n_tok)
    whole = valid & (take == n_tok) & ((n_tok > 0) | (before < budget))
    cut = valid & (take > 0) & (take < n_tok)
    flat = np.clip(tok_ptr[safe] + take - 1, 0, max(len(tok_ends) - 1, 0))
    cut_end = c_start + (tok_ends[flat] if len(tok_ends) else 0)
    return np.where(whole, c_end, np.where(cut, cut_end, c_start))


def evidence_recall_in_budget(
    span_new: np.ndarray, span_len: np.ndarray, n_spans: np.ndarray, min_coverage: float = MIN_COVERAGE
) -> np.ndarray:
    """``evidence_recall_at_{B}tok``: the coverage rule of
    :func:`~rag_experiments.evaluation.metrics.evidence_recall_at_k` over the whole B-token context
    (``span_new`` from its cut ends): span s is recalled when the context covers at least
    ``min_coverage`` of its characters (and one); ``recall[q] = |recalled| / n_spans[q]``."""
    return evidence_recall_at_k(span_new, span_len, n_spans, max(span_new.shape[1], 1), min_coverage)


def hit_in_budget(kept_hits: np.ndarray, whole_hits: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """``hit_at_{B}tok``: 1 if some piece of the B-token context is relevant to a gold span.

    ``kept_hits[q, r, s]``: relevance of the kept part of the chunk at rank r to span s;
    ``whole_hits``: of the whole chunk; ``cut[q, r]``: the chunk was cut. A cut chunk counts only
    when its kept part *and* the whole chunk are relevant: a cut must not turn a chunk that
    straddles the span into one that "lies inside" it (hit would then fall as B grows).
    ``hit[q] = 1[∃ r, s : kept[q, r, s] ∧ (¬cut[q, r] ∨ whole[q, r, s])]``."""
    hits = np.where(cut[:, :, None], kept_hits & whole_hits, kept_hits)
    return hits.any(axis=(1, 2)).astype(float)


def token_precision_in_budget(new_gold: np.ndarray, new_text: np.ndarray) -> np.ndarray:
    """``token_precision_at_{B}tok``: gold characters / characters of the B-token context (union,
    shared text once), :func:`~rag_experiments.evaluation.metrics.token_precision_at_k` over the
    whole context; an empty context: 0."""
    return token_precision_at_k(new_gold, new_text, max(new_gold.shape[1], 1))


def budgeted_metrics(
    idx: np.ndarray,
    chunks: Sequence[Chunk],
    gold: Sequence[Sequence[Span]],
    tok_ends: np.ndarray,
    tok_ptr: np.ndarray,
    budgets: Iterable[int],
    min_coverage: float = MIN_COVERAGE,
) -> dict[str, np.ndarray]:
    """Per query, for each budget B, every ``{B}tok`` metric of the registry on the B-token context
    (:func:`budget_ends`), computed by walking the registry (:mod:`rag_experiments.evaluation.walk`)
    over that context's relevance and coverage arrays: ``evidence_recall_at_{B}tok``,
    ``hit_at_{B}tok``, ``token_precision_at_{B}tok`` (:func:`evidence_recall_in_budget`,
    :func:`hit_in_budget`, :func:`token_precision_in_budget`).

    ``idx``: (n_queries, n_ranks) indices into ``chunks``, -1 = padding (the ranking, deep enough to
    fill the largest budget: ``metrics.rank_depth``). Unanswerable queries: NaN.
    """
    idx = np.asarray(idx, dtype=np.int64)
    if len(tok_ptr) != len(chunks) + 1:
        raise ValueError(f"token offsets are for {len(tok_ptr) - 1} chunks, not {len(chunks)}")
    ranked = [[chunks[i] for i in row if i >= 0] for row in idx]
    a = ranked_arrays(ranked, gold)
    # ranked_arrays drops padding; -1 entries come after the real ones, so columns still line up.
    ridx = np.full(a.c_doc.shape, -1, dtype=np.int64)
    for q, row in enumerate(idx):
        real = row[row >= 0]
        ridx[q, : len(real)] = real
    whole_hits = span_hits(a, min_coverage)
    out: dict[str, np.ndarray] = {}
    for b in dict.fromkeys(int(b) for b in budgets):
        end = budget_ends(ridx, a.c_start, a.c_end, tok_ends, tok_ptr, b)
        cov = coverage_arrays(a, c_end=end)
        inputs = dict(
            span_new=cov.span_new, span_len=cov.span_len, n_spans=a.n_spans, new_gold=cov.new_gold,
            new_text=cov.new_text, kept_hits=span_hits(a, min_coverage, c_end=end), whole_hits=whole_hits,
            cut=end < a.c_end, min_coverage=min_coverage,
        )  # fmt: skip
        out |= walk(inputs, "retrieval", B=b)  # the {B}tok metrics of the registry
    return mask_unanswerable(out, a.n_spans)
