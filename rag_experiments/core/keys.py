"""MLflow's rule for metric and param keys, defined once here (MLflow 3.17,
``mlflow.utils.validation``: ``validate_param_and_metric_name`` and ``path_not_unique``).

A key may hold letters and digits (Unicode ``\\w``), ``_ - . : /`` and spaces, at most 250
characters, and must read the same as a normalised POSIX path (no ``//``, ``./``, ``..``,
leading or trailing ``/``). Eval-set tags become part of ``by_tag/<tag>/<metric>`` keys, so
``evalset.load_evalset`` rejects a tag that breaks this rule at load, not after the run's work.
"""

from __future__ import annotations

import posixpath
import re

MAX_KEY_LENGTH = 250
MAX_TAG_LENGTH = 100  # leaves room for by_tag/<tag>/<the longest metric key> within 250
_KEY_CHARS = re.compile(r"[/\w.\- :]*")
ALLOWED = "letters, digits, '_', '-', '.', ':', ' ' and '/'"


def key_problem(key: str) -> str | None:
    """What MLflow would reject in the metric/param key ``key``; None when it is valid."""
    if not key:
        return "empty"
    if len(key) > MAX_KEY_LENGTH:
        return f"longer than {MAX_KEY_LENGTH} characters"
    if not _KEY_CHARS.fullmatch(key):
        bad = sorted({c for c in key if not _KEY_CHARS.fullmatch(c)})
        shown = " ".join(f"{c!r} (U+{ord(c):04X})" for c in bad[:5])
        return f"has characters MLflow rejects in a metric key: {shown}; allowed: {ALLOWED}"
    norm = posixpath.normpath(key)
    if norm != key or norm == "." or norm.startswith(("..", "/")):
        return f"reads as the path {norm!r} (no '//', './', '..', leading or trailing '/')"
    return None


def tag_problem(tag: str) -> str | None:
    """What makes ``by_tag/<tag>/…`` an invalid MLflow key; None when the tag is usable."""
    if len(tag) > MAX_TAG_LENGTH:
        return f"longer than {MAX_TAG_LENGTH} characters"
    return key_problem(f"by_tag/{tag}/x")
