"""Replicates (``replicates: R``): the generator of each replicate, and running them all.

Replicate 0 is the configured generator; replicate r samples with seed ``seed + r`` (each replicate
its own generation cache key, since the identity names the seed). At temperature 0 the answers
cannot differ, so replicates r > 0 reuse replicate 0 with a warning (docs/metrics.md, "Replicates,
noise and power").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rag_experiments.core.types import Generation

log = logging.getLogger(__name__)

__all__ = ["replicate_generators", "reseeded", "run_replicates"]


class _Reseeded:
    """A generator without ``with_seed`` under a replicate seed: calls go to it unchanged (the seed
    cannot reach it), but the identity names the seed so each replicate is cached separately."""

    def __init__(self, inner: Any, seed: int) -> None:
        self.inner, self.seed = inner, int(seed)
        self.model = getattr(inner, "model", "")
        self.concurrency = getattr(inner, "concurrency", 1)
        self.identity = json.dumps({"generator": inner.identity, "replicate_seed": self.seed}, sort_keys=True)

    def generate(self, prompts: list[list[dict[str, Any]]]) -> list[Generation]:
        return self.inner.generate(prompts)


def reseeded(generator: Any, seed: int) -> Any:
    """``generator`` with sampling seed ``seed`` (replicates): its own ``with_seed`` when it has one;
    otherwise a wrapper whose cache identity names the seed, with a warning that the generator's own
    sampling alone decides whether replicate answers differ."""
    with_seed = getattr(generator, "with_seed", None)
    if with_seed is not None:
        return with_seed(seed)
    log.warning(
        "%s has no with_seed(seed): replicate seeds cannot reach it; its own sampling decides whether "
        "replicate answers differ",
        type(generator).__name__,
    )
    return _Reseeded(generator, seed)


def replicate_generators(generator: Any, replicates: int) -> list:
    """The generator of each replicate: replicate 0 as configured, replicate r with seed
    ``seed + r`` (:func:`reseeded`). At temperature 0 the answers cannot differ: replicates r > 0
    are None (reuse replicate 0's answers and judgements, no model call) and a warning says so."""
    if replicates <= 1:
        return [generator]
    if getattr(generator, "temperature", None) == 0:
        log.warning(
            "replicates=%d at generator.temperature=0: a deterministic server returns the same answer "
            "%d times, so replicates 1..%d reuse replicate 0 (no extra calls; generation variance 0). "
            "Set generator.temperature > 0 to measure generation noise.",
            replicates,
            replicates,
            replicates - 1,
        )
        return [generator] + [None] * (replicates - 1)
    base = getattr(generator, "seed", None) or 0
    return [generator] + [reseeded(generator, base + r) for r in range(1, replicates)]


def run_replicates(
    rows: list[dict],
    stages: Any,
    replicates: int,
    run_one: Callable[..., None],
    ledger: Any,
) -> tuple[list[dict], list[int]]:
    """Every replicate of the per-item ``rows``: (long rows, item index of each row).
    ``run_one(rows_r, stages=…, ledger=…)`` generates and judges one replicate's copy of the rows
    in place with ``stages`` whose generator is the replicate's; the records of its steps join
    ``ledger`` (the run's, summed per slot). One replicate: ``rows`` themselves, without
    replicate columns; no generator: ``rows`` untouched. Long rows are item-major."""
    if not stages.generates:  # retrieval only (an app answers without a generator)
        return rows, list(range(len(rows)))
    reps: list[list[dict]] = []
    gens = replicate_generators(stages.generator, replicates) if stages.generator is not None else [None]
    for r, gen_r in enumerate(gens):
        if gen_r is None and r > 0:  # deterministic: replicate 0's rows, with no cost of their own
            rows_r = [dict(row, replicate=r, generation_cached=True) for row in reps[0]]
            for row in rows_r:
                row.update({c: 0.0 for c in row if c.startswith(("tokens_in_", "tokens_out_"))})
            reps.append(rows_r)
            continue
        rows_r = [dict(row) for row in rows] if replicates > 1 else rows
        run_one(rows_r, stages=replace(stages, generator=gen_r), ledger=ledger)
        if replicates > 1:
            seed = getattr(gen_r, "seed", None)
            for row in rows_r:
                row.update(replicate=r, generation_seed=-1 if seed is None else int(seed))
        reps.append(rows_r)
    long = [reps[r][i] for i in range(len(rows)) for r in range(len(reps))]
    return long, [i for i in range(len(rows)) for _ in reps]
