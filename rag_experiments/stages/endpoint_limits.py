"""A cap on an answer's size (docs/reliability.md); the deadline, ``Retry-After`` and the reply's
size cap are the endpoint client's (``stages.endpoint``)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)
CHARS_PER_TOKEN_CAP = 16  # no tokenizer makes 16 characters of one token: the cap never cuts an honest reply


def answer_cap(max_answer_chars: int | None, max_tokens: int) -> int:
    """The longest answer kept: ``max_answer_chars``, or ``max_tokens * 16`` when it is None."""
    return int(max_answer_chars) if max_answer_chars is not None else int(max_tokens) * CHARS_PER_TOKEN_CAP


def warn_truncated(generator: Any, generations) -> int:
    """Log how many of ``generations`` were cut at the generator's cap; returns the count."""
    if n_cut := sum(bool(getattr(g, "truncated", False)) for g in generations):
        cap = getattr(generator, "max_answer_chars", "?")
        log.warning(
            "%d answers cut at generator.max_answer_chars=%s (the endpoint ignored max_tokens)", n_cut, cap
        )
    return n_cut
