"""What an answer's sentences are: the one decline detector and the one claim filter.

:func:`answer_sentences` gives every sentence of an answer a kind: a factual ``claim``, a
``decline`` ("I don't know", "not mentioned in the context"), or a non-claim — ``code`` (fenced
blocks, import lines, assignments, a sentence that is mostly code), ``filler`` (meta and
politeness: "Here is an example:", "I hope this helps", "The passage describes …"), a ``question``
or a bare ``heading`` — or a ``fragment`` of fewer than 3 words. Correctness on unanswerable
items, the abstention metrics, ``n_nonclaims`` and the judges' claim splitter (``judge.claims``)
all read it, so it sits here, below the judges (docs/metrics.md, "Claims and declines").
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from rag_experiments.stages.text import HEADING_RE, sentence_texts

__all__ = ["NONCLAIM_KINDS", "Sentence", "answer_sentences", "is_decline", "n_nonclaims"]

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
    r"^(?:this is |that is |it is |it's )?not (?:in|from|part of) the (?:provided |given )?"
    r"(?:context|documentation|docs|passages?|text|documents?|sources?)\b",
]
_DECLINE = re.compile("|".join(_DECLINE_PATTERNS), re.I)

#: The kinds that are neither a claim nor a decline nor a fragment: counted as ``n_nonclaims``.
NONCLAIM_KINDS = ("code", "filler", "question", "heading")

# A hedge turns into an answer after one of these: "I don't know, but X", "…; however, X".
_CONTRAST = re.compile(r"\s*(?:;|,?\s+(?:but|however|although|though)\b,?|\s[—–]\s)\s*", re.I)

_CITATION = re.compile(r"\s*\[(?:\d+(?:\s*[-,–]\s*\d+)*)\](?:\s*\[\d+\])*")
_MARKER = re.compile(r"^\s*(?:\d{1,9}[.)]|[-*+•])\s+")
_LABEL = re.compile(
    r"^\s*(?:[-*•]\s+|\d+[.)]\s+)?(?:\*\*)?(?:answer|quote|final answer|claim)\s*:?(?:\*\*)?\s*", re.I
)
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*\n?.*?(?:^ {0,3}\1[^\n]*$|\Z)", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_CODE_LINE = re.compile(
    r"^\s*(?:from\s+[\w.]+\s+import\b|import\s+[\w.]+|def\s+\w+\s*\(|class\s+\w+\s*[(:]|async\s+def\b|"
    r"return\b|@\w+|\$\s|>>>|#include\b|(?:const|let|var)\s+\w+\s*=|[\w.\[\]'\"]+\s*[+\-*/]?=\s*\S|"
    r"[\w.]+\([^()]*\)\s*;?\s*$|[{}<]|curl\s|pip\s+install\b|npm\s)"
)
_SYMBOLS = set("{}[]()<>=;$\"'`/\\|_*#&^~")
_FILLER = re.compile(
    r"^(?:here(?:'s| is| are)\b|below (?:is|are)\b|the following (?:is|are|steps?|examples?|code|snippet|list|shows?)\b|"
    r"let me\b|let's\b|"
    r"i hope\b|hope (?:this|that|it) helps|feel free\b|happy to help|glad to help|good luck\b|"
    r"please (?:refer|check|see|consult|visit|contact|let)\b|for (?:more|further) (?:information|details)\b|"
    r"(?:you )?(?:may|might) want to (?:check|refer|consult|contact)\b|"
    r"(?:the|this|that|these|each|every) (?:provided |given )?(?:passage|context|document|page|text|"
    r"section|article|source|documentation|doc|excerpt|snippet|example)s? (?:also )?"
    r"(?:provides?|describes?|discuss(?:es)?|talks? about|covers?|is about|are about|explains?|outlines?|"
    r"contains? (?:information|details)|gives? (?:an )?(?:overview|information|details)|shows?)\b(?!\s+that\b)|"
    r"(?:it|they) (?:also )?(?:provides?|describes?|discuss(?:es)?|talks? about|covers?|outlines?)\b"
    r"(?!\s+that\b)|"
    r"i (?:hope|trust)\b|let me know\b|(?:i'm|i am|we're|we are|so) sorry\b|sorry\b|(?:i|we) apologi[sz]e\b|if you have (?:any )?(?:more |other |further )?questions?\b)",
    re.I,
)
_FILLER_ANYWHERE = re.compile(
    r"\b(?:i hope (?:this|that|it) helps|hope (?:this|that|it) helps|let me know if)\b", re.I
)
_INTRO = re.compile(
    r"\b(?:(?:use|using|see|try|do|run|add|follow) the following|as follows|these steps|this example|like this)\b",
    re.I,
)
_BOLD_LINE = re.compile(r"^\s*\*\*[^*]+\*\*\s*:?\s*$")


@dataclass(frozen=True)
class Sentence:
    """One sentence (or fenced code block, or clause of a hedge) of an answer and its kind: claim,
    decline, code, filler, question, heading or fragment. ``text`` is cleaned for a claim (no
    citation markers, list markers, "Answer:" labels, backticks or surrounding quotes)."""

    text: str
    kind: str


def _plain(text: str) -> str:
    return unicodedata.normalize("NFKC", text).replace("’", "'").replace("‘", "'")


def _uncite(s: str) -> str:
    """``s`` without citation markers, except inside inline code ("`x = a[1]`" keeps its "[1]")."""
    parts = re.split(r"(`[^`\n]+`)", s)
    return "".join(p if p.startswith("`") else _CITATION.sub("", p) for p in parts)


def _clean(s: str) -> str:
    s = _MARKER.sub("", _uncite(s))
    return _LABEL.sub("", s).strip().strip("\"'“”").strip()


def _is_code(s: str) -> bool:
    """Mostly code: an import / assignment / call / shell line, inline code with fewer than 3 words
    of prose around it, or more than 30 % of its non-space characters code symbols."""
    prose = _INLINE_CODE.sub(" ", s)
    if prose != s and len(re.findall(r"[A-Za-z]{2,}", prose)) < 3:
        return True
    if _CODE_LINE.match(prose):
        return True
    chars = [c for c in s if not c.isspace()]
    return bool(chars) and sum(c in _SYMBOLS for c in chars) / len(chars) > 0.3


def _kind(s: str) -> str:
    """The kind of one cleaned sentence that is not a decline (order: code, question, filler, fragment)."""
    if _is_code(s):
        return "code"
    if s.rstrip("*_ )\"'").endswith("?"):
        return "question"
    if _FILLER.match(s) or _FILLER_ANYWHERE.search(s):
        return "filler"
    if s.rstrip("*_ ").endswith(":") and (len(re.findall(r"\w+", s)) <= 8 or _INTRO.search(s)):
        return "filler"  # "To rotate a key:", "You can use the following:"; a longer one may assert
    if len(re.findall(r"\w+", s)) < 3:
        return "fragment"
    return "claim"


def _is_heading(line: str) -> bool:
    """A bare heading line: ``# …``, a line that is all bold, or 2–6 Title-Case words without final
    punctuation."""
    if HEADING_RE.match(line) or _BOLD_LINE.match(line):
        return True
    words = line.split()
    return (
        2 <= len(words) <= 6
        and not _MARKER.match(line)
        and line.rstrip()[-1:] not in ".!?:;,)"
        and all(w[:1].isupper() or not w[:1].isalpha() or len(w) <= 3 for w in words)
    )


def _sentence(raw: str) -> list[Sentence]:
    """One split sentence → its clauses' kinds: a sentence with a decline is cut at "but", ";",
    "however" …, so "I don't know, but X" is a decline and the claim X."""
    s = _clean(raw)
    if not s:
        return []
    if not _DECLINE.search(s):
        return [Sentence(_INLINE_CODE.sub(lambda m: m.group(0)[1:-1], s), _kind(s))]
    out = []
    for part in _CONTRAST.split(s):
        part = part.strip(" ,.").strip()
        if not part:
            continue
        out.append(Sentence(part, "decline") if _DECLINE.search(part) else Sentence(part, _kind(part)))
    return out


def answer_sentences(answer: str | None) -> list[Sentence]:
    """Every sentence of ``answer`` with its kind, in order.

    Fenced code blocks are one ``code`` sentence each; the rest is read line by line (an answer's
    line breaks are its structure): a bare heading line is a ``heading``, any other line is split
    into sentences (``stages.text.sentence_texts``) and each is a decline (a decline pattern, see
    :data:`_DECLINE_PATTERNS`; cut at "but"/";"/"however" so a hedge keeps its claim), ``code``, a
    ``question`` (ends in "?"), ``filler`` (meta and politeness, or an intro ending in ":" of at
    most 8 words or announcing code or steps: "use the following", "as follows" …), a
    ``fragment`` (fewer than 3 words) or a ``claim``."""
    text = _plain(answer or "")
    out: list[Sentence] = []
    pos = 0
    for m in [*_FENCE.finditer(text), None]:
        chunk = text[pos : m.start() if m else len(text)]
        for line in chunk.splitlines():
            if not line.strip():
                continue
            if _is_heading(line):
                out.append(Sentence(line.strip(), "heading"))
                continue
            for raw in sentence_texts(line):
                out += _sentence(raw)
        if m:
            out.append(Sentence(m.group(0).strip(), "code"))
            pos = m.end()
    return out


def n_nonclaims(answer: str | None) -> int:
    """Sentences of the answer the claim splitter drops as non-claims (:data:`NONCLAIM_KINDS`:
    code, filler, question, heading); declines and fragments are not counted. 0 for no answer."""
    return sum(s.kind in NONCLAIM_KINDS for s in answer_sentences(answer))


def is_decline(answer: str) -> bool:
    """True when the answer declines and asserts nothing: some sentence (or clause) is a decline
    and none is a claim (:func:`answer_sentences`).

    Declines: "I don't know", "not mentioned in the context", "the documentation does not say ...",
    "cannot be determined", "not enough information", "I couldn't find any information", "none of
    the passages mention", "there's no mention of" ... (:data:`_DECLINE_PATTERNS`; tested on real
    SmolLM2 answers and typical API-model phrasings in tests/test_answer_metrics.py). A hedge that
    asserts is an answer: "I don't know, but webhooks are retried for 24 hours [1]", "Not in the
    context. Actually, X", "Refunds take 5 days; the docs do not say more" (its claims are judged,
    and on an unanswerable item it is a false answer). Code, filler, questions and headings around a
    decline do not make it an answer. An empty answer is not a decline (a failed generation).
    """
    kinds = {s.kind for s in answer_sentences(answer)}
    return "decline" in kinds and "claim" not in kinds
