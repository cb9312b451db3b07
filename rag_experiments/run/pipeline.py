"""Run one resolved configuration over the eval set: chunk → retrieve → generate → judge → score.

``run_pipeline(stages, data, settings, cache)`` takes built stages (``run_types``: no Hydra, no
MLflow), so tests and scripts call it directly.
Every stage goes through the content-addressed ``StageCache``; the per-query records it returns
carry everything the MLflow table, the failure labels and the statistics need. Results are
committed to the cache as they complete (each answer, each judged answer, each embedding block),
so a killed run resumes with only the missing model calls; every slow stage reports progress
through ``rag_experiments.core.progress``.
The retrieval half (chunk, rank, rerank, retrieval metrics) is ``run.retrieval``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import pandas as pd

from rag_experiments.analysis.variance import replicate_metrics
from rag_experiments.core.build import target_object
from rag_experiments.core.cache import StageCache, stage_key
from rag_experiments.core.parallel import as_they_complete
from rag_experiments.core.progress import Progress, track
from rag_experiments.core.redaction import redact
from rag_experiments.core.slots import slot, steps
from rag_experiments.core.types import EvalItem, Generation
from rag_experiments.evalset.subset import stratified_subset
from rag_experiments.evaluation import answer_metrics as A
from rag_experiments.evaluation.aggregate import aggregate
from rag_experiments.evaluation.assertions import add_assertion_columns
from rag_experiments.evaluation.cost import cost_metrics, stage_costs, step_rows, usage_columns
from rag_experiments.evaluation.labels import RATE_LABELS, failure_label
from rag_experiments.evaluation.walk import walk
from rag_experiments.judge.cached import (
    JudgedAnswer,
    cached_claims,
    cached_verdicts,
    diagnostic_columns,
    diagnostics_stage,
    last_error,
    last_usage,
    verdict_failures,
)
from rag_experiments.judge.repeats import repeat_columns
from rag_experiments.run.query_stage import query_columns
from rag_experiments.run.racing import generate_subset
from rag_experiments.run.retrieval import (
    first_stage_aggregates,
    retrieval_rows,
    retrieval_scores,
)
from rag_experiments.run.steps import Ledger, RunState, StepContext, StepRecord
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages.context_fit import fit_contexts
from rag_experiments.stages.endpoint_limits import warn_truncated
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


def _generate_one(generator, messages) -> Generation:
    return generator.generate([messages])[0]


def generation_stage(
    generator, prompts: list[list[dict]], cache: StageCache, progress: bool = True
) -> tuple[list[Generation], int]:
    """Generations keyed by (generator identity, rendered prompt); only misses reach the model.

    Requests run ``generator.concurrency`` at a time and each answer is committed to the cache as
    soon as it arrives, so a killed run loses only the requests in flight. Failed generations are
    not cached, so a re-run retries them. Answers are redacted (``redaction.redact``) first.
    """
    keys = [stage_key("generation", generator.identity, p) for p in prompts]
    found = cache.get_json_many("generations", keys)
    todo = list({k: i for i, k in enumerate(keys) if k not in found}.items())
    fresh: dict[str, Generation] = {}
    workers = max(1, int(getattr(generator, "concurrency", 1) or 1))
    with Progress("generation", len(todo), enabled=progress and bool(todo), unit="answers") as bar:
        asked = [prompts[i] for _, i in todo]
        for j, g in as_they_complete(lambda p: _generate_one(generator, p), asked, workers):
            k = todo[j][0]
            g.text = redact(g.text)  # a key the model repeats is stored nowhere (cache, table, traces)
            fresh[k] = g
            if not g.error:
                cache.put_json_many("generations", {k: asdict(g)})
            bar.update()
    warn_truncated(generator, fresh.values())
    gens = []
    for k in keys:
        if k in fresh:
            gens.append(fresh[k])
        else:
            g = Generation(**found[k])
            g.text, g.cached = redact(g.text), True  # an answer cached before redaction existed
            gens.append(g)
    return gens, len(todo)


def _judge_one(
    judge, item: EvalItem, answer: str, context: str, cache: StageCache, calls: Counter
) -> JudgedAnswer:
    """Claims, verdicts and answer relevance of one answer; each part cached."""
    t0 = time.perf_counter()
    tally: dict[str, dict | None] = {}
    errors_before = calls["errors"]
    claims = cached_claims(judge, answer, cache, calls, tally)
    verdicts = cached_verdicts(judge, claims, context, cache, calls, tally, "verdicts")
    rk = stage_key("relevance", judge.identity, item.query, answer)
    got = cache.get_json_many("relevance", [rk])
    if rk in got:
        rel, method, *usage = got[rk]
        tally[rk] = usage[0] if usage else None
    else:
        rel, method = judge.answer_relevance(item.query, answer)
        tally[rk] = last_usage(judge)
        calls["relevance"] += 1
        calls["errors"] += bool(failed := last_error(judge))  # NaN of a failed call: retried next run
        if not failed:
            cache.put_json_many("relevance", {rk: [rel, method, tally[rk]]})
    return JudgedAnswer(claims, verdicts, rel, method, time.perf_counter() - t0, tally, calls["errors"] - errors_before)


def judge_stage(
    judge,
    items: list[EvalItem],
    answers: list[str | None],
    contexts: list[str],
    cache: StageCache,
    progress: bool = True,
):
    """Claims, verdicts and answer relevance per query, each cached by what it depends on.

    A judge with a ``prepare(answers, contexts)`` method (the heuristic judge) gets every text it
    will need up front, so it can embed them in one batch instead of one call per query.
    """
    calls: Counter = Counter()
    prepare = getattr(judge, "prepare", None)
    if prepare is not None:
        todo = [(a, c) for a, c in zip(answers, contexts, strict=True) if a is not None]
        with Progress("judging: embedding claims and contexts", None, enabled=progress and bool(todo)):
            prepare([a for a, _ in todo], [c for _, c in todo])
    out = []
    rows = list(zip(items, answers, contexts, strict=True))
    for item, answer, context in track(rows, "judging", enabled=progress, unit="answers"):
        out.append(None if answer is None else _judge_one(judge, item, answer, context, cache, calls))
    return out, calls


def _judged_columns(j: JudgedAnswer | None, judge: bool) -> dict[str, Any]:
    """The judge's metrics and bookkeeping of one generated answer (``j`` None: not judged — a
    failed generation (judge metrics NaN), or no ``judge`` (judge=none: no judge metric columns at
    all)). The metrics of the verdicts are the registry's (walked over ``verdicts``:
    ``faithfulness``); ``answer_relevance`` is the judge's own score."""
    if j is None:
        return {
            **(dict.fromkeys(("faithfulness", "answer_relevance"), math.nan) if judge else {}),
            "claims": [],
            "verdicts": [],
            "n_claims": 0,
            "n_unparseable": 0,
            "n_judge_errors": 0,
            "relevance_method": "",
            "latency_judge_s": 0.0,
        }
    n_unp, n_failed = verdict_failures(j.verdicts)
    verdict_rows = [
        {"claim": v.claim, "label": v.label, "score": v.score, "rationale": v.rationale}
        | ({"stage": v.stage} if v.stage else {})
        for v in j.verdicts
    ]
    return {
        **walk({"verdicts": j.verdicts}, "generation"),
        "answer_relevance": float(j.relevance),
        "claims": list(j.claims),
        "verdicts": verdict_rows,
        "n_claims": len(j.verdicts),
        "n_unparseable": n_unp,
        "n_judge_errors": n_failed + j.n_errors,
        "n_escalated": sum(v.stage == "llm" for v in j.verdicts),  # judge=cascade: decided by the LLM
        "relevance_method": j.method,
        "latency_judge_s": j.seconds,
    }


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


