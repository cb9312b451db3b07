"""Judge self-consistency: the verdicts of ``judge.repeats`` asks of a stochastic judge (docs/judges.md).

Repeat 0 is the run's judge; its verdicts are the ones every metric uses, so ``repeats`` adds a
measurement and changes no other figure. Repeats 2..N are the same judge with ``seed + r`` (their
own identity, so each repeat's verdicts are cached separately and a resumed run re-asks nothing).
Per query the table gets ``judge_flip_rate`` (registered; its mean with CI is the run's flip rate)
and ``judge_repeat_labels``: per claim, the N labels in repeat order (JSON), from which a variance
split can count flips per claim. Repeats stay inside the query row (no ``judge_repeat`` column).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rag_experiments.cache import StageCache
from rag_experiments.stages.judging.cached import cached_verdicts


def claim_flips(labels: Sequence[Sequence[str]]) -> list[bool]:
    """Per claim, True when its labels across repeats are not all equal (``labels[claim][repeat]``)."""
    return [len(set(ls)) > 1 for ls in labels]


def query_flip_rate(labels: Sequence[Sequence[str]]) -> float:
    """flipped claims / claims of the query (:func:`claim_flips`); NaN when it has no claim."""
    flips = claim_flips(labels)
    return sum(flips) / len(flips) if flips else math.nan


def repeat_columns(
    repeats: Sequence[Any],
    judged: Sequence[Any],
    contexts: Sequence[str],
    cache: StageCache,
    calls: Counter,
) -> list[dict[str, Any]]:
    """Per judged answer (``judge_stage``'s ``JudgedAnswer``), its claims re-judged by each repeat judge:
    ``{"judge_flip_rate", "judge_repeat_labels"}`` ({} for a query not judged). The repeats' token
    usage joins the query's judge tally, so judge tokens and cost count every repeat."""
    out: list[dict[str, Any]] = []
    for j, context in zip(judged, contexts, strict=True):
        if j is None or not repeats:
            out.append({})
            continue
        claims, verdicts, tally = j.claims, j.verdicts, j.usage
        per_repeat = [[v.label for v in verdicts]]
        for rj in repeats:
            vs = cached_verdicts(rj, claims, context, cache, calls, tally, "repeat_verdicts")
            per_repeat.append([v.label for v in vs])
        by_claim = [list(ls) for ls in zip(*per_repeat, strict=True)]
        out.append(
            {"judge_flip_rate": query_flip_rate(by_claim), "judge_repeat_labels": json.dumps(by_claim)}
        )
    return out
