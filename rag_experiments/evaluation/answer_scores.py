"""The answer scores of the seed article that need no model: key-fact correctness and
faithfulness from the judge's verdicts (docs/metrics.md). Pure functions of one answer; the
registry (``evaluation/metric_table.py``) names them and the walk (``evaluation.walk``) calls them.
``judge.claims`` re-exports them for the judges.
"""

from __future__ import annotations

from collections.abc import Sequence

from rag_experiments.core.types import Verdict
from rag_experiments.evaluation.declines import is_decline
from rag_experiments.stages.text import normalise_text  # the one matching form (re-exported)

__all__ = ["correctness", "faithfulness_score", "key_fact_recall", "label_faithfulness", "normalise_text"]


def label_faithfulness(labels: Sequence[str]) -> float:
    """supported / (supported + unsupported) over verdict labels; NaN when none is scorable
    (unparseable verdicts are left out and counted elsewhere, never read as "no"). Judge repeats
    score each repeat's labels with it."""
    sup = sum(lab == "supported" for lab in labels)
    uns = sum(lab == "unsupported" for lab in labels)
    return sup / (sup + uns) if sup + uns else float("nan")


def faithfulness_score(verdicts: Sequence[Verdict]) -> float:
    """``faithfulness = |supported| / (|supported| + |unsupported|)`` over one answer's claim
    verdicts (:func:`label_faithfulness` of their labels); NaN when no claim is scorable (no
    claims, or every verdict unparseable)."""
    return label_faithfulness([v.label for v in verdicts])


def key_fact_recall(answer: str, key_facts: list[str]) -> float:
    """Fraction of ``key_facts`` found in the answer as whole words after :func:`normalise_text`.

    NaN when there are no key facts.
    """
    facts = [f for f in key_facts if f and f.strip()]
    if not facts:
        return float("nan")
    hay = f" {normalise_text(answer)} "
    found = sum(f" {normalise_text(f)} " in hay for f in facts)
    return found / len(facts)


def correctness(answer: str | None, key_facts: list[str], answerable: bool) -> float:
    """Answerable items: :func:`key_fact_recall` (a declining answer scores 0).
    Unanswerable items: 1.0 if the answer declines (:func:`is_decline`), else 0.0.
    No answer (``None``: the generation failed): NaN."""
    if answer is None:
        return float("nan")
    if not answerable:
        return 1.0 if is_decline(answer) else 0.0
    if is_decline(answer):
        return 0.0 if [f for f in key_facts if f and f.strip()] else float("nan")
    return key_fact_recall(answer, key_facts)