@dataclass
class _Segment:
    """The generation segment's state (one replicate or racing batch): what the generate step
    leaves for the judge step."""

    items: list[EvalItem]
    chunks: list  # per item, the context's chunks (fitted to the model's window)
    prompts: list
    fixed: list | None = None  # app=python|http: the app's replies, the answers (no model call)
    gens: list[Generation] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)
    judged: list = field(default_factory=list)
    diags: list = field(default_factory=list)
    flips: list = field(default_factory=list)


class GenerateStep:
    """The ``generator`` slot as a step: an answer per prompt (``generation_stage``)."""

    slot = "generator"

    def run(self, seg: _Segment, ctx: StepContext) -> StepRecord:
        if seg.fixed is not None:  # the app answered in its own step
            seg.gens = [Generation(r.answer if not r.error else "", "app", r.seconds, r.error or None) for r in seg.fixed]
            n_gen = 0
        else:
            seg.gens, n_gen = generation_stage(ctx.stages.generator, seg.prompts, ctx.cache, ctx.settings.progress)
        seg.answers = [None if g.error else g.text for g in seg.gens]
        errors = [g.error for g in seg.gens if g.error]
        tokens = Counter()
        for g in seg.gens:
            tokens.update({k: float(v) for k, v in (g.usage or {}).items() if k.endswith("_tokens") and v})
        return StepRecord(self.slot, len(seg.prompts), len(errors), {"generation": n_gen}, dict(tokens),
                          first_error=errors[0] if errors else "")  # fmt: skip


class JudgeStep:
    """The ``judge`` slot as a step: claims, verdicts and relevance per answer, the claim-level
    diagnostics and the judge's repeats. An answer counts as failed when a judge call on it failed
    on transport (``n_judge_errors``)."""

    slot = "judge"

    def run(self, seg: _Segment, ctx: StepContext) -> StepRecord:
        judge, cache, progress = ctx.stages.judge, ctx.cache, ctx.settings.progress
        seg.judged, jcalls = judge_stage(judge, seg.items, seg.answers, seg.contexts, cache, progress)
        seg.diags, dcalls = diagnostics_stage(
            judge, seg.items, seg.answers, seg.chunks, seg.judged, cache, ctx.settings.min_coverage, progress
        )
        seg.flips = repeat_columns(ctx.stages.judge_repeats, seg.judged, seg.contexts, cache, jcalls)  # judge.repeats
        judged = [j for j in seg.judged if j is not None]
        failed = sum(bool(sum(verdict_failures(j.verdicts)[1:]) + j.n_errors) for j in judged)
        calls = {f"judge_{k}": v for k, v in (jcalls + dcalls).items()}
        first = next((v.error for j in judged for v in j.verdicts if v.error), "a judge call failed on transport")
        return StepRecord(self.slot, len(judged), failed, calls, first_error=first if failed else "")


