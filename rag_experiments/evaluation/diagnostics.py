"""Claim-level diagnostics after RAGChecker (Ru et al. 2024), adapted to our data (docs/metrics.md,
"Claim-level diagnostics").

Two kinds of claims meet three kinds of context:

- **gold claims** ``G``: the claims of the item's ``gold_answer`` (the configured judge's ``split``),
  or its ``key_facts`` when it has no gold answer (our key facts are mostly fragments such as "15"
  or "24 hours", which no judge can entail on their own);
- **answer claims** ``A``: the claims the judge split the generated answer into (the faithfulness
  claims);
- contexts: the retrieved top-k (concatenated, as the generator saw it), each retrieved chunk on
  its own (relevant = :func:`rag_experiments.evaluation.metrics.relevance` to a gold span), the
  answer, and the reference (the gold answer, else the key facts).

The functions here are pure: they take :class:`~rag_experiments.core.types.Verdict` lists. Only
:func:`diagnose` asks for verdicts, through the ``verdicts(claims, context)`` callable it is given
(the pipeline passes the configured judge behind the stage cache). An ``unparseable`` verdict is
never read as "no": a claim with one is left out of that metric's denominator and counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rag_experiments.core.types import Chunk, EvalItem, Verdict
from rag_experiments.evaluation.defaults import MIN_COVERAGE
from rag_experiments.evaluation.metrics import relevance
from rag_experiments.evaluation.walk import walk

#: The per-query diagnostic columns, in the order the docs and the report list them.
DIAGNOSTICS = (
    "claim_recall",
    "context_utilization",
    "noise_sensitivity_relevant",
    "noise_sensitivity_irrelevant",
    "hallucination",
    "self_knowledge",
)
VerdictFn = Callable[[list[str], str], list[Verdict]]


def _sup(v: Verdict) -> bool:
    return v.label == "supported"


def _parsed(v: Verdict) -> bool:
    return v.label in ("supported", "unsupported")


def claim_recall(context_verdicts: Sequence[Verdict]) -> float:
    """Share of gold claims entailed by the retrieved context.

    ``claim_recall = |{g in G : context ⊨ g}| / |{g in G : verdict parseable}|``; NaN when no gold
    claim has a parseable verdict (unparseable ones are excluded and counted, never read as "no").
    """
    den = [v for v in context_verdicts if _parsed(v)]
    return sum(map(_sup, den)) / len(den) if den else math.nan


def context_utilization(context_verdicts: Sequence[Verdict], answer_verdicts: Sequence[Verdict]) -> float:
    """Of the gold claims the context covers, the share the answer entails.

    ``answer_verdicts[i]`` judges the same gold claim as ``context_verdicts[i]`` against the answer.
    ``context_utilization = |{g : context ⊨ g and answer ⊨ g}| / |{g : context ⊨ g, answer verdict
    parseable}|``; NaN when the context covers no gold claim (nothing to utilise) or every covered
    claim's answer verdict is unparseable.
    """
    pairs = [(c, a) for c, a in zip(context_verdicts, answer_verdicts, strict=True) if _sup(c) and _parsed(a)]
    return sum(_sup(a) for _, a in pairs) / len(pairs) if pairs else math.nan


def classify_answer_claim(
    chunk_verdicts: Sequence[Verdict], relevant: Sequence[bool], reference_verdict: Verdict
) -> str | None:
    """The class of one answer claim, or None when a verdict it needs is unparseable.

    ``chunk_verdicts[j]``: the claim against retrieved chunk j alone; ``relevant[j]``: chunk j is
    relevant to a gold span; ``reference_verdict``: the claim against the reference (correct =
    entailed by it). Classes: supported by some chunk and correct → ``grounded_correct``; supported
    and incorrect → ``noise_relevant`` when a relevant chunk entails it, else ``noise_irrelevant``;
    supported by no chunk → ``self_knowledge`` when correct, else ``hallucination``.
    """
    if not _parsed(reference_verdict) or not all(map(_parsed, chunk_verdicts)):
        return None
    correct = _sup(reference_verdict)
    by = [r for v, r in zip(chunk_verdicts, relevant, strict=True) if _sup(v)]
    if not by:
        return "self_knowledge" if correct else "hallucination"
    if correct:
        return "grounded_correct"
    return "noise_relevant" if any(by) else "noise_irrelevant"


def _share(classes: Sequence[str | None], cls: str) -> float:
    """``|claims of class cls| / |classified claims|``; NaN when no claim is classified.

    The denominator is every answer claim with a class (None = an unparseable verdict: excluded
    and counted), as in RAGChecker, so noise_sensitivity_relevant + noise_sensitivity_irrelevant +
    hallucination + self_knowledge + share(grounded_correct) = 1."""
    done = [c for c in classes if c is not None]
    return sum(c == cls for c in done) / len(done) if done else math.nan


def noise_sensitivity_relevant(answer_claim_classes: Sequence[str | None]) -> float:
    """Share of the classified answer claims that are ``noise_relevant``: incorrect, yet entailed by
    a relevant retrieved chunk (:func:`classify_answer_claim`, :func:`_share`)."""
    return _share(answer_claim_classes, "noise_relevant")


def noise_sensitivity_irrelevant(answer_claim_classes: Sequence[str | None]) -> float:
    """Share of the classified answer claims that are ``noise_irrelevant``: incorrect and entailed
    only by irrelevant retrieved chunks."""
    return _share(answer_claim_classes, "noise_irrelevant")


def hallucination(answer_claim_classes: Sequence[str | None]) -> float:
    """Share of the classified answer claims that are ``hallucination``: entailed by no retrieved
    chunk and incorrect."""
    return _share(answer_claim_classes, "hallucination")


def self_knowledge(answer_claim_classes: Sequence[str | None]) -> float:
    """Share of the classified answer claims that are ``self_knowledge``: entailed by no retrieved
    chunk, yet correct (entailed by the reference)."""
    return _share(answer_claim_classes, "self_knowledge")


@dataclass
class Diagnosis:
    """One query's diagnostics: ``values`` (NaN where undefined), ``reasons`` (why, per NaN metric),
    ``n_unparseable`` (verdicts left out) and the claim lists behind them, for the per-query table."""

    values: dict[str, float] = field(default_factory=lambda: dict.fromkeys(DIAGNOSTICS, math.nan))
    reasons: dict[str, str] = field(default_factory=dict)
    n_unparseable: int = 0
    gold_claims: list[str] = field(default_factory=list)
    answer_classes: list[str | None] = field(default_factory=list)

    def undefined(self, metrics: Sequence[str], reason: str) -> None:
        for m in metrics:
            self.values[m] = math.nan
            self.reasons[m] = reason


def reference_text(item: EvalItem) -> str:
    """What an answer claim must be entailed by to be correct: the gold answer, else the key facts."""
    if item.gold_answer and item.gold_answer.strip():
        return item.gold_answer.strip()
    return "\n".join(f.strip() for f in item.key_facts if f and f.strip())


def gold_claims(item: EvalItem, split: Callable[[str], list[str]]) -> list[str]:
    """The item's gold claims: ``split(gold_answer)`` (the judge's claim splitter), else its key facts.

    Key facts come second because in our eval sets they are mostly fragments ("15", "24 hours")
    that make no claim a judge could check; the gold answer states them in sentences.
    """
    if item.gold_answer and item.gold_answer.strip():
        got = split(item.gold_answer)
        if got:
            return list(got)
    return [f.strip() for f in item.key_facts if f and f.strip()]


def _count_unparseable(*groups: Sequence[Verdict]) -> int:
    return sum(not _parsed(v) for g in groups for v in g)


def diagnose(
    item: EvalItem,
    answer: str,
    answer_claims: list[str],
    gold_claims: list[str],
    chunks: Sequence[Chunk],
    verdicts: VerdictFn,
    declined: bool,
    min_coverage: float = MIN_COVERAGE,
) -> Diagnosis:
    """The six diagnostics of one generated answer (docs/metrics.md, "Claim-level diagnostics").

    NaN cases (each with its reason in ``Diagnosis.reasons``): an unanswerable item (no gold
    claims, and no reference to call an answer claim correct) → all six; no gold claim → the two
    gold-claim metrics; no answer claim (a decline or fragments only) → the four answer-claim
    metrics. A declining answer states no gold claim, so its context_utilization is 0 when the
    context covers one (the generator ignored available evidence), without a judge call.
    Judge calls: |G| + |G covered| (+ 0 for a decline) + |A| × (k + 1).
    """
    d = Diagnosis(gold_claims=list(gold_claims))
    if not item.answerable:
        d.undefined(DIAGNOSTICS, "unanswerable item")
        return d
    context = "\n\n".join(c.text for c in chunks)
    gold_part = ("claim_recall", "context_utilization")
    if not gold_claims:
        d.undefined(gold_part, "no gold claims")
    else:
        ctx_v = verdicts(list(gold_claims), context)
        covered = [g for g, v in zip(gold_claims, ctx_v, strict=True) if _sup(v)]
        asked = [] if declined or not covered else verdicts(covered, answer)
        got = dict(zip(covered, asked, strict=True)) if asked else {}
        why = "declining answer" if declined else "not covered by the context"
        ans_v = [got.get(g, Verdict(g, "unsupported", rationale=why)) for g in gold_claims]
        # claim_recall, context_utilization: the registry's metrics of the gold claims' verdicts
        d.values.update(walk({"context_verdicts": ctx_v, "answer_verdicts": ans_v}, "diagnostic"))
        d.n_unparseable += _count_unparseable(ctx_v, asked)
        if math.isnan(d.values["claim_recall"]):
            d.reasons["claim_recall"] = "every verdict unparseable"
        if math.isnan(d.values["context_utilization"]):
            d.reasons["context_utilization"] = (
                "context covers no gold claim" if not covered else "every verdict unparseable"
            )
    answer_part = DIAGNOSTICS[2:]
    if not answer_claims:
        d.undefined(answer_part, "declining answer" if declined else "answer has no claims")
        return d
    reference = reference_text(item)
    if not reference:
        d.undefined(answer_part, "no gold answer or key facts to judge correctness by")
        return d
    ref_v = verdicts(list(answer_claims), reference)
    per_chunk = [verdicts(list(answer_claims), c.text) for c in chunks]
    # the one chunk ↔ gold-span definition of the retrieval metrics
    relevant = [any(relevance(c, s, min_coverage) for s in item.gold_spans) for c in chunks]
    d.answer_classes = [
        classify_answer_claim([pc[i] for pc in per_chunk], relevant, ref_v[i])
        for i in range(len(answer_claims))
    ]
    d.values.update(walk({"answer_claim_classes": d.answer_classes}, "diagnostic"))  # the four shares
    d.n_unparseable += _count_unparseable(ref_v, *per_chunk)
    if all(c is None for c in d.answer_classes):
        d.undefined(answer_part, "every answer claim has an unparseable verdict")
    return d
