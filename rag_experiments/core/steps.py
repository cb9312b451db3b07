"""What one step of the run loop did (``run.steps``): a plain record, in ``core`` so that a slot's
step can live beside its stage implementations (``stages/<slot>.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field


class StepFailed(RuntimeError):
    """A step that cannot go on for the run (a missing vector cannot be left out of an index): the
    run is FAILED with ``reason`` as its ``failure_reason``, exit 1 without a traceback
    (``run.sweep.execute``), and the same command runs it again."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class StepRecord:
    """What one step did: ``items`` it was asked to do, of them ``failed``, ``calls`` by kind
    (model calls made; 0: all from the cache), ``tokens`` by kind, ``seconds`` (set by the loop),
    ``first_error`` (a sample, for the failure reason)."""

    slot: str  # a core.slots name
    items: int = 0
    failed: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    first_error: str = ""

    def absorb(self, other: StepRecord) -> None:
        """Add ``other`` (the same slot: another replicate or racing batch) to this record."""
        self.items += other.items
        self.failed += other.failed
        self.seconds += other.seconds
        self.calls = {k: self.calls.get(k, 0) + other.calls.get(k, 0) for k in self.calls | other.calls}
        self.tokens = {k: self.tokens.get(k, 0) + other.tokens.get(k, 0) for k in self.tokens | other.tokens}
        self.first_error = self.first_error or other.first_error
