"""The retrieval half of a run: chunk the corpus, rank every query, rerank, and score the ranking
(per-query retrieval metrics, equal-budget metrics, the first stage's metrics beside the final
list's). ``run.pipeline`` composes it with the generation half; retrieval and generation are
measured separately, so neither half reads the other's results."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from rag_experiments.core.cache import StageCache, stable_hash, stage_key
from rag_experiments.core.progress import Progress, track
from rag_experiments.core.steps import StepRecord
from rag_experiments.core.types import Chunk, Document
from rag_experiments.evaluation import metrics as M
from rag_experiments.evaluation.budget import budgeted_metrics
from rag_experiments.run.types import RunSettings
from rag_experiments.stages.chunking import chunk_corpus
from rag_experiments.stages.query import rrf_lists
from rag_experiments.stages.rerank import RerankError, rerank_order, timed_scores
from rag_experiments.stages.text import token_ends, tokenizer_identity

log = logging.getLogger(__name__)


def chunk_stage(
    docs: list[Document],
    corpus_digest: str,
    chunker,
    chunking_cfg: dict,
    cache: StageCache,
    progress: bool = True,
):
    key = stage_key("chunks", corpus_digest, chunking_cfg)
    chunks = cache.get_chunks(key, docs)  # verified: bytes, and every chunk a span of its doc
    if chunks is None:
        chunks = []
        # same order as chunk_corpus(chunker, docs); a line per 10 % only for large corpora
        for doc in track(docs, "chunking", enabled=progress and len(docs) >= 200, unit="docs"):
            chunks.extend(chunk_corpus(chunker, [doc]))
        cache.put_chunks(key, chunks)
    return chunks, key


@dataclass
class Ranking:
    """Every query ranked to ``depth``: chunk indices (-1: none) and scores, row per query."""

    idx: np.ndarray
    scores: np.ndarray
    key: str  # the rankings cache key
    calls: int = 0  # retriever runs (0: from the cache)
    seconds: float = 0.0


def retrieval_stage(
    retriever, chunks: list[Chunk], chunks_key: str, queries: list[str], depth: int, cache: StageCache
) -> Ranking:
    """Rank once at ``depth`` (the largest k any metric or the generator needs); cached."""
    key = stage_key("rankings", retriever.identity, chunks_key, queries, depth)
    hit = cache.get_array("rankings", key)
    if hit is not None:
        return Ranking(hit["idx"], hit["scores"], key)
    retriever.index(chunks)
    idx, scores = retriever.search(queries, depth)
    cache.put_array(
        "rankings", key, idx=np.asarray(idx, dtype=np.int64), scores=np.asarray(scores, dtype=np.float32)
    )
    return Ranking(idx, scores, key, calls=1)


@dataclass
class Reranked:
    """The final list after the reranker, and per query the reranker's seconds (measured when the
    scores were computed, kept with them in the cache; NaN when it failed) and its error ("" when
    reranked)."""

    ranking: Ranking
    seconds: np.ndarray
    errors: list[str]
    calls: int = 0  # queries sent to the reranker (0: all from the cache)


def rerank_stage(reranker, chunks: list[Chunk], queries: list[str], first: Ranking, cache: StageCache,
                 progress: bool = True) -> Reranked:
    """Re-score each query's first ``reranker.candidates`` first-stage chunks and re-sort them
    (``stages.rerank.rerank_order``; deeper ranks keep first-stage order). Scores are cached per
    query by (reranker identity, query, candidate texts) and committed per batch of
    ``reranker.query_batch`` queries, so a killed run resumes with only the missing queries. A query
    the reranker fails on (``RerankError``) keeps its first-stage order, is not cached, and is
    counted (``n_rerank_errors``); so is a query whose scores are not one finite number per
    candidate (a cross-encoder's NaN is an error, never a score)."""
    heads = [[int(i) for i in row[: reranker.candidates] if i >= 0] for row in first.idx]
    texts = [[chunks[i].text for i in h] for h in heads]
    keys = [stage_key("rerank", reranker.identity, q, ts) for q, ts in zip(queries, texts, strict=True)]
    found = cache.get_json_many("rerank", keys)
    todo = list({k: i for i, k in enumerate(keys) if k not in found}.items())
    errors: dict[str, str] = {}
    batch = max(1, int(getattr(reranker, "query_batch", 16)))
    with Progress("reranking", len(todo), enabled=progress and bool(todo), unit="queries") as bar:
        for a in range(0, len(todo), batch):
            part = todo[a : a + batch]
            try:
                scores, secs = timed_scores(reranker, [queries[i] for _, i in part], [texts[i] for _, i in part])
            except RerankError as e:
                errors.update({k: str(e) for k, _ in part})
                log.warning("reranker: %s", e)
            else:
                fresh = {}
                for (k, qi), sc in zip(part, scores, strict=True):
                    sc = np.asarray(sc, dtype=np.float64)
                    if len(sc) != len(texts[qi]) or not np.isfinite(sc).all():  # an error, never a score
                        errors[k] = f"reranker returned {len(sc)} scores for {len(texts[qi])} candidates, " \
                                    f"{int((~np.isfinite(sc)).sum())} not finite"  # fmt: skip
                        log.warning("reranker: %s", errors[k])
                    else:
                        fresh[k] = {"scores": [float(x) for x in sc], "seconds": secs}
                cache.put_json_many("rerank", fresh)
                found.update(fresh)
            bar.update(len(part))
    idx, sc = first.idx.copy(), first.scores.copy()
    seconds = np.full(len(queries), np.nan)  # a failed query: its time is not a reranker's latency
    for qi, k in enumerate(keys):
        if k not in found:
            continue
        s = np.asarray(found[k]["scores"], dtype=np.float32)
        order = np.argsort(-s.astype(np.float64), kind="stable")
        idx[qi] = rerank_order(first.idx[qi], s)
        sc[qi, : len(s)] = s[order]
        seconds[qi] = found[k]["seconds"]
    key = stage_key("rerank", reranker.identity, first.key)
    return Reranked(Ranking(idx, sc, key), seconds, [errors.get(k, "") for k in keys], len(todo))


@dataclass
class ChunkTokens:
    """Token end offsets of every chunk (``stages.text.token_ends``) under ``tokenizer``."""

    ends: np.ndarray
    ptr: np.ndarray
    tokenizer: str  # the budget tokenizer's identity (run tag token_budget_tokenizer)
    key: str  # the chunk_tokens cache key


def chunk_tokens_stage(chunks: list[Chunk], chunks_key: str, cache: StageCache) -> ChunkTokens:
    """Token end offsets of every chunk under the fixed budget tokenizer, once per chunk set.

    Cached with the chunks: the key is (chunks key, tokenizer identity).
    """
    ident = tokenizer_identity()
    key = stage_key("chunk_tokens", chunks_key, ident)
    hit = cache.get_array("chunk_tokens", key)
    if hit is not None:
        return ChunkTokens(hit["ends"], hit["ptr"], ident, key)
    ends, ptr = token_ends([c.text for c in chunks])
    cache.put_array("chunk_tokens", key, ends=ends, ptr=ptr)
    return ChunkTokens(ends, ptr, ident, key)


def retrieval_rows(items, ranked, scores, per_q, latency_s: float) -> list[dict[str, Any]]:
    """One per-query row: gold spans, the ranked chunks with scores, every retrieval metric."""
    rows = []
    for qi, it in enumerate(items):
        retrieved = [
            {
                "rank": r + 1,
                "chunk_id": c.chunk_id,
                "doc_id": c.doc_id,
                "start": c.start,
                "end": c.end,
                "score": round(float(scores[qi][r]), 6),
            }
            for r, c in enumerate(ranked[qi])
        ]
        rows.append(
            {
                "id": it.id,
                "query": it.query,
                "tags": list(it.tags),
                "gold_spans": [{"doc_id": s.doc_id, "start": s.start, "end": s.end} for s in it.gold_spans],
                "retrieved": retrieved,
                **{name: float(v[qi]) for name, v in per_q.items()},
                "latency_retrieval_s": latency_s,
                "error": None,
            }
        )
    return rows


@dataclass
class RetrievalScores:
    """Per-query retrieval metrics (name -> one value per query), run tags, run-level metrics."""

    per_query: dict[str, np.ndarray]
    tags: dict[str, str]
    run_metrics: dict[str, float]


def retrieval_scores(
    retriever, items, chunks, idx, ranked, settings: RunSettings, cache_keys: dict[str, str], cache
) -> RetrievalScores:
    """Chunk-count metrics, token-level and budgeted metrics (docs/metrics.md), and the retriever's
    run-level metrics, e.g. ANN recall (docs/scale.md)."""
    all_ks, min_coverage = settings.all_ks, settings.min_coverage
    gold = [it.gold_spans for it in items]
    per_q = M.retrieval_metrics(ranked, gold, chunks, all_ks, min_coverage, rank_depth=settings.rank_depth)
    per_q.update(M.token_metrics(ranked, gold, all_ks))
    run_tags: dict[str, str] = {}
    if settings.token_budgets:
        tok = chunk_tokens_stage(chunks, cache_keys["chunks"], cache)
        cache_keys["chunk_tokens"] = tok.key
        per_q.update(
            budgeted_metrics(idx, chunks, gold, tok.ends, tok.ptr, list(settings.token_budgets), min_coverage)
        )
        run_tags["token_budget_tokenizer"] = tok.tokenizer
    run_metrics = getattr(retriever, "run_metrics", None)
    queries = [it.query for it in items]
    extra = run_metrics(chunks, cache_keys["chunks"], queries, all_ks, cache) if run_metrics else {}
    return RetrievalScores(per_q, run_tags, extra)


def _multi_query_ranking(transform, retriever, chunks, chunks_key, q, depth: int, cache) -> Ranking:
    """Every search text ranked (one cached ranking of the flattened list), then each question's
    lists fused by reciprocal rank (``stages.query.rrf_lists``)."""
    flat = [t for texts in q.search_queries for t in texts]
    ranked = retrieval_stage(retriever, chunks, chunks_key, flat, depth, cache)
    idx = np.full((len(q.search_queries), depth), -1, dtype=np.int64)
    sc = np.full((len(q.search_queries), depth), -np.inf, dtype=np.float32)
    at = 0
    for qi, texts in enumerate(q.search_queries):
        idx[qi], sc[qi] = rrf_lists(list(ranked.idx[at : at + len(texts)]), depth, transform.rrf_c)
        at += len(texts)
    key = stable_hash("multi_query", ranked.key, transform.rrf_c, depth)
    return Ranking(idx, sc, key, calls=ranked.calls)


def _hyde_ranking(transform, retriever, chunks, chunks_key, questions, q, depth: int, cache) -> Ranking:
    """A dense retriever searches the mixed vectors (``HydeQuery.vectors``); any other retriever
    searches ``HydeQuery.text_query``."""
    if not hasattr(retriever, "search_vectors"):
        texts = [transform.text_query(x, out) for x, out in zip(questions, q.outputs, strict=True)]
        return retrieval_stage(retriever, chunks, chunks_key, texts, depth, cache)
    retriever.index(chunks)  # the corpus's vectors (and an ANN index) come from their caches
    answers = [out[0] if out else None for out in q.outputs]
    idx, sc = retriever.search_vectors(transform.vectors(retriever.embedder, questions, answers), depth)
    key = stable_hash("hyde", retriever.identity, chunks_key, transform.identity, questions, answers, depth)
    return Ranking(np.asarray(idx, dtype=np.int64), np.asarray(sc, dtype=np.float32), key, calls=1)


def transformed_ranking(transform, retriever, chunks: list[Chunk], chunks_key: str, questions: list[str],
                        q, depth: int, cache: StageCache) -> Ranking:  # fmt: skip
    """The ranking of what the transform says to search: fused variants (multi_query), a HyDE
    search, or the rewritten queries."""
    if transform.kind == "multi_query":
        return _multi_query_ranking(transform, retriever, chunks, chunks_key, q, depth, cache)
    if transform.kind == "hyde":
        return _hyde_ranking(transform, retriever, chunks, chunks_key, questions, q, depth, cache)
    texts = [s[0] for s in q.search_queries]  # rewrite: one text per question
    return retrieval_stage(retriever, chunks, chunks_key, texts, depth, cache)


class ChunkStep:
    """The ``chunking`` slot as a step: the corpus's chunks, from the cache or the chunker."""

    slot = "chunker"

    def run(self, st, ctx) -> StepRecord:
        d = ctx.data
        st.chunks, st.chunks_key = chunk_stage(d.docs, d.corpus_digest, ctx.stages.chunker, ctx.stages.chunking_cfg,
                                               ctx.cache, ctx.settings.progress)  # fmt: skip
        st.cache_keys["chunks"] = st.chunks_key
        return StepRecord(self.slot, len(d.docs))


class RetrieveStep:
    """The ``retriever`` slot as a step: every query ranked ``depth`` deep (the reranker's
    candidates when there is one); with a query transform, what it says to search."""

    slot = "retriever"

    def run(self, st, ctx) -> StepRecord:

        s, reranker = ctx.stages, ctx.stages.reranker
        depth = ctx.settings.depth if reranker is None else max(ctx.settings.depth, reranker.candidates)
        with Progress("retrieval", None, enabled=ctx.settings.progress):  # start/done; embedding shows blocks
            if st.queried is None:
                st.ranking = retrieval_stage(s.retriever, st.chunks, st.chunks_key, st.queries, depth, ctx.cache)
            else:  # the retriever searches what the transform says (docs/stages.md)
                st.ranking = transformed_ranking(s.query_transform, s.retriever, st.chunks, st.chunks_key, st.queries,
                                              st.queried, depth, ctx.cache)  # fmt: skip
        st.cache_keys["rankings"] = st.ranking.key
        return StepRecord(self.slot, len(st.queries), calls={"retrieval": st.ranking.calls})


class RerankStep:
    """The ``rerank`` slot as a step: the first stage's metrics (``first_stage/<key>``), then the
    reranked list replaces the first stage's. A query it fails on keeps first-stage order and is
    counted; every query failing fails the run (``run.steps.failure_reason``)."""

    slot = "reranker"

    def run(self, st, ctx) -> StepRecord:
        items, chunks, ranking = ctx.data.items, st.chunks, st.ranking
        first_ranked = [[chunks[i] for i in row if i >= 0] for row in ranking.idx]
        st.first_stage = retrieval_scores(
            None, items, chunks, ranking.idx, first_ranked, ctx.settings, st.cache_keys, ctx.cache
        ).per_query
        warn_rerank_cost(ctx.stages.reranker, len(chunks), len(st.queries))
        st.reranked = rerank_stage(ctx.stages.reranker, chunks, st.queries, ranking, ctx.cache, ctx.settings.progress)
        st.ranking = st.reranked.ranking
        st.cache_keys["rerank"] = st.ranking.key
        errors = [e for e in st.reranked.errors if e]
        return StepRecord(self.slot, len(st.queries), len(errors), {"rerank": st.reranked.calls},
                          first_error=errors[0] if errors else "")  # fmt: skip

    def columns(self, st, rows: list[dict]) -> None:
        rerank_columns(rows, st.first_stage, st.reranked)


def warn_rerank_cost(reranker, n_chunks: int, n_queries: int) -> int:
    """Say what ``rerank.candidates`` costs before paying it: candidates beyond the corpus's chunks
    rerank every chunk, and a reranker making one model call per candidate (the LLM reranker,
    ``calls_per_candidate``) makes that many calls per query. Returns the model calls per query."""
    per_query = min(reranker.candidates, n_chunks) * getattr(reranker, "calls_per_candidate", 0)
    if reranker.candidates > n_chunks:
        log.warning("rerank.candidates=%d exceeds the %d chunks: every chunk is reranked", reranker.candidates, n_chunks)
    if per_query > 50:
        log.warning("the reranker makes %d model calls per query (%d in all for %d queries): lower rerank.candidates "
                    "to spend less", per_query, per_query * n_queries, n_queries)  # fmt: skip
    return per_query


def first_stage_aggregates(df: pd.DataFrame) -> dict[str, float]:
    """``first_stage/<key>``: the mean over queries (NaN left out) of every first-stage retrieval
    metric, beside ``<key>`` on the reranked list, so a run says what its reranker added."""
    once = df.drop_duplicates("id") if "id" in df else df  # replicates repeat the retrieval columns
    return {c: float(np.nanmean(once[c].to_numpy(dtype=float))) for c in once if c.startswith("first_stage/")}


def rerank_columns(rows: list[dict], first_stage: dict, reranked) -> None:
    """Each row's ``first_stage/<key>`` values, reranker seconds and reranker error (None: none)."""
    for qi, row in enumerate(rows):
        row.update({f"first_stage/{name}": float(v[qi]) for name, v in first_stage.items()})
        row.update(latency_rerank_s=float(reranked.seconds[qi]), rerank_error=reranked.errors[qi] or None)
