"""The answer half of a run: the steps after retrieval — the answer (the generator, or the app's
replies standing in for it), the slots after the answer, and the judge — run as declared steps of
the same loop as the retrieval half (``run.steps.loop_steps``; docs/architecture.md, "The run loop").

Each answer-side step is ``run(state, ctx) -> StepRecord`` on one :class:`AnswerState` (a
replicate or a racing batch) and ``columns(state, rows)``: its per-query columns. The judge-free
answer metrics are computed once the steps are done (they read only the final answers).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from rag_experiments.core.cache import StageCache, stage_key
from rag_experiments.core.parallel import ask_missing
from rag_experiments.core.progress import track
from rag_experiments.core.slots import slot
from rag_experiments.core.steps import StepRecord
from rag_experiments.core.text_gate import gate_text
from rag_experiments.core.types import EvalItem, Generation, Verdict
from rag_experiments.evaluation import answer_metrics as A
from rag_experiments.evaluation.cost import usage_columns
from rag_experiments.evaluation.declines import is_decline
from rag_experiments.evaluation.fact_scores import reference_facts
from rag_experiments.evaluation.walk import walk
from rag_experiments.judge.cached import (
    JudgedAnswer,
    cached_judgement,
    diagnostic_columns,
    diagnostics_stage,
    last_error,
    last_usage,
    verdict_failures,
)
from rag_experiments.judge.repeats import repeat_columns
from rag_experiments.run.steps import StepContext, loop_steps
from rag_experiments.run.types import RunSettings, Stages
from rag_experiments.stages.context_fit import fit_contexts
from rag_experiments.stages.endpoint_limits import warn_truncated

ANSWER_PHASES = ("answer", "after_answer", "judging")


def _generate_one(generator, messages) -> Generation:
    return generator.generate([messages])[0]


def generation_stage(
    generator, prompts: list[list[dict]], cache: StageCache, progress: bool = True
) -> tuple[list[Generation], int]:
    """Generations keyed by (generator identity, rendered prompt); only misses reach the model.

    Requests run ``generator.concurrency`` at a time and each answer is committed to the cache as
    soon as it arrives, so a killed run loses only the requests in flight. Failed generations are
    not cached, so a re-run retries them. Answers pass the text gate (``core.text_gate``) first.
    """
    keys = [stage_key("generation", generator.identity, p) for p in prompts]

    def ask(i: int) -> Generation:
        g = _generate_one(generator, prompts[i])
        g.text = gate_text(g.text, "answer").text  # a key the model repeats is stored nowhere
        return g

    found, fresh = ask_missing(cache, "generations", keys, ask, lambda g: None if g.error else asdict(g),
                               getattr(generator, "concurrency", 1), ("generation", "answers"), progress)  # fmt: skip
    warn_truncated(generator, fresh.values())
    gens = []
    for k in keys:
        if k in fresh:
            gens.append(fresh[k])
        else:
            g = Generation(**found[k])
            g.text, g.cached = gate_text(g.text, "answer").text, True  # an answer cached before redaction existed
            gens.append(g)
    return gens, len(fresh)


def _judge_one(
    judge, item: EvalItem, answer: str, context: str, cache: StageCache, calls: Counter
) -> JudgedAnswer:
    """Claims, verdicts and answer relevance of one answer; each part cached."""
    t0 = time.perf_counter()
    tally: dict[str, dict | None] = {}
    errors_before = calls["errors"]
    claims, verdicts = cached_judgement(judge, answer, context, cache, calls, tally)
    error = last_error(judge) if calls["errors"] > errors_before else ""
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
        error = error or failed or ""
        if not failed:
            cache.put_json_many("relevance", {rk: [rel, method, tally[rk]]})
    return JudgedAnswer(claims, verdicts, rel, method, time.perf_counter() - t0, tally,
                        calls["errors"] - errors_before, error)  # fmt: skip


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
        if todo:  # its line counts the texts it embeds, per model batch, with an ETA
            prepare([a for a, _ in todo], [c for _, c in todo], progress=progress,
                    desc="judging: embedding claims and contexts", cache=cache)  # fmt: skip
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


@dataclass
class AnswerState:
    """What the answer-side steps of one replicate or racing batch leave for the later ones."""

    items: list[EvalItem]
    chunks: list  # per item, the context's chunks (fitted to the model's window)
    prompts: list
    fixed: list | None = None  # app=python|http: the app's replies, the answers (no model call)
    gens: list[Generation] = field(default_factory=list)
    answers: list[str | None] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)  # exactly what the generator and the judge saw
    judged: list = field(default_factory=list)  # per item a JudgedAnswer, None: not judged
    facts: list = field(default_factory=list)  # per item the judge's key-fact verdicts (None: none asked)
    diags: list = field(default_factory=list)
    flips: list = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.items)
        self.contexts = self.contexts or ["\n\n".join(c.text for c in cs) for cs in self.chunks]
        self.judged, self.diags, self.flips, self.facts = [None] * n, [None] * n, [{}] * n, [None] * n


class GenerateStep:
    """The ``generator`` slot as a step: an answer per prompt (``generation_stage``)."""

    slot = "generator"

    def run(self, seg: AnswerState, ctx: StepContext) -> StepRecord:
        if seg.fixed is not None:  # the app answered in its own step
            seg.gens = [Generation(r.answer if not r.error else "", "app", r.seconds, error=r.error or None,
                                   truncated=bool(getattr(r, "truncated", False))) for r in seg.fixed]  # fmt: skip
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

    def columns(self, seg: AnswerState, rows: list[dict]) -> None:
        for row, g, a, ctx_text in zip(rows, seg.gens, seg.answers, seg.contexts, strict=True):
            # the answer as the steps after it left it (a failed one: the generator's empty text)
            row.update(answer=g.text if a is None else a, context=ctx_text, error=g.error)
            row.update(latency_generation_s=g.latency_s, generation_cached=g.cached, answer_truncated=g.truncated)
            row.update(usage_columns(g.usage))  # cached answers keep their usage: cost of the config


class JudgeStep:
    """The ``judge`` slot as a step: claims, verdicts and relevance per answer, the claim-level
    diagnostics and the judge's repeats. An answer counts as failed when a judge call on it failed
    on transport (``n_judge_errors``)."""

    slot = "judge"

    def run(self, seg: AnswerState, ctx: StepContext) -> StepRecord:
        judge, cache, progress = ctx.stages.judge, ctx.cache, ctx.settings.progress
        seg.judged, jcalls = judge_stage(judge, seg.items, seg.answers, seg.contexts, cache, progress)
        seg.diags, dcalls = diagnostics_stage(
            judge, seg.items, seg.answers, seg.chunks, seg.judged, cache, ctx.settings.min_coverage, progress
        )
        seg.flips = repeat_columns(ctx.stages.judge_repeats, seg.judged, seg.contexts, cache, jcalls, progress)
        if hasattr(judge, "fact_verdicts"):  # a judge model also reads the key facts (correctness_judged)
            seg.facts = fact_stage(judge, seg.items, seg.answers, seg.judged, cache, jcalls, progress)
        judged = [j for j in seg.judged if j is not None]
        failed = sum(judge_failed(j) for j in judged)
        calls = {f"judge_{k}": v for k, v in (jcalls + dcalls).items()}
        first = next((e for j in judged for e in (j.error, *(v.error for v in j.verdicts)) if e), "a judge call failed")
        return StepRecord(self.slot, len(judged), failed, calls, first_error=first if failed else "")

    def columns(self, seg: AnswerState, rows: list[dict]) -> None:
        rows_of = zip(rows, seg.judged, seg.diags, seg.flips, seg.items, seg.facts, seg.answers, strict=True)
        for row, j, d, fl, it, fv, answer in rows_of:
            row.update(_judged_columns(j, True))
            row.update(diagnostic_columns(d, j.usage if j is not None else None))
            row.update(fl)
            if fv is not None:  # the answer's key facts as the judge read them
                labels = [v.label for v in fv]
                inputs = {"fact_labels": labels, "answerable": it.answerable, "declined": is_decline(answer)}
                row.update(walk(inputs, "generation"))
                row["n_unparseable_fact_verdicts"] = sum(lab == "unparseable" for lab in labels)


def judge_failed(j: JudgedAnswer) -> bool:
    """A judge call on this answer failed on transport: the answer is a failed item of the judge
    step (re-run retries it), and no further call is spent on it."""
    return bool(j.n_errors or sum(verdict_failures(j.verdicts)[1:]))


def fact_stage(judge, items, answers, judged, cache: StageCache, calls: Counter, progress: bool = True) -> list:
    """Per answer the judge's verdict on each reference fact (``evaluation.fact_scores``), cached by
    (judge and fact prompt, answer, facts); a verdict whose call failed is not cached (re-run
    retries it) and counts as a judge error of that answer. Its calls' usage joins the answer's
    tally (the judge's tokens). None: no answer, or its judging already failed; []: nothing to ask
    (unanswerable, no facts)."""
    out: list = []
    rows = list(zip(items, answers, judged, strict=True))
    for item, answer, j in track(rows, "judging: key facts", enabled=progress, unit="answers"):
        facts = reference_facts(item.strong_key_facts, item.gold_answer) if item.answerable else []
        if answer is None or (j is not None and judge_failed(j)):  # a failed item: no more calls on it
            out.append(None)
            continue
        if not facts:
            out.append([])
            continue
        key = stage_key("facts", judge.fact_identity, answer, facts)
        got = cache.get_json_many("facts", [key])
        if key in got:
            vs = [Verdict(**v) for v in got[key]]
        else:
            vs = judge.fact_verdicts(answer, facts)
            calls["facts"] += len(facts)
            if not any(v.error for v in vs):
                cache.put_json_many("facts", {key: [asdict(v) for v in vs]})
        if j is not None:
            j.usage.update({f"{key}/{i}": v.usage for i, v in enumerate(vs)})
            j.n_errors += sum(bool(v.error) for v in vs)
        out.append(vs)
    return out


def answer_half(
    items, ranked, subset, settings: RunSettings, cache, rows, stages: Stages, ledger, fixed=None
) -> None:
    """The answer-side steps (:data:`ANSWER_PHASES`) on the ``subset`` of items, as a fold over the
    configured steps; fills their rows, their records join ``ledger``. ``fixed`` (item id → the
    app's reply): the app's answers and all of its contexts, no generator."""
    sub_items = [items[i] for i in subset]
    if fixed:
        contexts_chunks = [ranked[i] for i in subset]  # what the app said it used
        prompts = [None] * len(subset)
        for i in subset:
            rows[i]["context_truncated"] = False
    else:
        contexts_chunks = [ranked[i][: settings.k] for i in subset]
        histories = [list(it.history) for it in sub_items]  # a conversation's turns (prompt.history_turns)
        contexts_chunks = fit_contexts(stages, rows, subset, contexts_chunks, cache, histories)  # to the model's window
        prompts = [stages.prompt.render(it.query, cs, h)
                   for it, cs, h in zip(sub_items, contexts_chunks, histories, strict=True)]  # fmt: skip
    seg = AnswerState(sub_items, contexts_chunks, prompts, [fixed[it.id] for it in sub_items] if fixed else None)
    ctx = StepContext(stages, None, settings, cache)
    done = loop_steps(stages, ANSWER_PHASES)
    seconds = []
    for step in done:
        before = list(seg.answers)
        seconds.append(ledger.run(step, seg, ctx).seconds)
        if slot(step.slot).phase == "after_answer":  # (the answer step gates its own texts)
            for i, a in enumerate(seg.answers):  # an answer it rewrote: through the text gate
                if a is not None and a is not before[i]:
                    seg.answers[i] = gate_text(a, "answer").text
    sub_rows = [rows[i] for i in subset]
    cites = stages.prompt is not None and A.asks_for_citations(stages.prompt.text)  # where the prompt asks
    free = A.judge_free_columns(sub_items, seg.answers, seg.contexts, contexts_chunks, cites, settings.min_coverage)
    if stages.judge is None:  # judge=none: the judge-free metrics alone, no judge metric columns at all
        for row, j in zip(sub_rows, seg.judged, strict=True):
            row.update(_judged_columns(j, False))
    for step, t in zip(done, seconds, strict=True):  # each step's per-query columns, in run order
        if hasattr(step, "columns"):
            step.columns(seg, sub_rows)
        s = slot(step.slot)  # a step timed per query that measured none: its batch time / n
        if s.column and sub_rows and f"latency_{s.column}_s" not in sub_rows[0]:
            for row in sub_rows:
                row[f"latency_{s.column}_s"] = t / len(sub_rows)
    for row, fr in zip(sub_rows, free, strict=True):
        row.update(fr)
