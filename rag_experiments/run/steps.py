"""The run loop: every stage runs as a step, and every duty a step owes is derived once from its
record and its slot declaration (``core.slots``), never written per stage (docs/architecture.md,
"The run loop").

A step is ``run(state, ctx) -> StepRecord``: it reads what earlier steps left in the run state,
adds its own outputs, and returns what it did — how many items it was asked to do, how many of
them failed, the model calls it made, tokens, retries and cache hits. :class:`Ledger` runs steps
(timing them) and sums their records per slot (replicates and racing batches run the generator
and judge steps more than once). From the ledger come:

- the timings (``<step>_s``), the model-call counts and the error counts (``Slot.errors``);
- the run-status rule (:func:`failure_reason`): a step that failed on every item it was asked to
  do fails the run, naming the step; one that failed on some finishes it with the count, and the
  same command redoes exactly those items (failures are never cached; ``tracking.writer``'s
  resume rule reads the same ``Slot.errors`` metrics);
- the per-endpoint usage (``stages.endpoint``), logged on the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from rag_experiments.core.build import target_object
from rag_experiments.core.slots import Slot, configured, steps
from rag_experiments.core.steps import StepRecord
from rag_experiments.stages import call_budget, dry_calls, endpoint


class Step(Protocol):
    """A slot's runner (``Slot.runner``). Optionally ``columns(state, rows)``: its per-query
    columns, added once the retrieval half's rows exist."""

    slot: str

    def run(self, state: Any, ctx: Any) -> StepRecord: ...


class Ledger:
    """The records of a run's steps, summed per slot, and the timings that are not a step's
    (``note``: racing's waits)."""

    def __init__(self) -> None:
        self.records: dict[str, StepRecord] = {}
        self.extra_s: dict[str, float] = {}
        self._usage_before = endpoint.usage()

    def run(self, step: Step, state: Any, ctx: Any) -> StepRecord:
        """Run ``step`` on ``state``, timed; its record joins the ledger."""
        t, mark = time.perf_counter(), dry_calls.mark()
        rec = step.run(state, ctx)
        rec.seconds = time.perf_counter() - t
        dry_calls.label(mark, rec.slot)  # dry_run=true: the requests it would have sent are its own
        self.add(rec)
        return rec

    def add(self, rec: StepRecord) -> None:
        if rec.slot in self.records:
            self.records[rec.slot].absorb(rec)
        else:
            self.records[rec.slot] = rec

    def note(self, key: str, seconds: float) -> None:
        self.extra_s[key] = self.extra_s.get(key, 0.0) + seconds

    def ordered(self) -> list[tuple[Slot, StepRecord]]:
        return [(s, self.records[s.name]) for s in steps() if s.name in self.records]

    def timings(self) -> dict[str, float]:
        """Seconds per step (``<step>_s``), in run order, then the extra timings."""
        return {f"{s.step}_s": r.seconds for s, r in self.ordered()} | self.extra_s

    def calls(self) -> dict[str, int]:
        """Model calls by kind, every kind a step reports (0 included: all from the cache)."""
        out: dict[str, int] = {}
        for _, r in self.ordered():
            out.update(r.calls)
        return out

    def error_counts(self) -> dict[str, int]:
        """``Slot.errors`` metric → items that step failed on, for the steps that count errors."""
        return {s.errors: r.failed for s, r in self.ordered() if s.errors}

    def endpoint_usage(self) -> dict[str, dict[str, float]]:
        """Per endpoint: calls, attempts, retries, 429s, seconds waited, since the ledger began."""
        return endpoint.usage_since(self._usage_before)


def loop_steps(stages: Any, phases: tuple[str, ...]) -> list[Step]:
    """The steps of ``phases`` (``core.slots.PHASES``) in run order: one per slot that declares a
    ``runner`` and is configured (``core.slots.configured``: ``query=none`` adds no step), less the
    slots a configured one replaces (app=python|http retrieves itself)."""
    on = [s for s in steps() if s.phase in phases and configured(s, stages)]
    replaced = {name for s in steps() if configured(s, stages) for name in s.replaces}
    return [target_object(s.runner)() for s in on if s.runner and s.name not in replaced]


def failure_reason(records: dict[str, StepRecord]) -> str:
    """Why a completed run is FAILED ("" when it is not): a step failed on every item it was asked
    to do. Its reranker or transform did nothing, or no answer was generated or judged: such a run
    must never look like one that measured them. A run with items refused by the budget is FAILED
    with the budget's reason (``stages.call_budget``): raised, the same command resumes it."""
    if (why := call_budget.stop_reason()) and any(r.failed for r in records.values()):
        return why
    for s in steps():
        r = records.get(s.name)
        if r is not None and r.items > 0 and r.failed >= r.items:
            column = s.error_column or s.errors
            sample = f"; first: {r.first_error[:200]}" if r.first_error else ""
            return f"every one of the {r.items} {s.noun} errored ({s.step} step; see per_query '{column}'){sample}"
    return ""


def step_summary(records: dict[str, StepRecord]) -> list[str]:
    """One line per step that failed on some items: what a re-run will redo."""
    out = []
    for s in steps():
        r = records.get(s.name)
        if r is not None and 0 < r.failed < r.items:
            out.append(f"{s.step}: {r.failed} of {r.items} {s.noun} failed ({s.errors}); the same command retries them")
    return out




@dataclass
class StepContext:
    """What every step reads and none changes: the built stages, the data, the settings, the cache."""

    stages: Any
    data: Any
    settings: Any
    cache: Any


@dataclass
class RunState:
    """What the steps of a run leave for the later ones (retrieval half): the chunks, the query
    transform's output, the ranking (first stage, then reranked), the cache keys."""

    queries: list[str]
    chunks: list = field(default_factory=list)
    chunks_key: str = ""
    queried: Any = None  # run.query_stage.Queried when a query transform ran
    ranking: Any = None  # run.retrieval.Ranking
    first_stage: dict = field(default_factory=dict)  # first-stage per-query metrics (a reranker ran)
    reranked: Any = None  # run.retrieval.Reranked
    app_replies: dict = field(default_factory=dict)  # item id → stages.app.AppReply (app=python|http)
    cache_keys: dict[str, str] = field(default_factory=dict)
