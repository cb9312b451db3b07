"""Near-miss quotes: a generated quote not found verbatim, matched to the most similar span.

Small models copy a sentence almost verbatim: Markdown emphasis, backticks and quote marks dropped,
a contraction, a word changed. ``evalset generate`` keeps such a reply for review as the
document's own span (which loads) with its similarity instead of dropping it
(docs/evalset-generation.md).
"""

from __future__ import annotations

import difflib
import re

NEAR_MISS_THRESHOLD = 0.85  # similarity (ratio) at or above which a quote not found is a near miss
_TOKEN = re.compile(r"\S+")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def _fold(s: str) -> str:
    """Lower-cased words of ``s`` without punctuation, one space apart: small models drop Markdown
    emphasis, backticks and quote marks when they copy a sentence."""
    return " ".join(re.sub(r"[^\w\s]", "", w) for w in s.lower().split()).strip()


def near_miss(
    passage: str, offset: int, quote: str, threshold: float = NEAR_MISS_THRESHOLD
) -> tuple[int, int, float] | None:
    """(start, end, similarity) of the span of ``passage`` most like a quote that was not found
    exactly, when similarity ≥ ``threshold``; else None. ``offset``: where the passage starts in
    its document (the span is returned in document offsets).

    Candidates: every run of L consecutive whitespace-separated words of the passage, L within ±2
    of the quote's word count. similarity = ``difflib.SequenceMatcher`` ratio 2·M / (|a| + |b|)
    of the two texts folded by :func:`_fold` (case, punctuation and spacing ignored; M = matched
    characters). Numbers must agree: a span whose numbers differ from the quote's is another fact,
    not a copying slip, and is never a near miss.
    """
    q = _fold(quote)
    if not q:
        return None
    numbers = _NUMBER.findall(quote)
    toks = [(m.start(), m.end()) for m in _TOKEN.finditer(passage)]
    n_q = len(q.split())
    best: tuple[float, int, int] = (0.0, 0, 0)
    sm = difflib.SequenceMatcher(autojunk=False)
    sm.set_seq2(q)
    for length in range(max(1, n_q - 2), n_q + 3):
        for i in range(len(toks) - length + 1):
            s, e = toks[i][0], toks[i + length - 1][1]
            sm.set_seq1(_fold(passage[s:e]))
            if sm.real_quick_ratio() <= best[0] or sm.quick_ratio() <= best[0]:
                continue
            r = sm.ratio()
            if r > best[0] and _NUMBER.findall(passage[s:e]) == numbers:
                best = (r, s, e)
    if best[0] < threshold:
        return None
    return offset + best[1], offset + best[2], best[0]
