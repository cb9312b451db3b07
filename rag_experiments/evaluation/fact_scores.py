"""Key-fact correctness read by a judge model (``correctness_judged``, issue 45): each reference
fact judged supported, contradicted or absent in the answer (``judge.llm.LLMJudge.fact_verdicts``),
beside the string-match ``correctness``. Pure functions over the labels."""

from __future__ import annotations

import math
from collections.abc import Sequence


def correctness_judged(fact_labels: Sequence[str], answerable: bool, declined: bool) -> float:
    """Answerable: supported / (supported + contradicted + absent) over the facts the judge read
    (unparseable verdicts excluded and counted, never read as absent); NaN when none was read.
    Unanswerable: 1.0 if the answer declines, else 0.0 (no judge call).

    The facts are the item's strong key facts, or its reference answer as one fact when it has
    none (``reference_facts``)."""
    if not answerable:
        return 1.0 if declined else 0.0
    read = [lab for lab in fact_labels if lab in ("supported", "contradicted", "absent")]
    return sum(lab == "supported" for lab in read) / len(read) if read else math.nan


def reference_facts(key_facts: Sequence[str], gold_answer: str | None) -> list[str]:
    """What the judge checks the answer against: the strong key facts, else the reference answer."""
    facts = [f for f in key_facts if f and f.strip()]
    if facts:
        return facts
    return [gold_answer.strip()] if gold_answer and gold_answer.strip() else []
