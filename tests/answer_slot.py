"""A remote answer-side slot added by the recipe (docs/architecture.md, "Add a stage slot"), in the
tests alone: ``polisher`` (group ``polish``, phase ``after_answer``) asks a chat model to polish
each answer the answer step left. Its stage module is this file; :data:`POLISH` is its one
declaration, registered by :func:`register` (``core.slots.SLOTS``); it is built into
``Stages.extra`` (``extra={"polisher": Polish(generator)}``, as ``run.assemble.other_slots`` does
for a slot ``Stages`` has no field for). Nothing in ``run/`` knows it: the fault matrix
(tests/faults/test_fault_matrix.py) runs it through the same loop, client, gate and rules as every
other remote step.
"""

from __future__ import annotations

from rag_experiments.core.cache import stage_key
from rag_experiments.core.parallel import ask_missing
from rag_experiments.core.slots import Slot
from rag_experiments.core.steps import StepRecord
from rag_experiments.core.types import Generation

POLISH = Slot("polisher", "polish", "tests.answer_slot.Polish", ("polish",), ("tests.answer_slot",),
              optional=True, neutral_none=True, step="polishing", errors="n_polish_errors",
              noun="polished answers", position=5, column="polish", runner="tests.answer_slot.PolishStep",
              span="LLM", outputs=("answer",), phase="after_answer")  # fmt: skip


def register(monkeypatch) -> None:
    """Declare the slot for one test (the one place a slot is declared: ``core.slots.SLOTS``).
    ``core.identity.STAGE_CODE`` derives its cache namespace's code from ``SLOTS`` once, at import:
    a slot declared in ``core/slots.py`` is in it, one declared at run time is added here."""
    from rag_experiments.core import identity, slots

    monkeypatch.setattr(slots, "SLOTS", (*slots.SLOTS, POLISH))
    for ns in POLISH.cache:
        monkeypatch.setitem(identity.STAGE_CODE, ns, POLISH.code)


class Polish:
    """The stage: one chat call per answer through the generator's client (the one endpoint
    client: deadline, retries, Retry-After, budget, dry run, signals)."""

    PROMPT = "Polish this answer; keep its facts and citations:\n\n{answer}"

    def __init__(self, llm) -> None:
        self.llm, self.concurrency = llm, getattr(llm, "concurrency", 1)
        self.identity = f"polish:{llm.identity}"

    def polish(self, answer: str) -> Generation:
        """The polished answer (its ``error`` set when the call failed)."""
        return self.llm.generate([[{"role": "user", "content": self.PROMPT.format(answer=answer)}]])[0]


class PolishStep:
    """The slot's runner: polishes the answers the answer step left (a failed answer is not an
    item) through ``core.parallel.ask_missing``, keyed by (stage identity, answer); a failed call
    keeps the answer and is not cached (the same run again asks exactly those)."""

    slot = "polisher"

    def run(self, seg, ctx) -> StepRecord:
        stage = ctx.stages.polisher
        todo = [i for i, a in enumerate(seg.answers) if a is not None]
        keys = [stage_key("polish", stage.identity, seg.answers[i]) for i in todo]
        found, fresh = ask_missing(ctx.cache, "polish", keys, lambda j: stage.polish(seg.answers[todo[j]]),
                                   lambda g: None if g.error else g.text, stage.concurrency,
                                   ("polishing", "answers"), ctx.settings.progress)  # fmt: skip
        self.failed: set[int] = set()
        errors = []
        for i, k in zip(todo, keys, strict=True):
            g = fresh.get(k)
            if g is not None and g.error:
                self.failed.add(i)
                errors.append(g.error)
            else:
                seg.answers[i] = g.text if g is not None else found[k]
        return StepRecord(self.slot, len(todo), len(self.failed), {"polish": len(fresh)},
                          first_error=errors[0] if errors else "")  # fmt: skip

    def columns(self, seg, rows) -> None:
        for i, row in enumerate(rows):
            row["polish_failed"] = i in self.failed  # a bool: no column declaration needed
