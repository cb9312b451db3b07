"""Retrieval metrics: the seed's worked example, a cross-check against ranx, relevance edges, CIs."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from rag_experiments.core.types import Chunk, ScoredChunk, Span
from rag_experiments.evaluation.aggregate import mean_ci
from rag_experiments.evaluation.metrics import (
    context_precision_at_k,
    evidence_recall_at_k,
    hit_at_k,
    ndcg_at_k,
    reciprocal_rank,
    relevance,
    relevance_arrays,
    retrieval_metrics,
)


def chunk(doc: str, start: int, end: int) -> Chunk:
    return Chunk(f"{doc}#{start}-{end}", doc, start, end, "x" * (end - start))


def rel_from_ranks(ranks: list[list[int]], width: int = 5) -> np.ndarray:
    rel = np.zeros((len(ranks), width), dtype=bool)
    for q, rs in enumerate(ranks):
        for r in rs:
            rel[q, r - 1] = True
    return rel


# --------------------------------------------------------------------------- seed example


def test_seed_worked_example() -> None:
    """The seed article: first relevant ranks 1, 3, absent, 2, 1; relevant in top 5: 4, 3, 2, 4, 5.

    The seed scores hit@5 and MRR against one *gold* chunk per query, and context precision against
    every chunk judged relevant. For query 3 these disagree (its gold chunk is absent from the top 5
    while two other relevant chunks are there), so one boolean matrix cannot reproduce all three
    numbers. We build the two matrices the seed implies:

    - ``rel_gold``: True only at the gold chunk's rank (none for query 3) → hit@5 and RR;
    - ``rel_judged``: the judged-relevant ranks, consistent with the first ranks where the gold
      chunk is retrieved (q1: 1-4, q2: 3-5, q4: 2-5, q5: 1-5) and two hits for q3 (ranks 4, 5)
      → context precision@5.
    """
    rel_gold = rel_from_ranks([[1], [3], [], [2], [1]])
    rel_judged = rel_from_ranks([[1, 2, 3, 4], [3, 4, 5], [4, 5], [2, 3, 4, 5], [1, 2, 3, 4, 5]])

    assert hit_at_k(rel_gold, 5).tolist() == [1, 1, 0, 1, 1]
    assert hit_at_k(rel_gold, 5).mean() == pytest.approx(0.80)
    assert reciprocal_rank(rel_gold).mean() == pytest.approx((1 + 1 / 3 + 0 + 1 / 2 + 1) / 5)
    assert round(reciprocal_rank(rel_gold).mean(), 4) == 0.5667
    assert context_precision_at_k(rel_judged, 5).tolist() == [0.8, 0.6, 0.4, 0.8, 1.0]
    assert context_precision_at_k(rel_judged, 5).mean() == pytest.approx(0.72)
    # Where the two notions agree (queries 1, 2, 4, 5) the judged matrix gives the same hit and RR.
    agree = [0, 1, 3, 4]
    np.testing.assert_allclose(reciprocal_rank(rel_judged)[agree], reciprocal_rank(rel_gold)[agree])


# --------------------------------------------------------------------------- metric edges


def test_fewer_than_k_and_empty_lists() -> None:
    rel = np.array([[True, False], [False, False]])
    assert context_precision_at_k(rel, 5).tolist() == [0.2, 0.0]  # divides by k, not by 2
    assert hit_at_k(rel, 10).tolist() == [1.0, 0.0]
    assert reciprocal_rank(rel).tolist() == [1.0, 0.0]
    assert ndcg_at_k(rel, np.array([1, 0]), 5).tolist() == [1.0, 0.0]  # no relevant chunk exists: 0
    empty = np.zeros((3, 0), dtype=bool)
    assert reciprocal_rank(empty).tolist() == [0, 0, 0]
    assert hit_at_k(empty, 3).tolist() == [0, 0, 0]
    with pytest.raises(ValueError):
        hit_at_k(rel, 0)


def test_ndcg_uses_all_existing_relevant_chunks() -> None:
    rel = np.array([[False, True, False]])
    # One relevant retrieved at rank 2; three exist, so IDCG sums three ranks (capped at k).
    expected = (1 / math.log2(3)) / (1 + 1 / math.log2(3) + 1 / math.log2(4))
    assert ndcg_at_k(rel, np.array([3]), 3)[0] == pytest.approx(expected)
    assert ndcg_at_k(rel, np.array([1]), 1)[0] == 0.0


def test_evidence_recall() -> None:
    """Coverage-based: span s is recalled once the top k cover >= min_coverage of its characters."""
    span_new = np.zeros((3, 4, 2))
    span_len = np.array([[10.0, 10.0], [20.0, 0.0], [0.0, 0.0]])
    span_new[0, 0, 0] = 10  # span 0 fully covered at rank 1
    span_new[0, 3, 1] = 6  # span 1 covered (0.6) only at rank 4
    span_new[1, 0, 0] = 4  # span of query 1: 4/20 at rank 1, 6 more at rank 2 -> 0.5
    span_new[1, 1, 0] = 6
    n_spans = np.array([2, 1, 0])
    np.testing.assert_allclose(evidence_recall_at_k(span_new, span_len, n_spans, 1), [0.5, 0.0, np.nan])
    np.testing.assert_allclose(evidence_recall_at_k(span_new, span_len, n_spans, 3), [0.5, 1.0, np.nan])
    np.testing.assert_allclose(evidence_recall_at_k(span_new, span_len, n_spans, 4), [1.0, 1.0, np.nan])
    # min_coverage 0 still needs one covered character; padding spans never count
    np.testing.assert_allclose(
        evidence_recall_at_k(span_new, span_len, n_spans, 1, min_coverage=0.0), [0.5, 1.0, np.nan]
    )


def test_tiny_chunk_inside_a_long_span_no_longer_recalls_it() -> None:
    """The hit rule still counts a chunk wholly inside a span; evidence recall credits its characters."""
    span = Span("d", 0, 1000)
    tiny = chunk("d", 400, 420)  # 2 % of the span, wholly inside
    assert relevance(tiny, span)  # hit rule: min_coverage or wholly inside
    m = retrieval_metrics([[tiny]], [[span]], [tiny], ks=[1])
    assert m["hit_at_1"][0] == 1.0
    assert m["evidence_recall_at_1"][0] == 0.0
    # Enough small pieces together do recall it: 25 chunks of 20 characters = 50 %.
    pieces = [chunk("d", s, s + 20) for s in range(0, 500, 20)]
    m = retrieval_metrics([pieces], [[span]], pieces, ks=[24, 25])
    assert m["evidence_recall_at_24"][0] == 0.0 and m["evidence_recall_at_25"][0] == 1.0


def test_mrr_depth_is_fixed_and_independent_of_ks() -> None:
    rng = np.random.default_rng(3)
    all_chunks = [chunk("d", s, s + 10) for s in range(0, 2000, 10)]
    gold = [[Span("d", int(s), int(s) + 10)] for s in rng.integers(0, 199, 40) * 10]
    ranked = [[all_chunks[i] for i in rng.permutation(len(all_chunks))[:120]] for _ in gold]
    a = retrieval_metrics(ranked, gold, all_chunks, ks=[1, 3], rank_depth=100)
    b = retrieval_metrics(ranked, gold, all_chunks, ks=[5, 10, 20, 50], rank_depth=100)
    np.testing.assert_array_equal(a["mrr"], b["mrr"])
    # the depth is a real cut-off: a first relevant chunk at rank 101..120 scores 0, not 1/rank
    full = retrieval_metrics(ranked, gold, all_chunks, ks=[1])["mrr"]
    late = (full > 0) & (full < 1 / 100)
    assert late.any() and (a["mrr"][late] == 0).all()
    np.testing.assert_array_equal(a["mrr"][~late], full[~late])


# --------------------------------------------------------------------------- relevance


@pytest.mark.parametrize(
    ("c", "span", "expected"),
    [
        (chunk("d", 0, 15), Span("d", 10, 20), True),  # covers exactly 0.5 of the span
        (chunk("d", 0, 14), Span("d", 10, 20), False),  # 0.4
        (chunk("d", 15, 40), Span("d", 10, 20), True),  # 0.5 from the right
        (chunk("d", 16, 40), Span("d", 10, 20), False),
        (chunk("d", 0, 100), Span("d", 10, 20), True),  # contains the whole span
        (chunk("d", 12, 14), Span("d", 10, 20), True),  # wholly inside a longer span (0.2 coverage)
        (chunk("d", 10, 20), Span("d", 10, 20), True),
        (chunk("e", 10, 20), Span("d", 10, 20), False),  # other document
        (chunk("d", 20, 30), Span("d", 10, 20), False),  # adjacent, no shared character
        (chunk("d", 5, 10), Span("d", 10, 10), False),  # empty span: relevant to nothing
    ],
)
def test_relevance_edges(c: Chunk, span: Span, expected: bool) -> None:
    assert relevance(c, span) is expected


def test_relevance_threshold_parameter() -> None:
    c, span = chunk("d", 0, 12), Span("d", 10, 20)  # 0.2 coverage, not inside
    assert not relevance(c, span, min_coverage=0.5)
    assert relevance(c, span, min_coverage=0.2)
    assert relevance(c, span, min_coverage=0.0)


def test_relevance_arrays_agree_with_relevance() -> None:
    rng = np.random.default_rng(1)
    docs = ["a", "b", "c"]
    by_id = {}
    for s in rng.integers(0, 200, 150).tolist():
        c = chunk(docs[rng.integers(3)], s, s + int(rng.integers(1, 40)))
        by_id[c.chunk_id] = c
    all_chunks = list(by_id.values())
    ranked, gold = [], []
    for _ in range(60):
        n_r = int(rng.integers(0, 12))
        ranked.append([all_chunks[i] for i in rng.integers(0, len(all_chunks), n_r)])
        spans = []
        for _ in range(int(rng.integers(0, 4))):
            s = int(rng.integers(0, 200))
            spans.append(Span(docs[rng.integers(3)], s, s + int(rng.integers(1, 60))))
        gold.append(spans)
    for min_cov in (0.5, 0.3, 1.0):
        rel, span_hit, n_relevant = relevance_arrays(ranked, gold, all_chunks, min_cov)
        for q in range(len(ranked)):
            for r in range(rel.shape[1]):
                for s in range(span_hit.shape[2]):
                    want = (
                        r < len(ranked[q])
                        and s < len(gold[q])
                        and relevance(ranked[q][r], gold[q][s], min_cov)
                    )
                    assert span_hit[q, r, s] == want
                assert rel[q, r] == span_hit[q, r].any()
            expected_n = sum(any(relevance(c, sp, min_cov) for sp in gold[q]) for c in all_chunks)
            assert n_relevant[q] == expected_n


# --------------------------------------------------------------------------- end to end


def test_retrieval_metrics_keys_and_unanswerable() -> None:
    c1, c2, c3, c4 = chunk("a", 0, 10), chunk("a", 10, 20), chunk("b", 0, 10), chunk("b", 10, 20)
    all_chunks = [c1, c2, c3, c4]
    ranked = [
        [ScoredChunk(c3, 0.9), ScoredChunk(c1, 0.8), ScoredChunk(c2, 0.1)],  # ScoredChunk accepted
        [c1, c2],
        [c4],
    ]
    gold = [
        [Span("a", 2, 8), Span("a", 12, 18)],  # two spans: multi-chunk evidence
        [Span("b", 0, 20)],  # not retrieved; c3 and c4 are relevant and exist
        [],  # unanswerable
    ]
    m = retrieval_metrics(ranked, gold, all_chunks, ks=[1, 3])
    assert list(m) == [
        "hit_at_1",
        "evidence_recall_at_1",
        "context_precision_at_1",
        "ndcg_at_1",
        "hit_at_3",
        "evidence_recall_at_3",
        "context_precision_at_3",
        "ndcg_at_3",
        "mrr",
    ]
    assert all(v.shape == (3,) and np.isnan(v[2]) for v in m.values())
    np.testing.assert_allclose(m["hit_at_1"][:2], [0, 0])
    np.testing.assert_allclose(m["hit_at_3"][:2], [1, 0])
    np.testing.assert_allclose(m["evidence_recall_at_3"][:2], [1.0, 0.0])
    np.testing.assert_allclose(m["context_precision_at_3"][:2], [2 / 3, 0])
    np.testing.assert_allclose(m["mrr"][:2], [0.5, 0])
    ideal = 1 + 1 / math.log2(3)
    np.testing.assert_allclose(m["ndcg_at_3"][:2], [(1 / math.log2(3) + 1 / 2) / ideal, 0])


def relevant_at_k(rel: np.ndarray, k: int) -> np.ndarray:
    """A metric declared only in the test below: relevant chunks among the top k."""
    return rel[:, :k].sum(axis=1).astype(float)


def test_the_registry_is_the_dispatch(monkeypatch) -> None:
    """A retrieval metric is one function and one declaration: the walk computes a spec it has
    never seen from the arrays its parameters name, and a metric left out of the registry is not
    computed (``evaluation.walk``)."""
    from rag_experiments.evaluation import metric_table as M
    from rag_experiments.evaluation.metric_spec import MetricSpec

    c1, c2 = chunk("a", 0, 10), chunk("a", 10, 20)
    ranked, gold = [[c1, c2], [c2]], [[Span("a", 2, 8)], [Span("a", 2, 8)]]
    extra = MetricSpec("relevant_at_{k}", "retrieval", True, "continuous", "relevant chunks in the top k",
                       "tests.test_metrics.relevant_at_k")  # fmt: skip
    monkeypatch.setattr(M, "REGISTRY", (*M.REGISTRY, extra))
    m = retrieval_metrics(ranked, gold, [c1, c2], ks=[1, 2])
    np.testing.assert_allclose(m["relevant_at_1"], [1, 0])
    np.testing.assert_allclose(m["relevant_at_2"], [1, 0])
    assert list(m)[:5] == ["hit_at_1", "evidence_recall_at_1", "context_precision_at_1", "ndcg_at_1", "relevant_at_1"]
    monkeypatch.setattr(M, "REGISTRY", tuple(s for s in M.REGISTRY if s.pattern != "ndcg_at_{k}"))
    assert "ndcg_at_1" not in retrieval_metrics(ranked, gold, [c1, c2], ks=[1])


# --------------------------------------------------------------------------- ranx cross-check


def test_agrees_with_ranx_on_random_rankings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ranx import Qrels, Run, evaluate

    rng = np.random.default_rng(42)
    n_q, max_r = 300, 15
    lengths = rng.integers(1, max_r + 1, n_q)
    rel = np.zeros((n_q, max_r), dtype=bool)
    n_relevant = np.zeros(n_q, dtype=np.int64)
    qrels, run = {}, {}
    for q in range(n_q):
        qid = f"q{q:03d}"
        p = rng.uniform(0.0, 0.6)
        rel[q, : lengths[q]] = rng.random(lengths[q]) < p
        docs = [f"{qid}_d{r}" for r in range(lengths[q])]
        run[qid] = {d: float(max_r - r) for r, d in enumerate(docs)}
        relevant = [d for d, is_rel in zip(docs, rel[q], strict=False) if is_rel]
        # Relevant chunks that were not retrieved: they only change the ideal DCG. At least one
        # relevant id per query, as ranx needs a judged query.
        extra = int(rng.integers(0 if relevant else 1, 4))
        relevant += [f"{qid}_missing{i}" for i in range(extra)]
        qrels[qid] = {d: 1 for d in relevant}
        n_relevant[q] = len(relevant)
    ranx_run = Run(run)
    ks = [1, 3, 5, 10]
    names = [f"{m}@{k}" for k in ks for m in ("hit_rate", "precision", "ndcg")] + ["mrr"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluate(Qrels(qrels), ranx_run, names, return_mean=False)

    def theirs(name: str) -> np.ndarray:
        return np.array([ranx_run.scores[name][f"q{q:03d}"] for q in range(n_q)])

    for k in ks:
        np.testing.assert_allclose(hit_at_k(rel, k), theirs(f"hit_rate@{k}"), atol=1e-9, rtol=0)
        np.testing.assert_allclose(
            context_precision_at_k(rel, k), theirs(f"precision@{k}"), atol=1e-9, rtol=0
        )
        np.testing.assert_allclose(ndcg_at_k(rel, n_relevant, k), theirs(f"ndcg@{k}"), atol=1e-9, rtol=0)
    np.testing.assert_allclose(reciprocal_rank(rel), theirs("mrr"), atol=1e-9, rtol=0)
    assert (rel.sum(axis=1) == 0).any() and (n_relevant > rel.sum(axis=1)).any()  # edges exercised


# --------------------------------------------------------------------------- mean_ci


def test_mean_ci_excludes_and_counts_nan() -> None:
    values = np.array([1.0, np.nan, 0.0, 1.0, np.nan, 1.0])
    mean, low, high, n = mean_ci(values)
    assert n == 4
    assert mean == pytest.approx(0.75)
    assert 0.0 <= low <= mean <= high <= 1.0
    assert mean_ci(values) == (mean, low, high, n)  # fixed seed: identical CIs
    assert mean_ci(values, seed=0) == mean_ci([1.0, 0.0, 1.0, 1.0], seed=0)


def test_mean_ci_edges() -> None:
    nan_mean, nan_low, nan_high, n = mean_ci([np.nan, np.nan])
    assert n == 0 and all(math.isnan(x) for x in (nan_mean, nan_low, nan_high))
    assert mean_ci([])[3] == 0
    assert mean_ci([0.3]) == (0.3, 0.3, 0.3, 1)
    assert mean_ci([0.7] * 50) == (pytest.approx(0.7), pytest.approx(0.7), pytest.approx(0.7), 50)


def test_mean_ci_covers_the_mean_of_a_known_distribution() -> None:
    rng = np.random.default_rng(0)
    values = rng.binomial(1, 0.6, 400).astype(float)
    mean, low, high, n = mean_ci(values, n_resamples=2000, seed=3)
    se = math.sqrt(mean * (1 - mean) / n)
    # The percentile bootstrap of a mean is close to the normal interval mean ± 1.96 se.
    assert low == pytest.approx(mean - 1.96 * se, abs=0.01)
    assert high == pytest.approx(mean + 1.96 * se, abs=0.01)
    wide = mean_ci(values, confidence=0.99)
    assert wide[1] < low and wide[2] > high
