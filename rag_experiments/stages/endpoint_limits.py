"""Bounds on what an OpenAI-compatible endpoint can make us wait for or store (docs/reliability.md):
a total per-attempt deadline over the body, the ``Retry-After`` a 429/503 asks for, and a cap on an
answer's size."""

from __future__ import annotations

import json
import logging
import math
import time
from types import SimpleNamespace
from typing import Any

log = logging.getLogger(__name__)
CHARS_PER_TOKEN_CAP = 16  # no tokenizer makes 16 characters of one token: the cap never cuts an honest reply


class Retryable(Exception):
    """A failure worth retrying: 5xx, 429, timeout, connection error, malformed or empty reply."""


class GiveUp(Exception):
    """A failure that retrying within the deadline cannot fix (a Retry-After beyond it)."""


def retry_after_s(exc: Exception) -> float | None:
    """The seconds a 429/503 reply asks us to wait (``Retry-After: <seconds>``), else None.
    The HTTP-date form is not read (the backoff applies)."""
    response = getattr(exc, "response", None)
    value = getattr(response, "headers", {}).get("retry-after") if response is not None else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


def answer_cap(max_answer_chars: int | None, max_tokens: int) -> int:
    """The longest answer kept: ``max_answer_chars``, or ``max_tokens * 16`` when it is None."""
    return int(max_answer_chars) if max_answer_chars is not None else int(max_tokens) * CHARS_PER_TOKEN_CAP


def read_within(http_response: Any, deadline: float, timeout_s: float) -> Any:
    """The JSON body of ``http_response``, read chunk by chunk and given up at ``deadline``
    (time.monotonic): the client's timeout bounds each wait for a byte, so a body trickling one
    byte every 2 s would otherwise never end. Parsed leniently: attributes, no schema."""
    body = bytearray()
    for chunk in http_response.iter_bytes():
        body += chunk
        if time.monotonic() > deadline:
            raise Retryable(
                f"no complete reply within generator.timeout_s={timeout_s:g} s "
                f"(body still arriving after {len(body)} bytes)"
            )
    return json.loads(bytes(body), object_hook=lambda d: SimpleNamespace(**d))


def warn_truncated(generator: Any, generations) -> int:
    """Log how many of ``generations`` were cut at the generator's cap; returns the count."""
    if n_cut := sum(bool(getattr(g, "truncated", False)) for g in generations):
        cap = getattr(generator, "max_answer_chars", "?")
        log.warning(
            "%d answers cut at generator.max_answer_chars=%s (the endpoint ignored max_tokens)", n_cut, cap
        )
    return n_cut