def _generate_and_judge(
    items, ranked, subset, settings: RunSettings, cache, rows, stages: Stages, ledger: Ledger, fixed=None
) -> None:
    """Generate and judge the ``subset`` of items (with the claim-level diagnostics), as the
    generator's and the judge's steps; fills their rows, their records join ``ledger``. ``fixed``
    (item id → the app's reply): the app's answers and all of its contexts, no generator."""
    sub_items = [items[i] for i in subset]
    if fixed:
        contexts_chunks = [ranked[i] for i in subset]  # what the app said it used
        prompts = [None] * len(subset)
        for i in subset:
            rows[i]["context_truncated"] = False
    else:
        contexts_chunks = [ranked[i][: settings.k] for i in subset]
        contexts_chunks = fit_contexts(stages, rows, subset, contexts_chunks, cache)  # to the model's window
        prompts = [stages.prompt.render(it.query, cs) for it, cs in zip(sub_items, contexts_chunks, strict=True)]
    seg = _Segment(sub_items, contexts_chunks, prompts, [fixed[it.id] for it in sub_items] if fixed else None)
    ctx = StepContext(stages, None, settings, cache)
    ledger.run(GenerateStep(), seg, ctx)
    seg.contexts = ["\n\n".join(c.text for c in cs) for cs in contexts_chunks]
    cites = stages.prompt is not None and A.asks_for_citations(stages.prompt.text)  # where the prompt asks
    free = A.judge_free_columns(sub_items, seg.answers, seg.contexts, contexts_chunks, cites, settings.min_coverage)
    judge = stages.judge
    if judge is None:  # judge=none: the judge-free metrics alone, no judge call
        n = len(sub_items)
        seg.judged, seg.diags, seg.flips = [None] * n, [None] * n, [{}] * n
    else:
        ledger.run(JudgeStep(), seg, ctx)
    rows_of = zip(subset, seg.gens, seg.judged, seg.contexts, seg.diags, seg.flips, free, strict=True)
    for qi, g, j, ctx_text, d, fl, fr in rows_of:
        row = rows[qi]
        row.update(answer=g.text, context=ctx_text, error=g.error)  # context: exactly what both saw
        row.update(latency_generation_s=g.latency_s, generation_cached=g.cached, answer_truncated=g.truncated)
        row.update(usage_columns(g.usage))  # cached answers keep their usage: cost of the config
        row.update(_judged_columns(j, judge is not None), **fr)  # fr: the judge-free metrics
        if judge is not None:  # judge=none: no diagnostic columns (rather than NaN with n_scored 0)
            row.update(diagnostic_columns(d, j.usage if j is not None else None))
        row.update(fl)


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
        aggregates["n_judge_errors"] = int(df.get("n_judge_errors", pd.Series(dtype=float)).fillna(0).sum())
        aggregates["n_escalated_verdicts"] = int(df.get("n_escalated", pd.Series(dtype=float)).fillna(0).sum())
        aggregates.update(A.run_aggregates(df))  # abstention table and F1, citation marker counts
    return aggregates


def retrieval_steps(stages: Stages) -> list:
    """The retrieval half's steps, in run order: a step per slot that declares a ``runner``
    (``core.slots``) and is configured (``query=none`` and ``rerank=none`` add no step)."""
    on = [s for s in steps() if getattr(stages, s.name, None) is not None]
    replaced = {name for s in on for name in s.replaces}  # app=python|http: it retrieves itself
    return [target_object(s.runner)() for s in on if s.runner and s.name not in replaced]


def _retrieval_half(stages: Stages, data: PipelineData, settings: RunSettings, cache: StageCache, ledger: Ledger):
    """The retrieval half as a fold over its steps (chunk, transform the queries, rank, rerank),
    then the retrieval metrics: (chunks, the ranked chunks per item, the per-query rows so far,
    the retrieval scores, the cache keys)."""
    items = data.items
    embedder = getattr(stages.retriever, "embedder", None)
    if hasattr(embedder, "progress"):
        embedder.progress = settings.progress
    st, ctx = RunState([it.query for it in items]), StepContext(stages, data, settings, cache)
    done = retrieval_steps(stages)
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
            _generate_and_judge(items, ranked, sub, se, ca, rows, stg, led, fixed)

        subset = generate_subset(
            (generate, _label_rows), rows, items, subset, stages, settings, cache, ledger, race, scored.tags
        )
        row_items = list(range(len(items)))
    else:
        run_one = partial(_generate_and_judge, items, ranked, subset, settings, cache, fixed=fixed)  # (rows, stages, ledger)
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
