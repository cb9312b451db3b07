"""Secret values never stored or printed: :func:`redact` is applied wherever an error is captured.

An endpoint may echo the API key in its error message ("Incorrect API key provided: sk-…"), and
that message would travel into ``per_query`` (json/parquet), ``mlflow.db`` tags, traces and the
terminal. Every capture site builds its text with :func:`error_text` (or passes text through
:func:`redact`), which replaces

- the value of every environment variable a stage was told to read its key from
  (``*.api_key_env``, registered by the stage with :func:`register_secret_env`),
- the value of any environment variable whose name says it is secret (``*API_KEY*``,
  ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*CREDENTIAL*``),
- anything shaped like a credential: ``Bearer <token>``, ``api_key=<value>``, ``sk-…`` keys,
  the password in ``postgresql://user:password@host/db``.
"""

from __future__ import annotations

import os
import re

MIN_SECRET_LEN = 8  # shorter values ("1", "true") would redact ordinary words
_SECRET_NAME = re.compile(r"API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_SHAPES = (
    # Authorization: Bearer <token>, api_key=<value>, "token": "<value>"
    re.compile(
        r"(?i)\b(bearer|basic|token|api[_-]?key|authorization|password|secret)"
        r"(\"?'?\s*[:=]\s*\"?'?\s*|\s+)(?!\[REDACTED)([A-Za-z0-9._~+/=-]{12,})"
    ),
    re.compile(r"\b(sk|pk|rk)(-)(?!\[REDACTED)([A-Za-z0-9_-]{12,})"),  # OpenAI-style keys
    # user:password@ in URIs; the scheme starts where a run of scheme characters starts, each run
    # scanned once (unanchored, a long run of letters was rescanned from every position: quadratic)
    re.compile(r"(?<![a-zA-Z0-9+.-])([a-z][a-z0-9+.-]*+://[^:/@\s]+)(:)(?!\[REDACTED)([^@\s]+)(?=@)"),
)
_registered: set[str] = set()


def register_secret_env(name: str | None) -> None:
    """Name an environment variable whose value is a secret (a stage's ``api_key_env``)."""
    if name:
        _registered.add(str(name))


def secret_values() -> list[tuple[str, str]]:
    """(variable name, value) of every secret in the environment now, longest value first."""
    found = {
        (name, value)
        for name, value in os.environ.items()
        if (name in _registered or _SECRET_NAME.search(name)) and len(value) >= MIN_SECRET_LEN
    }
    return sorted(found, key=lambda nv: -len(nv[1]))


def redact(text: str, shapes: bool = True) -> str:
    """``text`` with every secret value replaced by ``[REDACTED $NAME]`` and (``shapes``) every
    credential-shaped token by ``[REDACTED]`` (the word before it kept, so the message still
    reads). Texts a step returns pass ``core.text_gate``, which calls this."""
    if not text:
        return text
    for name, value in secret_values():
        if value in text:
            text = text.replace(value, f"[REDACTED ${name}]")
    for shape in _SHAPES if shapes else ():
        text = shape.sub(lambda m: f"{m.group(1)}{m.group(2)}[REDACTED]", text)
    return text


def error_text(exc: BaseException, limit: int = 500) -> str:
    """``Type: message`` of ``exc`` as every capture site stores it: redacted, then cut to ``limit``
    (redacted first, so a cut never leaves part of a key)."""
    return redact(f"{type(exc).__name__}: {exc}")[:limit]
