"""Run one resolved configuration over the eval set: chunk → retrieve → generate → judge → score.

``run_pipeline`` takes built stages (no Hydra, no MLflow), so tests and scripts call it directly.
Every stage goes through the content-addressed ``StageCache``; the per-query records it returns
carry everything the MLflow table, the failure labels and the statistics need.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from rag_experiments.cache import StageCache, stage_key
from rag_experiments.evaluation import metrics as M
from rag_experiments.evaluation.aggregate import aggregate
from rag_experiments.evaluation.budget import budgeted_metrics
from rag_experiments.evaluation.labels import RATE_LABELS, failure_label
from rag_experiments.evaluation.registry import GENERATION_METRICS
from rag_experiments.stages.chunking import chunk_corpus
from rag_experiments.types import Chunk, Document, EvalItem, Verdict

log = logging.getLogger(__name__)


@dataclass
class PipelineResult:
    per_query: pd.DataFrame
    aggregates: dict[str, float]
    cache_keys: dict[str, str]
    timings: dict[str, float]
    calls: dict[str, int] = field(default_factory=dict)
    n_chunks: int = 0
    tags: dict[str, str] = field(default_factory=dict)  # run tags, e.g. token_budget_tokenizer


def chunk_stage(docs: list[Document], corpus_digest: str, chunker, chunking_cfg: dict, cache: StageCache):
    key = stage_key("chunks", corpus_digest, chunking_cfg)
    chunks = cache.get_chunks(key)
    if chunks is None:
        chunks = chunk_corpus(chunker, docs)
        cache.put_chunks(key, chunks)
    return chunks, key


def retrieval_stage(
    retriever, chunks: list[Chunk], chunks_key: str, queries: list[str], depth: int, cache: StageCache
):
    """Rank once at ``depth`` (the largest k any metric or the generator needs); cached."""
    key = stage_key("rankings", retriever.identity, chunks_key, queries, depth)
    hit = cache.get_array("rankings", key)
    if hit is not None:
        return hit["idx"], hit["scores"], key
    retriever.index(chunks)
    idx, scores = retriever.search(queries, depth)
    cache.put_array(
        "rankings", key, idx=np.asarray(idx, dtype=np.int64), scores=np.asarray(scores, dtype=np.float32)
    )
    return idx, scores, key


def chunk_tokens_stage(chunks: list[Chunk], chunks_key: str, cache: StageCache):
    """Token end offsets of every chunk under the fixed budget tokenizer, once per chunk set.

    Cached with the chunks: the key is (chunks key, tokenizer identity). Returns
    ``(ends, ptr, tokenizer_identity, key)`` (see ``stages.text.token_ends``).
    """
    from rag_experiments.stages.text import token_ends, tokenizer_identity

    ident = tokenizer_identity()
    key = stage_key("chunk_tokens", chunks_key, ident)
    hit = cache.get_array("chunk_tokens", key)
    if hit is not None:
        return hit["ends"], hit["ptr"], ident, key
    ends, ptr = token_ends([c.text for c in chunks])
    cache.put_array("chunk_tokens", key, ends=ends, ptr=ptr)
    return ends, ptr, ident, key


def generation_stage(generator, prompts: list[list[dict]], cache: StageCache) -> tuple[list, int]:
    """Generations keyed by (generator identity, rendered prompt); only misses reach the model.

    Failed generations are not cached, so a re-run retries them.
    """
    keys = [stage_key("generation", generator.identity, p) for p in prompts]
    found = cache.get_json_many("generations", keys)
    todo = sorted({k: i for i, k in enumerate(keys) if k not in found}.items(), key=lambda kv: kv[1])
    from rag_experiments.types import Generation

    fresh: dict[str, Any] = {}
    if todo:
        outs = generator.generate([prompts[i] for _, i in todo])
        for (k, _), g in zip(todo, outs, strict=True):
            fresh[k] = g
        cache.put_json_many("generations", {k: asdict(g) for k, g in fresh.items() if not g.error})
    gens = []
    for k in keys:
        if k in fresh:
            gens.append(fresh[k])
        else:
            g = Generation(**found[k])
            g.cached = True
            gens.append(g)
    return gens, len(todo)


def judge_stage(
    judge,
    items: list[EvalItem],
    answers: list[str],
    contexts: list[str],
    cache: StageCache,
    progress: bool = True,
):
    """Claims, verdicts and answer relevance per query, each cached by what it depends on."""
    calls = Counter()
    out = []
    for item, answer, context in tqdm(
        list(zip(items, answers, contexts, strict=True)), desc="judge", disable=not progress, leave=False
    ):
        if answer is None:
            out.append(None)
            continue
        t0 = time.perf_counter()
        ck = stage_key("claims", judge.identity, answer)
        got = cache.get_json_many("claims", [ck])
        if ck in got:
            claims = got[ck]
        else:
            claims = judge.split(answer)
            calls["claims"] += 1
            cache.put_json_many("claims", {ck: claims})
        vkeys = [stage_key("verdict", judge.identity, c, context) for c in claims]
        found = cache.get_json_many("verdicts", vkeys)
        missing = list(dict.fromkeys(c for c, k in zip(claims, vkeys, strict=True) if k not in found))
        if missing:
            fresh = judge.verdicts(missing, context)
            calls["verdicts"] += len(missing)
            new = {stage_key("verdict", judge.identity, v.claim, context): asdict(v) for v in fresh}
            cache.put_json_many("verdicts", {k: v for k, v in new.items() if not v.get("error")})
            found.update(new)
        verdicts = [Verdict(**found[k]) for k in vkeys]
        rk = stage_key("relevance", judge.identity, item.query, answer)
        got = cache.get_json_many("relevance", [rk])
        if rk in got:
            rel, method = got[rk]
        else:
            rel, method = judge.answer_relevance(item.query, answer)
            calls["relevance"] += 1
            cache.put_json_many("relevance", {rk: [rel, method]})
        out.append((claims, verdicts, rel, method, time.perf_counter() - t0))
    return out, calls


def run_pipeline(
    docs: list[Document],
    corpus_digest: str,
    items: list[EvalItem],
    chunker,
    chunking_cfg: dict,
    retriever,
    k: int,
    ks: list[int],
    cache: StageCache,
    generator=None,
    prompt=None,
    judge=None,
    min_coverage: float = 0.5,
    thresholds: dict | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    progress: bool = True,
    rank_depth: int = 100,
    token_budgets: tuple[int, ...] | list[int] = (256, 512, 1024),
) -> PipelineResult:
    from rag_experiments.stages.judging import correctness, faithfulness

    timings: dict[str, float] = {}
    calls: Counter = Counter()
    t = time.perf_counter()
    chunks, chunks_key = chunk_stage(docs, corpus_digest, chunker, chunking_cfg, cache)
    timings["chunking_s"] = time.perf_counter() - t

    all_ks = sorted(set(ks) | {k})
    depth = max(*all_ks, rank_depth)  # MRR and the token budgets read past max(ks)
    queries = [it.query for it in items]
    t = time.perf_counter()
    before = cache.stats["rankings.miss"]
    idx, scores, ranking_key = retrieval_stage(retriever, chunks, chunks_key, queries, depth, cache)
    calls["retrieval"] += cache.stats["rankings.miss"] - before
    timings["retrieval_s"] = time.perf_counter() - t
    # retriever-specific run metrics, e.g. ANN recall against exact search (docs/scale.md)
    run_metrics = getattr(retriever, "run_metrics", None)
    retriever_metrics = run_metrics(chunks, chunks_key, queries, all_ks, cache) if run_metrics else {}
    ranked = [[chunks[i] for i in row if i >= 0] for row in idx]
    gold = [it.gold_spans for it in items]
    per_q = M.retrieval_metrics(ranked, gold, chunks, all_ks, min_coverage, rank_depth=rank_depth)
    per_q.update(M.token_metrics(ranked, gold, all_ks))
    run_tags: dict[str, str] = {}
    cache_keys = {"chunks": chunks_key, "rankings": ranking_key}
    if token_budgets:
        tok_ends, tok_ptr, tok_id, cache_keys["chunk_tokens"] = chunk_tokens_stage(chunks, chunks_key, cache)
        per_q.update(budgeted_metrics(idx, chunks, gold, tok_ends, tok_ptr, token_budgets, min_coverage))
        run_tags["token_budget_tokenizer"] = tok_id
    shown = max(all_ks)  # the per-query table lists the ranks the top-k metrics see

    rows: list[dict[str, Any]] = []
    for qi, it in enumerate(items):
        rows.append(
            {
                "id": it.id,
                "query": it.query,
                "tags": list(it.tags),
                "gold_spans": json.dumps([[s.doc_id, s.start, s.end] for s in it.gold_spans]),
                "retrieved": json.dumps(
                    [
                        {
                            "rank": r + 1,
                            "chunk_id": c.chunk_id,
                            "doc_id": c.doc_id,
                            "start": c.start,
                            "end": c.end,
                            "score": round(float(scores[qi][r]), 6),
                        }
                        for r, c in enumerate(ranked[qi][:shown])
                    ]
                ),
                **{name: float(v[qi]) for name, v in per_q.items()},
                "latency_retrieval_s": timings["retrieval_s"] / max(len(items), 1),
                "error": None,
            }
        )

    hit_key = f"hit_at_{k}"
    if generator is not None:
        contexts_chunks = [r[:k] for r in ranked]
        prompts = [prompt.render(it.query, cs) for it, cs in zip(items, contexts_chunks, strict=True)]
        t = time.perf_counter()
        gens, n_gen = generation_stage(generator, prompts, cache)
        calls["generation"] += n_gen
        timings["generation_s"] = time.perf_counter() - t
        answers = [None if g.error else g.text for g in gens]
        contexts = ["\n\n".join(c.text for c in cs) for cs in contexts_chunks]
        t = time.perf_counter()
        judged, jcalls = judge_stage(judge, items, answers, contexts, cache, progress)
        calls.update({f"judge_{k_}": v for k_, v in jcalls.items()})
        timings["judging_s"] = time.perf_counter() - t
        for row, it, g, j, ctx in zip(rows, items, gens, judged, contexts, strict=True):
            row["answer"] = g.text
            row["context"] = ctx  # exactly what the generator and the judge saw
            row["error"] = g.error
            row["latency_generation_s"] = g.latency_s
            row["generation_cached"] = g.cached
            if j is None:
                row.update({m: math.nan for m in GENERATION_METRICS})
                row.update(
                    claims="[]",
                    verdicts="[]",
                    n_claims=0,
                    n_unparseable=0,
                    relevance_method="",
                    latency_judge_s=0.0,
                )
            else:
                claims, verdicts, rel, method, lat = j
                faith, n_claims, n_unp = faithfulness(verdicts)
                row["faithfulness"] = faith
                row["answer_relevance"] = float(rel)
                row["correctness"] = correctness(g.text, it.key_facts, it.answerable)
                row.update(
                    claims=json.dumps(claims),
                    verdicts=json.dumps(
                        [
                            {"claim": v.claim, "label": v.label, "score": v.score, "rationale": v.rationale}
                            for v in verdicts
                        ]
                    ),
                    n_claims=n_claims,
                    n_unparseable=n_unp,
                    relevance_method=method,
                    latency_judge_s=lat,
                )
            row["failure_label"] = failure_label(
                answerable=it.answerable,
                hit=bool(row.get(hit_key) == 1.0),
                correctness=row["correctness"],
                faithfulness=row["faithfulness"],
                generated=True,
                error=row["error"],
                thresholds=thresholds or {},
            )
    else:
        for row, it in zip(rows, items, strict=True):
            row["failure_label"] = failure_label(
                answerable=it.answerable,
                hit=bool(row.get(hit_key) == 1.0),
                correctness=math.nan,
                faithfulness=math.nan,
                generated=False,
                error=None,
                thresholds=thresholds or {},
            )

    df = pd.DataFrame(rows)
    for lab in RATE_LABELS:
        df[f"rate_{lab}"] = (df["failure_label"] == lab).astype(float)
    if generator is None:  # without an answer only the retrieval verdict is meaningful
        df = df.drop(columns=[f"rate_{lab}" for lab in RATE_LABELS if lab != "retrieval_failure"])
    aggregates = aggregate(df, n_resamples=n_resamples, seed=seed)
    aggregates.update(retriever_metrics)
    return PipelineResult(
        per_query=df,
        aggregates=aggregates,
        cache_keys=cache_keys,
        timings=timings,
        calls=dict(calls),
        n_chunks=len(chunks),
        tags=run_tags,
    )
