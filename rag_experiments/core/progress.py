"""Progress for the slow stages: a live bar on a terminal, a line every ~10 % in logs.

One helper for every stage (chunking, embedding, retrieval, generation, judging, MLflow logging),
so a long run is never silent and CI logs stay short:

- on a TTY: a tqdm bar with rate and ETA;
- otherwise (CI, ``| tee``): ``[generation] 34/168 (20%) 61 s elapsed, ETA 241 s`` each time another
  10 % is done, and a final ``[generation] done: 168 answers, 290.1 s`` line, or
  ``[generation] interrupted: 34/168 answers, 61.0 s`` when the block ends by Ctrl-C, a signal or an
  exception (``interrupted by ValueError``): a last line never says done for work that was not;
- ``enabled=False`` (config ``progress=false``): nothing at all.

ETA = elapsed / done * (total - done): the mean rate so far, which is what a user can plan with.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

from rag_experiments.core.slots import steps

T = TypeVar("T")

def stage_order() -> tuple[str, ...]:
    """Rows of the timing table: the run loop's steps in run order (``core.slots``), then what
    follows a run; unknown keys follow in insertion order."""
    return (*(f"{s.step}_s" for s in steps()), "judge_card_s", "logging_s", "traces_s", "total_s")


def eta_s(done: int, total: int, elapsed: float) -> float | None:
    """Seconds left at the mean rate so far: ``elapsed / done * (total - done)``; None before any."""
    if done <= 0 or total <= 0:
        return None
    return elapsed / done * max(total - done, 0)


class Progress:
    """Counts ``update(n)`` calls against ``total``; use as a context manager or call ``close()``."""

    def __init__(
        self,
        desc: str,
        total: int | None,
        enabled: bool = True,
        stream: TextIO | None = None,
        unit: str = "it",
    ) -> None:
        self.desc, self.total, self.enabled, self.unit = desc, total, enabled, unit
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.t0 = time.perf_counter()
        self._next_decile = 1
        self._bar = None
        self._closed = False
        if not enabled:
            return
        if _isatty(self.stream):
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, leave=False)
        else:
            self._print(f"[{desc}] started" + (f": {total} {unit}" if total else ""))

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        if not self.total:
            return
        decile = self.done * 10 // self.total
        if decile >= self._next_decile and self.done < self.total:
            self._next_decile = decile + 1
            self._print(self.line())

    def line(self) -> str:
        elapsed = time.perf_counter() - self.t0
        eta = eta_s(self.done, self.total or 0, elapsed)
        pct = 100 * self.done // self.total if self.total else 0
        tail = f", ETA {eta:.0f} s" if eta is not None else ""
        return f"[{self.desc}] {self.done}/{self.total} ({pct}%) {elapsed:.0f} s elapsed{tail}"

    def close(self, outcome: str = "done") -> None:
        """The last line: ``[desc] done: N unit, S s``; another ``outcome`` (``interrupted``) also
        says how far it got (``34/168 unit``)."""
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        elapsed = time.perf_counter() - self.t0
        count = ""
        if self.total:
            count = f"{self.done} {self.unit}, " if outcome == "done" else f"{self.done}/{self.total} {self.unit}, "
        self._print(f"[{self.desc}] {outcome}: {count}{elapsed:.1f} s")

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(outcome(exc_type))


def outcome(exc_type: type[BaseException] | None) -> str:
    """How a block ended, for its last line: ``done``; ``interrupted`` (Ctrl-C, SIGTERM, which the
    sweep turns into KeyboardInterrupt, or a :func:`track` loop left early: ``GeneratorExit``);
    ``interrupted by ValueError`` for any other exception."""
    if exc_type is None:
        return "done"
    if issubclass(exc_type, (KeyboardInterrupt, SystemExit, GeneratorExit)):
        return "interrupted"
    return f"interrupted by {exc_type.__name__}"


def track(
    items: Iterable[T], desc: str, total: int | None = None, enabled: bool = True, unit: str = "it"
) -> Iterator[T]:
    """Iterate ``items`` with a :class:`Progress` (``total`` defaults to ``len(items)``)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(desc, total, enabled, unit=unit) as p:
        for x in items:
            yield x
            p.update()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def timing_table(timings: dict[str, float], notes: dict[str, str] | None = None) -> str:
    """Seconds and share of the total per stage, pipeline order first; ``notes`` adds a column."""
    notes = notes or {}
    order = stage_order()
    keys = [k for k in order if k in timings] + [k for k in timings if k not in order]
    total = timings.get("total_s") or sum(v for k, v in timings.items() if k != "total_s")
    lines = [f"{'stage':<14} {'seconds':>8} {'share':>6}"]
    for k in keys:
        share = "" if k == "total_s" or not total else f"{100 * timings[k] / total:5.1f}%"
        note = f"  {notes[k]}" if k in notes else ""
        lines.append(f"{k.removesuffix('_s'):<14} {timings[k]:>8.1f} {share:>6}{note}")
    return "\n".join(lines)
