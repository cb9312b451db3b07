"""The judge-independent half of judging: claims, verdict parsing, and the scores built on verdicts.

Verdicts are ``supported`` / ``unsupported`` / ``unparseable`` (docs/metrics.md). An unparseable reply is
counted and excluded from faithfulness, never read as "no". Every judge backend
(:mod:`.heuristic`, :mod:`.llm`) implements the :class:`Judge` protocol on top of these helpers.
"""

from __future__ import annotations

import json
import re
from typing import Protocol

from rag_experiments.core.types import Verdict
from rag_experiments.evaluation.answer_scores import (  # noqa: F401  (re-exported for the judges)
    correctness,
    key_fact_recall,
    label_faithfulness,
    normalise_text,
)
from rag_experiments.evaluation.declines import (  # noqa: F401  (re-exported: the judges' one detector and filter)
    _CITATION,
    _DECLINE,
    _plain,
    answer_sentences,
    is_decline,
)

# -- text utilities -----------------------------------------------------------------------------


def split_claims(answer: str) -> list[str]:
    """Claims of an answer = its sentences of kind ``claim`` (``evaluation.declines.answer_sentences``):
    without citations, list markers, labels, declines, fragments of fewer than 3 words, and the
    non-claims (code, filler and meta sentences, questions, bare headings; counted as
    ``n_nonclaims``). A declining answer has no claims; a hedge that asserts keeps its claims.
    """
    return [s.text for s in answer_sentences(answer) if s.kind == "claim"]


def is_claim(text: str) -> bool:
    """True when ``text`` reads as one factual claim: every sentence of it is of kind ``claim``
    (used on claims an LLM listed, which may be code or filler lifted from the answer)."""
    kinds = [s.kind for s in answer_sentences(text)]
    return bool(kinds) and all(k == "claim" for k in kinds)


# -- verdict parsing ----------------------------------------------------------------------------

_YESNO = re.compile(r"^(yes|no|supported|unsupported|not supported)[.!]*$", re.I)
_LABELS = {"yes": "supported", "supported": "supported", "no": "unsupported"}
_LABELS.update({"unsupported": "unsupported", "not supported": "unsupported"})


def parse_verdict(text: str) -> str:
    """Read a judge reply strictly: "supported", "unsupported" or "unparseable".

    Accepted: a bare yes/no (any case, trailing "." or "!", optional surrounding quotes, ``**`` or a
    code fence), the bare words supported/unsupported, JSON ``{"verdict": "supported"|
    "unsupported"}`` or ``{"supported": true|false}``. Everything else is unparseable, including
    hedges ("yes, but it depends"), prose ("Sure! The answer is yes"), empty replies and garbage:
    guessing a label from prose is how "no"-biased parsers inflate unfaithfulness.
    """
    if not isinstance(text, str):
        return "unparseable"
    s = text.strip()
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", s, re.S)
    if fence:
        s = fence.group(1).strip()
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except ValueError:
            return "unparseable"
        if not isinstance(obj, dict) or len(obj) != 1:
            return "unparseable"
        if "verdict" in obj and isinstance(obj["verdict"], str):
            v = obj["verdict"].strip().lower()
            return v if v in ("supported", "unsupported") else "unparseable"
        if "supported" in obj and isinstance(obj["supported"], bool):
            return "supported" if obj["supported"] else "unsupported"
        return "unparseable"
    s = s.strip("*\"'` \t\n")
    m = _YESNO.fullmatch(s)
    if not m:
        return "unparseable"
    return _LABELS[m.group(1).lower()]


_FOLDED = {"yes": "supported", "no": "unsupported"}


def parse_folded(text: str) -> list[tuple[str, str]] | None:
    """A folded judge reply (``judge.fold=true``: claims and verdicts in one call) read strictly:
    ``[(claim, label), ...]`` with label supported / unsupported / unparseable, or None when the
    reply is not ``{"claims": [...]}`` (not JSON, another shape, extra keys): the whole reply is
    unread, never a list of "no"s.

    An item is ``{"claim": <text>, "supported": "yes"|"no"|true|false}`` and nothing else; any other
    item is one ``unparseable`` claim (its text: the claim if it has one, else the item as JSON),
    counted like an unparseable verdict. A listed claim that is code, filler, a question or a
    heading is dropped, as :meth:`~rag_experiments.judge.llm.LLMJudge.split` drops it."""
    if not isinstance(text, str):
        return None
    s = text.strip()
    fence = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", s, re.S)
    s = fence.group(1).strip() if fence else s
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    if not isinstance(obj, dict) or set(obj) != {"claims"} or not isinstance(obj["claims"], list):
        return None
    out = []
    for item in obj["claims"]:
        claim = item.get("claim") if isinstance(item, dict) else None
        if not isinstance(claim, str) or not claim.strip():
            out.append((json.dumps(item, ensure_ascii=False), "unparseable"))
            continue
        claim = _CITATION.sub("", claim).strip()
        said = item.get("supported")
        said = ("no", "yes")[said] if isinstance(said, bool) else said.strip().lower() if isinstance(said, str) else None
        label = _FOLDED.get(said) if set(item) == {"claim", "supported"} else None
        if label is None:
            out.append((claim, "unparseable"))
        elif len(re.findall(r"\w+", claim)) >= 3 and is_claim(claim):
            out.append((claim, label))
    return out


# -- protocol -----------------------------------------------------------------------------------


class Judge(Protocol):
    identity: str
    model: str | None

    def verdicts(self, claims: list[str], context: str) -> list[Verdict]: ...

    def answer_relevance(self, query: str, answer: str) -> tuple[float, str]: ...

    def split(self, answer: str) -> list[str]: ...


# -- metrics helpers ----------------------------------------------------------------------------


def faithfulness(verdicts: list[Verdict]) -> tuple[float, int, int]:
    """(supported / (supported + unsupported), n_claims, n_unparseable).

    Unparseable verdicts are excluded from the ratio and counted; NaN when no claim is scorable
    (no claims, or all unparseable).
    """
    labels = [v.label for v in verdicts]
    return label_faithfulness(labels), len(labels), sum(lab == "unparseable" for lab in labels)
