"""The answer scores of the seed article that need no model: key-fact correctness and
faithfulness from the judge's verdicts (docs/metrics.md). Pure functions of one answer; the
registry (``evaluation/metric_table.py``) names them and the walk (``evaluation.walk``) calls them.
``judge.claims`` re-exports them for the judges.

A key fact counts only when the answer asserts it (:func:`fact_status`): found inside a negation
("never 307") it is ``negated``; denied, or with another value in its place ("1000 normal
closure, not 403", "48 hours" for "24 hours"), it is ``contradicted`` — docs/metrics.md,
"Key-fact correctness".
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rag_experiments.core.types import Verdict
from rag_experiments.evaluation.declines import is_decline
from rag_experiments.stages.text import (
    STOPWORDS,
    MatchToken,
    match_tokens,
    normalise_text,  # the one matching form (re-exported)
)

__all__ = [
    "FACT_STATUSES",
    "correctness",
    "fact_status",
    "fact_statuses",
    "faithfulness_score",
    "key_fact_counts",
    "key_fact_recall",
    "label_faithfulness",
    "normalise_text",
]

#: What an answer does with a key fact: states it, says it inside a negation, contradicts it
#: (denies it, or puts another value in its place), or leaves it out.
FACT_STATUSES = ("asserted", "negated", "contradicted", "absent")
_NUMBER = re.compile(r"^\d+(?:[.,]\d+)*$")


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


def _one_other(window: list[str], fact: list[str], numbers: bool) -> bool:
    """``window`` is ``fact`` with exactly one token replaced: a number by another number
    (``numbers``), else a content word by another content word."""
    diff = [(w, f) for w, f in zip(window, fact, strict=True) if w != f]
    if len(diff) != 1:
        return False
    w, f = diff[0]
    if numbers:
        return bool(_NUMBER.match(w) and _NUMBER.match(f))
    return w not in STOPWORDS and f not in STOPWORDS and not _NUMBER.match(f)


def _another_value(
    tokens: list[MatchToken], fact: list[str], found: list[int], others: frozenset[str] = frozenset()
) -> bool:
    """Does the answer assert another value in the fact's place? (a) A fact with a number and
    more ("24 hours"): the same words with another number, asserted anywhere ("48 hours").
    (b) A fact the answer negates: in the same sentence, another number asserted (a fact with a
    number: "200 …, never 307") or, for a fact of several words, the fact with one content word
    replaced ("linear backoff, not exponential backoff"). A value that is one of the item's other
    key facts (``others``, their matching forms) is not another value: "80%" beside "100%"."""
    n, words = len(fact), [t.word for t in tokens]
    has_number = any(_NUMBER.match(f) for f in fact)
    other_words = {w for o in others for w in o.split()}
    windows = [
        i
        for i in range(len(words) - n + 1)
        if not tokens[i].negated and " ".join(words[i : i + n]) not in others
    ]
    if has_number and n > 1 and any(_one_other(words[i : i + n], fact, True) for i in windows):
        return True
    for i in found:  # negated occurrences
        same = [t for t in tokens if t.sentence == tokens[i].sentence and not t.negated]
        if has_number and any(
            _NUMBER.match(t.word) and t.word not in fact and t.word not in other_words for t in same
        ):
            return True
        if n > 1 and any(
            tokens[j].sentence == tokens[i].sentence and _one_other(words[j : j + n], fact, False)
            for j in windows
        ):
            return True
    return False


def fact_status(tokens: list[MatchToken], fact: str, others: Sequence[str] = ()) -> str:
    """What an answer (its :func:`~rag_experiments.stages.text.match_tokens`) does with ``fact``
    (one of :data:`FACT_STATUSES`), matched as whole tokens of the matching form:

    - ``asserted``: some occurrence is outside every negation scope;
    - ``contradicted``: not asserted, and an occurrence is denied ("never 307", "not a 403",
      "isn't 24 hours") or the answer asserts another value in its place (:func:`_another_value`);
    - ``negated``: found only inside negation scopes ("is not signed with HMAC-SHA256", "without
      the PORT variable"), with nothing asserted in its place;
    - ``absent``: not found.

    ``others``: the item's other key facts, which are never "another value" of this one.
    """
    fact_words = normalise_text(fact).split()
    if not fact_words:
        return "absent"
    n, words = len(fact_words), [t.word for t in tokens]
    found = [i for i in range(len(words) - n + 1) if words[i : i + n] == fact_words]
    if any(not tokens[i].negated for i in found):
        return "asserted"
    other_forms = frozenset(normalise_text(o) for o in others if o != fact)
    if any(tokens[i].denied for i in found) or _another_value(tokens, fact_words, found, other_forms):
        return "contradicted"
    return "negated" if found else "absent"


def fact_statuses(answer: str, key_facts: list[str]) -> list[str]:
    """:func:`fact_status` of each non-blank key fact in ``answer``, in order."""
    tokens = match_tokens(answer or "")
    facts = [f for f in key_facts if f and f.strip()]
    return [fact_status(tokens, f, facts) for f in facts]


def key_fact_recall(answer: str, key_facts: list[str]) -> float:
    """Fraction of ``key_facts`` the answer asserts (:func:`fact_status` ``asserted``): found as
    whole tokens after :func:`normalise_text` and outside every negation scope. A negated or
    contradicted fact counts 0.

    NaN when there are no key facts.
    """
    statuses = fact_statuses(answer, key_facts)
    if not statuses:
        return float("nan")
    return statuses.count("asserted") / len(statuses)


def key_fact_counts(answer: str | None, key_facts: list[str], answerable: bool) -> dict[str, int]:
    """``n_negated_key_facts`` and ``n_contradicted_key_facts`` of one answer: its key facts found
    only inside a negation, and those it contradicts (:func:`fact_status`). 0 for no answer, a
    decline and an unanswerable item (whose correctness is the decline, not its facts)."""
    if answer is None or not answerable or is_decline(answer):
        return {"n_negated_key_facts": 0, "n_contradicted_key_facts": 0}
    statuses = fact_statuses(answer, key_facts)
    return {
        "n_negated_key_facts": statuses.count("negated"),
        "n_contradicted_key_facts": statuses.count("contradicted"),
    }


def correctness(answer: str | None, key_facts: list[str], answerable: bool) -> float:
    """Answerable items: :func:`key_fact_recall` (a declining answer scores 0; a fact the
    answer negates or contradicts scores 0).
    Unanswerable items: 1.0 if the answer declines (:func:`is_decline`), else 0.0.
    No answer (``None``: the generation failed): NaN."""
    if answer is None:
        return float("nan")
    if not answerable:
        return 1.0 if is_decline(answer) else 0.0
    if is_decline(answer):
        return 0.0 if [f for f in key_facts if f and f.strip()] else float("nan")
    return key_fact_recall(answer, key_facts)
