"""Strict parsers of model replies, shared by every step that reads one (docs/stages.md).

A reply that does not say what was asked is a counted parse error, never a guess:

- :func:`parse_score`: a score reply must hold exactly one number on the declared scale ("7",
  "Score: 7", "7/10", "7 out of 10"); "On a scale of 0 to 10, this is a 7" names three numbers and
  is refused, as is a number off the scale;
- :func:`drop_preamble`: a chat preamble line ("Sure! Here is a rewritten query:") is not the
  answer; it is dropped before the answer is read.
"""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.]*\d)")
# "7/10", "7 / 10", "7 out of 10": the scale's top named beside the score is not a second number
_OUT_OF = re.compile(r"(-?\d+(?:\.\d+)?)\s*(?:/|out of)\s*(\d+(?:\.\d+)?)", re.I)
_OPENER = r"(?:sure|certainly|of course|okay|ok|absolutely|great|alright|here(?:'s| is| are)|below is|the (?:rewritten|search) quer(?:y|ies) (?:is|are))"
# an opener line that introduces what follows (ends with a colon), or an interjection alone ("Sure!")
_PREAMBLE = re.compile(rf"^\s*(?:{_OPENER}\b[^\n]*[:：]|(?:sure|certainly|of course|okay|ok|absolutely)[\s!.,]*)\s*$", re.I)


class ParseError(ValueError):
    """A reply that does not hold what was asked for."""


def parse_score(reply: str, lo: float = 0.0, hi: float = 10.0) -> float:
    """The one number of ``reply`` on the scale [lo, hi]; :class:`ParseError` when there is none,
    more than one, or it is off the scale or not finite."""
    text = (reply or "").strip()
    outs = list(_OUT_OF.finditer(text))
    if len(outs) == 1 and float(outs[0].group(2)) == hi:  # "7/10": the score and the scale's top
        text = text[: outs[0].start()] + outs[0].group(1) + text[outs[0].end() :]
    found = _NUMBER.findall(text)
    if len(found) != 1:
        what = "no number" if not found else f"{len(found)} numbers ({', '.join(found[:4])})"
        raise ParseError(f"expected one number from {lo:g} to {hi:g}, got {what}")
    x = float(found[0])
    if not math.isfinite(x) or not lo <= x <= hi:
        raise ParseError(f"expected one number from {lo:g} to {hi:g}, got {found[0]}")
    return x


def is_preamble(line: str) -> bool:
    """True for a chat preamble line ("Sure! Here is the query:", "Here are 3 queries:")."""
    return bool(_PREAMBLE.match(line or ""))


def drop_preamble(reply: str) -> str:
    """``reply`` without its leading preamble lines (and the blank lines after them)."""
    lines = (reply or "").splitlines()
    while lines and (not lines[0].strip() or is_preamble(lines[0])):
        lines.pop(0)
    return "\n".join(lines)
