"""Direction and null-result cues of a sentence, in general language (a verifier feature).

A claim that says a quantity goes up, against evidence that says it goes down, or that says an
effect exists against evidence that reports none ("no significant difference", "was not
associated with"), is contradicted while every content word is covered. The cues, fixed before
any measurement and not drawn from any dataset:

- direction: +1 for words of increase (increase, rise, higher, more, improve, enhance, gain, ...),
  −1 for words of decrease (decrease, reduce, lower, less, fewer, decline, worsen, ...); a
  direction word with a negation up to three words before it ("did not increase") is a null
  result, not a direction. A sentence's direction is the sign of the sum.
- null result: the negated direction words above, and phrases that report no effect ("no
  (significant) effect/difference/change/association/correlation/benefit", "not (significantly)
  associated/correlated/related/different", "unchanged", "unaffected", "independent of", "failed
  to", "did not differ", "comparable to", "similar to").

Features of (claim, evidence sentence): ``dir_conflict`` = 1 when both have a direction and the
signs differ; ``null_mismatch`` = 1 when exactly one of them reports a null result.
"""

from __future__ import annotations

import re

_WORD = re.compile(r"[a-z]+(?:'t)?")
_UP = re.compile(
    r"increas\w*|rise[sn]?|rising|rose|rais(?:e|es|ed|ing)|higher|highest|greater|more|improv\w*"
    r"|enhanc\w*|boost\w*|gain(?:s|ed|ing)?|elevat\w*|accelerat\w*|strengthen\w*|exceed\w*|larger"
    r"|longer|faster|better|grow(?:s|ing|n)?|grew|expand\w*|augment\w*|amplif\w*"
)
_DOWN = re.compile(
    r"decreas\w*|reduc\w*|lower(?:s|ed|ing)?|lowest|less|fewer|declin\w*|drop(?:s|ped|ping)?"
    r"|fall(?:s|ing|en)?|fell|worse|worsen\w*|impair\w*|diminish\w*|weaken\w*|slow(?:s|ed|ing|er)?"
    r"|shrink\w*|shrank|smaller|shorter|loss(?:es)?|lose|loses|losing|lost|attenuat\w*"
    r"|suppress(?:es|ed|ing)?|inhibit(?:s|ed|ing)?|cut(?:s|ting)?"
)
_NEG = frozenset("not no never without neither nor cannot can't don't doesn't didn't isn't aren't wasn't weren't".split())
_NULL = re.compile(
    r"\bno (?:statistically |clinically )?(?:significant |meaningful |detectable |measurable )?"
    r"(?:effect|effects|difference|differences|change|changes|association|associations|correlation|"
    r"relationship|impact|benefit|improvement|increase|decrease|reduction)\b"
    r"|\bnot (?:statistically |significantly )?(?:significant|associated|correlated|related|different|"
    r"affected|altered|changed)\b"
    r"|\b(?:unchanged|unaffected|unaltered|independent of|failed to|did not differ|do not differ|"
    r"does not differ|comparable to|similar to|no longer)\b"
)


def _direction_words(words: list[str]) -> tuple[int, bool]:
    """(sum of signed direction words, whether a direction word was negated)."""
    total, negated = 0, False
    for i, w in enumerate(words):
        sign = 1 if _UP.fullmatch(w) else -1 if _DOWN.fullmatch(w) else 0
        if not sign:
            continue
        if any(v in _NEG for v in words[max(0, i - 3) : i]):
            negated = True
        else:
            total += sign
    return total, negated


def cues(text: str) -> tuple[int, bool]:
    """(direction in {-1, 0, 1}, reports a null result) of one sentence."""
    low = text.lower()
    total, negated = _direction_words(_WORD.findall(low))
    return (total > 0) - (total < 0), negated or bool(_NULL.search(low))


def polarity_features(claim: str, evidence: str) -> list[float]:
    """[dir_conflict, null_mismatch] of a claim against its evidence sentence (module docstring)."""
    dc, nc = cues(claim)
    de, ne = cues(evidence)
    return [float(dc * de < 0), float(nc != ne)]
