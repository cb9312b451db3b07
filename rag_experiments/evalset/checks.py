"""Per-item assertions: an eval item's ``assert`` list, read and checked at load (docs/metrics.md,
"Per-item assertions").

Each entry has promptfoo's shape, ``{"type": "not_contains", "value": "never", "critical": true}``:

==================  ===========================  ==============================================
type                value                        passes when
==================  ===========================  ==============================================
``contains``        a non-empty string           the answer contains it (case and runs of
                                                 whitespace ignored)
``not_contains``    a non-empty string           the answer does not contain it (same rule)
``regex``           a Python regular expression  ``re.search`` finds it in the answer (as
                                                 written: case-sensitive unless ``(?i)``)
``not_regex``       a Python regular expression  ``re.search`` does not find it
``declines``        none                         the answer declines (``evaluation.declines``)
``answers``         none                         the answer does not decline
``cites``           a corpus ``doc_id``          the answer cites a chunk of that document
``max_latency_s``   a number > 0                 the item's serving latency is at most that
==================  ===========================  ==============================================

A problem (an unknown type or key, a missing or wrongly typed value, an invalid regex, a ``cites``
document the corpus does not have) is ``FILE:LINE: assert[i]: …``; ``evalset validate`` and every
run exit 2 on it. The evaluation is ``evaluation.assertions``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from rag_experiments.core.types import Check

__all__ = ["CHECK_TYPES", "parse_checks"]

#: Every check type, with what its ``value`` must be (None: no value).
CHECK_TYPES: dict[str, str | None] = {
    "contains": "a non-empty string",
    "not_contains": "a non-empty string",
    "regex": "a regular expression",
    "not_regex": "a regular expression",
    "declines": None,
    "answers": None,
    "cites": "a doc_id of the corpus",
    "max_latency_s": "a number > 0",
}
_KEYS = ("type", "value", "critical")


def _value_problem(
    kind: str, value: Any, doc_ids: set[str], did_you_mean: Callable[[str], str]
) -> str | None:
    need = CHECK_TYPES[kind]
    if need is None:
        return None if value is None else f"{kind} takes no value (got {value!r})"
    if value is None:
        return f"{kind}: missing value ({need})"
    if kind == "max_latency_s":
        ok = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > 0
        )
        return None if ok else f"max_latency_s: value must be a number > 0, got {value!r}"
    if not isinstance(value, str) or not value.strip():
        return f"{kind}: value must be {need}, got {value!r}"
    if kind in ("regex", "not_regex"):
        try:
            re.compile(value)
        except re.error as e:
            return f"{kind}: invalid regular expression {value!r}: {e}"
    if kind == "cites" and doc_ids and value not in doc_ids:
        return f"cites: unknown doc_id {value!r}{did_you_mean(value)}"
    return None


def parse_checks(
    raw: Any, where: str, doc_ids: Iterable[str] = (), did_you_mean: Callable[[str], str] = lambda _: ""
) -> tuple[list[Check], list[str]]:
    """An item's ``assert`` list → (checks, problems); ``where`` is ``FILE:LINE``. ``doc_ids``: the
    corpus's documents (a ``cites`` value must be one; empty: not checked)."""
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        return [], [f"{where}: assert: expected a list of checks, got {type(raw).__name__}"]
    ids = set(doc_ids)
    checks, problems = [], []
    for i, entry in enumerate(raw):
        at = f"{where}: assert[{i}]"
        if not isinstance(entry, dict):
            problems.append(f'{at}: expected an object like {{"type": "contains", "value": "…"}}')
            continue
        extra = [k for k in entry if k not in _KEYS]
        kind = entry.get("type")
        if extra:
            problems.append(
                f"{at}: unknown key(s) {', '.join(map(repr, extra))} (a check has type, value, critical)"
            )
        if not isinstance(kind, str) or kind not in CHECK_TYPES:
            problems.append(f"{at}: unknown type {kind!r} (one of {', '.join(CHECK_TYPES)})")
            continue
        critical = entry.get("critical", False)
        if not isinstance(critical, bool):
            problems.append(f"{at}: critical must be true or false, got {critical!r}")
            continue
        if why := _value_problem(kind, entry.get("value"), ids, did_you_mean):
            problems.append(f"{at}: {why}")
            continue
        checks.append(Check(kind, entry.get("value"), critical))
    return checks, problems
