"""The one gate every text a step returns passes before anything stores it (docs/reliability.md).

A step's texts (an answer, a rewrite, a judge's or an app's reply, an app's contexts) reach the
cache, ``mlflow.db``, ``per_query`` and the report. Before any of them sees a text, the step hands
it to :func:`gate_text` (or :func:`gate_texts` for a list), which does three duties once:

- **type**: a text must be a ``str``, a list of texts a ``list`` of them. A bare string where a
  list is expected is refused with :class:`TextTypeError`, never read one character at a time;
- **redaction** (``core.redaction``): the configured keys (every ``*.api_key_env``, the app's
  included), secret-named variables, ``sk-…``, ``Bearer …``, ``api_key=…`` and passwords in URIs.
  ``shapes=False`` replaces only the secret *values*: for texts quoted from the user's own corpus
  (an app's contexts are mapped onto corpus spans, and documentation about keys is full of
  ``sk-…``-shaped examples that must still map);
- **size cap**: a text longer than ``cap`` characters is cut there and :attr:`Gated.truncated` says
  so, so the caller counts it (the generator's ``max_answer_chars``, ``app.max_answer_chars``).

Redaction runs before the final cut (a cut never leaves part of a key), on a window of the text
just past the cap, so a 10 MB answer costs a regex pass over ``cap`` characters, not 10 MB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rag_experiments.core.redaction import redact

#: Characters kept past the cap before redacting, so a key that starts before the cap is seen whole
#: (the longest credential shape matched is far shorter).
_WINDOW_PAD = 4096


class TextTypeError(TypeError):
    """A step returned something other than the text (or list of texts) it declares."""


@dataclass(frozen=True)
class Gated:
    """A text that passed the gate: redacted, cut at the cap (``truncated``: it was)."""

    text: str
    truncated: bool = False


def gate_text(value: Any, what: str, cap: int | None = None, shapes: bool = True) -> Gated:
    """``value`` as a stored text: a ``str`` (else :class:`TextTypeError` naming ``what``),
    redacted, cut at ``cap`` characters (None: no cap)."""
    if not isinstance(value, str):
        raise TextTypeError(f"{what}: expected a string, got {type(value).__name__} {_shown(value)}")
    long = cap is not None and len(value) > cap
    text = redact(value[: cap + _WINDOW_PAD] if long else value, shapes=shapes)
    if cap is not None and len(text) > cap:
        return Gated(text[:cap], True)
    return Gated(text, long)


def gate_list(value: Any, what: str) -> list:
    """``value`` as a list: a ``list`` or ``tuple``; a bare string (or anything else) is refused
    with :class:`TextTypeError`, never iterated one character at a time."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise TextTypeError(f"{what}: expected a list, got {type(value).__name__} {_shown(value)}")
    return list(value)


def gate_texts(value: Any, what: str, cap: int | None = None, shapes: bool = True) -> list[str]:
    """``value`` as a list of stored texts (:func:`gate_list`), each through :func:`gate_text`."""
    return [gate_text(v, f"{what}[{i}]", cap, shapes).text for i, v in enumerate(gate_list(value, what))]


def _shown(value: Any) -> str:
    """A short, redacted view of a refused value for the error message."""
    return redact(repr(value)[:60])
