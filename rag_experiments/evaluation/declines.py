"""The one decline detector: does an answer decline ("I don't know", "not mentioned in the
context")? Correctness on unanswerable items, the abstention metrics and the judges' claim
splitter (``judge.claims``) all read it, so it sits here, below the judges."""

from __future__ import annotations

import re
import unicodedata

from rag_experiments.stages.text import sentence_texts

_DECLINE_PATTERNS = [
    r"\bi (?:do not|don't|dont) know\b",
    r"\bi (?:am not|'m not|m not) sure\b",
    r"\b(?:i|we) (?:cannot|can't|can not|could not|couldn't|am unable to|are unable to|was unable to|"
    r"were unable to) (?:answer|find|tell|say|determine|locate|help with (?:that|this))",
    r"\b(?:i|we) (?:do not|don't|dont) have (?:enough |sufficient |any |the )?(?:information|details|context)\b",
    r"\bnone of the (?:provided |given )?(?:context|documentation|docs|passages?|documents?|sources?) "
    r"(?:mentions?|says?|contains?|specif(?:y|ies)|states?|covers?|address(?:es)?|describes?|provides?)\b",
    r"\b(?:there is|there's|there are) no (?:mention|information|details?|data)\b",
    r"\bunable to (?:answer|find|determine)\b",
    r"\bno (?:relevant )?information (?:about|on|regarding|in|is|was)\b",
    r"\b(?:not|never) (?:mentioned|specified|stated|provided|covered|included|given|described|"
    r"discussed|addressed|available|found|present) (?:in|by) the (?:provided |given )?"
    r"(?:context|documentation|docs|passages?|text|documents?|sources?)\b",
    r"\bthe (?:provided |given )?(?:context|documentation|docs|passages?|text|documents?|sources?) "
    r"(?:does not|doesn't|do not|don't|did not|didn't) (?:say|mention|specify|state|contain|provide|"
    r"include|cover|answer|describe|discuss|address|tell)\b",
    r"\b(?:not enough|insufficient) (?:information|context)\b",
    r"\bcannot be (?:determined|answered|found)\b",
]
_DECLINE = re.compile("|".join(_DECLINE_PATTERNS), re.I)


def _plain(text: str) -> str:
    return unicodedata.normalize("NFKC", text).replace("’", "'").replace("‘", "'")


def is_decline(answer: str) -> bool:
    """True when the answer declines: its first sentence, or every sentence, is a decline.

    Declines: "I don't know", "not mentioned in the context", "the documentation does not say ...",
    "cannot be determined", "not enough information", "I couldn't find any information", "none of
    the passages mention", "there's no mention of" ... (:data:`_DECLINE_PATTERNS`; tested on real
    SmolLM2 answers and typical API-model phrasings in tests/test_answer_metrics.py). An empty
    answer is not a decline (it is a failed generation). Clauses split at ";" count as sentences,
    so "Refunds take 5 days; the docs do not say more" is *not* a decline: its first clause answers.
    """
    sents = [c for s in sentence_texts(_plain(answer or "")) for c in s.split(";") if c.strip()]
    if not sents:
        return False
    if _DECLINE.search(sents[0]):
        return True
    return all(_DECLINE.search(s) for s in sents)
