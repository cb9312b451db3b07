"""Run one resolved configuration over the eval set: chunk → retrieve → generate → judge → score.

``run_pipeline(stages, data, settings, cache)`` takes built stages (``run_types``: no Hydra, no
MLflow), so tests and scripts call it directly.
Every stage goes through the content-addressed ``StageCache``; the per-query records it returns
carry everything the MLflow table, the failure labels and the statistics need. Results are
committed to the cache as they complete (each answer, each judged answer, each embedding block),
so a killed run resumes with only the missing model calls; every slow stage reports progress
through ``rag_experiments.core.progress``.
The retrieval half (chunk, rank, rerank, retrieval metrics) is ``run.retrieval``; the answer half
(answer, the slots after it, judge) is ``run.answer``: both are folds over declared steps.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pandas as pd

from rag_experiments.analysis.variance import replicate_metrics
from rag_experiments.core.cache import StageCache
from rag_experiments.core.slots import slot
from rag_experiments.evalset.subset import stratified_subset
from rag_experiments.evaluation import answer_metrics as A
from rag_experiments.evaluation.aggregate import aggregate
from rag_experiments.evaluation.assertions import add_assertion_columns
from rag_experiments.evaluation.cost import cost_metrics, stage_costs, step_rows
from rag_experiments.evaluation.labels import RATE_LABELS, failure_label
from rag_experiments.run.answer import answer_half
from rag_experiments.run.query_stage import query_columns
from rag_experiments.run.racing import generate_subset
from rag_experiments.run.retrieval import (
    first_stage_aggregates,
    retrieval_rows,
    retrieval_scores,
)
from rag_experiments.run.steps import Ledger, RunState, StepContext, StepRecord, loop_steps
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages.replicates import run_replicates

log = logging.getLogger(__name__)


@dataclass
class PipelineResult:
    per_query: pd.DataFrame
    aggregates: dict[str, float]
    cache_keys: dict[str, str]
    timings: dict[str, float]
    calls: dict[str, int] = field(default_factory=dict)
    n_chunks: int = 0
    n_generated: int = 0  # items generated and judged (0: retrieval only)
    tags: dict[str, str] = field(default_factory=dict)  # run tags, e.g. token_budget_tokenizer
    records: dict[str, StepRecord] = field(default_factory=dict)  # per slot: what its step did (run.steps)


def _label_rows(rows, items, k: int, thresholds: dict | None, generated: list[bool]) -> None:
    """Set ``failure_label`` per row; rows without an answer get the retrieval-only verdict."""

    hit_key = f"hit_at_{k}"
    for row, it, gen in zip(rows, items, generated, strict=True):
        row["failure_label"] = failure_label(
            answerable=it.answerable,
            hit=bool(row.get(hit_key) == 1.0),
            correctness=row.get("correctness", math.nan) if gen else math.nan,
            faithfulness=row.get("faithfulness", math.nan) if gen else math.nan,
            generated=gen,
            error=row["error"] if gen else None,
            thresholds=thresholds or {},
            contradicted=gen and bool(row.get("n_contradicted_key_facts")),  # a key fact contradicted: not ok
        )


def _per_query_table(
    rows: list[dict[str, Any]], generated: list[bool], with_generation: bool
) -> pd.DataFrame:
    """The per-query DataFrame with one ``rate_{label}`` indicator column per failure label.

    Retrieval only: just ``rate_retrieval_failure`` (without an answer only the retrieval verdict
    means something). With a generation subset the rates are NaN outside it: one denominator.
    """
    df = pd.DataFrame(rows)
    for lab in RATE_LABELS:
        df[f"rate_{lab}"] = (df["failure_label"] == lab).astype(float)
    if not with_generation:
        return df.drop(columns=[f"rate_{lab}" for lab in RATE_LABELS if lab != "retrieval_failure"])
    if not all(generated):
        df["generated"] = generated
        df.loc[~df["generated"], [f"rate_{lab}" for lab in RATE_LABELS]] = math.nan
    return df


def _run_aggregates(
    df: pd.DataFrame,
    run_metrics: dict,
    pricing: dict | None,
    n_generated: int | None,
    n_resamples: int,
    seed: int,
) -> dict[str, float]:
    """The run's metrics: bootstrap means and CIs of the per-query table, the retriever's run-level
    metrics, cost, and ``n_generated`` when the run generates (``n_generated`` not None)."""
    aggregates = aggregate(df, n_resamples=n_resamples, seed=seed)
    aggregates.update(run_metrics)
    aggregates.update(cost_metrics(df, pricing))
    if n_generated is not None:
        aggregates["n_generated"] = n_generated
        aggregates["n_context_truncated"] = int(df["context_truncated"].sum()) if n_generated else 0
        if "n_unparseable_diagnostics" in df:
            aggregates["n_unparseable_diagnostic_verdicts"] = int(df["n_unparseable_diagnostics"].sum())
        aggregates["n_answer_truncated"] = int(df["answer_truncated"].fillna(False).sum()) if n_generated else 0
        if "n_unparseable_fact_verdicts" in df:  # correctness_judged: replies counted, never read as "absent"
            aggregates["n_unparseable_fact_verdicts"] = int(df["n_unparseable_fact_verdicts"].fillna(0).sum())
        aggregates["n_judge_errors"] = int(df.get("n_judge_errors", pd.Series(dtype=float)).fillna(0).sum())
        aggregates["n_escalated_verdicts"] = int(df.get("n_escalated", pd.Series(dtype=float)).fillna(0).sum())
        aggregates.update(A.run_aggregates(df))  # abstention table and F1, citation marker counts
    return aggregates


def _retrieval_half(stages: Stages, data: PipelineData, settings: RunSettings, cache: StageCache, ledger: Ledger):
    """The retrieval half as a fold over its steps (chunk, transform the queries, rank, rerank),
    then the retrieval metrics: (chunks, the ranked chunks per item, the per-query rows so far,
    the retrieval scores, the cache keys)."""
    items = data.items
    embedder = getattr(stages.retriever, "embedder", None)
    if hasattr(embedder, "progress"):
        embedder.progress = settings.progress
    st, ctx = RunState([it.query for it in items]), StepContext(stages, data, settings, cache)
    done = loop_steps(stages, ("before_answer",))
    for step in done:
        ledger.run(step, st, ctx)
    chunks = st.chunks
    ranked = [[chunks[i] for i in row if i >= 0] for row in st.ranking.idx]
    scored = retrieval_scores(stages.retriever, items, chunks, st.ranking.idx, ranked, settings, st.cache_keys, cache)
    shown = max(settings.all_ks)  # the per-query table lists the ranks the top-k metrics see
    ran = ledger.records.get("retriever")  # app=python|http: the app's own latency_app_s instead
    latency = ran.seconds / max(len(items), 1) if ran is not None else math.nan
    rows = retrieval_rows(items, [r[:shown] for r in ranked], st.ranking.scores, scored.per_query, latency)
    query_columns(rows, st.queried)  # search_queries: the question itself without a transform
    for step in done:  # each step's own per-query columns (the reranker's first_stage/*, …)
        if hasattr(step, "columns"):
            step.columns(st, rows)
        s = slot(step.slot)  # a step timed per query that measured none: its batch time / n
        if s.column and rows and f"latency_{s.column}_s" not in rows[0]:
            for row in rows:
                row[f"latency_{s.column}_s"] = ledger.records[s.name].seconds / len(rows)
    return chunks, ranked, rows, scored, st


def run_pipeline(
    stages: Stages, data: PipelineData, settings: RunSettings, cache: StageCache, race=None
) -> PipelineResult:
    """Retrieval on every item; generation and judging on
    ``stratified_subset(items, settings.generation_subset)`` when ``stages.generator`` is set.

    Every stage runs as a step (``run.steps``); timings, model calls, error counts, the run-status
    rule and endpoint usage come from the steps' records. Items outside the subset keep their
    retrieval metrics and a retrieval-only failure label; their generation metrics and label rates
    are NaN (every generation mean covers the subset only, ``n_scored/{key}``).
    ``settings.pricing``: price tables for ``cost_usd`` (evaluation.cost).
    """
    ledger = Ledger()
    items = data.items
    chunks, ranked, rows, scored, st = _retrieval_half(stages, data, settings, cache, ledger)
    cache_keys, fixed = st.cache_keys, st.app_replies or None

    subset = stratified_subset(items, settings.generation_subset) if stages.generates else []
    if race is not None:  # racing batches (docs/racing.md); racing runs one replicate (config_schema)
        def generate(sub, stg, se, ca, led):
            answer_half(items, ranked, sub, se, ca, rows, stg, led, fixed)

        subset = generate_subset(
            (generate, _label_rows), rows, items, subset, stages, settings, cache, ledger, race, scored.tags
        )
        row_items = list(range(len(items)))
    else:
        run_one = partial(answer_half, items, ranked, subset, settings, cache, fixed=fixed)  # (rows, stages, ledger)
        rows, row_items = run_replicates(rows, stages, settings.replicates, run_one, ledger)
    chosen = set(subset)
    generated = [i in chosen for i in row_items]  # replicates: one row per (item, replicate)
    _label_rows(rows, [items[i] for i in row_items], settings.k, settings.thresholds, generated)
    add_assertion_columns(rows, [items[i] for i in row_items], generated)  # the items' assert checks

    if stages.generates and stages.judge is None:  # judge=none: say what the labels rest on
        scored.tags["failure_label_evidence"] = A.JUDGE_FREE_LABEL_EVIDENCE
    df = _per_query_table(rows, generated, with_generation=stages.generates)
    n_generated = len(subset) if stages.generates else None
    aggregates = _run_aggregates(
        df, scored.run_metrics, settings.pricing, n_generated, settings.n_resamples, settings.seed
    )
    aggregates.update(replicate_metrics(df, settings.thresholds))  # R > 1: flip rates, variance shares
    if stages.reranker is not None:
        aggregates.update(first_stage_aggregates(df))
    # the error counts of the steps that count them (n_errors and n_judge_errors, counted per
    # query and per call, come from the table above)
    aggregates.update({k: v for k, v in ledger.error_counts().items() if k not in aggregates})
    if "n_unmapped_contexts" in df:  # app=python|http: contexts shown but not scored, never dropped silently
        aggregates["n_unmapped_contexts"] = int(df.drop_duplicates("id")["n_unmapped_contexts"].sum())
    usage = ledger.endpoint_usage()
    tags = dict(scored.tags)
    # the per-step table (seconds, calls, errors, tokens, cost): the report's per-step rows
    tags["steps"] = json.dumps(step_rows(ledger.records, stage_costs(df, settings.pricing)))
    if usage:
        tags["endpoint_usage"] = json.dumps(usage, sort_keys=True)
    return PipelineResult(
        per_query=df,
        aggregates=aggregates,
        cache_keys=cache_keys,
        tags=tags,
        timings=ledger.timings(),
        calls=ledger.calls(),
        n_chunks=len(chunks),
        n_generated=len(subset),
        records=ledger.records,
    )
