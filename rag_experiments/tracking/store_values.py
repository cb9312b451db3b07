"""Values the tracking store can hold: any text an answer, a query or a document may carry.

MLflow's SQL store writes a span attribute as JSON and then reads the stored text back as JSON
once more (``mlflow.tracing.otel.translation.sanitize_attributes``, checked on mlflow 3.17.2): a
string that is itself JSON text is unwrapped, so an answer ``[1]`` comes back as the list ``[1]``,
and an answer of 1,000 nested brackets raises ``RecursionError`` inside the store (issue 36). A
string with a lone surrogate (``"\\ud800"``, which a JSON reply may carry) cannot be encoded as
UTF-8 at all. Such a string is stored as plain text instead: its JSON form, ASCII only
(:func:`as_text`), which MLflow's unwrapping turns back into the original string on read, and
which reads as the quoted text on a store that does not unwrap. Every replacement is counted
(run metric ``n_values_stored_as_text``, docs/tracing.md).
"""

from __future__ import annotations

import json
from typing import Any

#: The first character of JSON text that MLflow's store would unwrap (a string, object or array),
#: after JSON's leading whitespace.
_JSON_OPENERS = ('"', "[", "{")


def as_text(s: str) -> str:
    """The plain-text form of ``s``: ``json.dumps(s)`` (quoted, every non-ASCII character and every
    lone surrogate as a ``\\uXXXX`` escape), so it is valid UTF-8 and JSON text of a string."""
    return json.dumps(s, ensure_ascii=True)


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _parsed_by_store(s: str) -> bool:
    """True when MLflow's store would read ``s`` as JSON text (a string, object or array: it then
    replaces the string by what it parses) or fail trying (``RecursionError`` on deep nesting)."""
    if not s.lstrip(" \t\n\r").startswith(_JSON_OPENERS):
        return False
    try:
        return isinstance(json.loads(s), str | dict | list)
    except ValueError:  # not JSON text: stored as it is
        return False
    except RecursionError:
        return True


def storable(value: Any, top: bool = True) -> tuple[Any, int]:
    """``(value as the store can hold it, number of strings replaced by :func:`as_text`)``.

    Walks dicts, lists and tuples (tuples come back as lists, as JSON has them). A string is
    replaced when it cannot be encoded as UTF-8, or, as the whole value (``top``), when the store
    would parse it as JSON (:func:`_parsed_by_store`); a string nested in a dict or list is stored
    inside its container's JSON and never parsed on its own. Anything else is returned as it is.
    """
    if isinstance(value, str):
        if _encodable(value) and not (top and _parsed_by_store(value)):
            return value, 0
        return as_text(value), 1
    if isinstance(value, dict):
        out, n = {}, 0
        for k, v in value.items():
            out[k], m = storable(v, top=False)
            n += m
        return (out, n) if n else (value, 0)
    if isinstance(value, list | tuple):
        pairs = [storable(v, top=False) for v in value]
        n = sum(m for _, m in pairs)
        return ([v for v, _ in pairs], n) if n else (value, 0)
    return value, 0


def storable_record(rec: Any) -> Any:
    """A trace record (``tracking.traces.TraceRecord``) with every value the store cannot hold as it
    is in plain text (:func:`storable`), counted in its ``n_as_text``: span inputs, outputs,
    attributes and errors, tags, assessments' values and rationales."""
    n = 0

    def keep(value, top=True):
        nonlocal n
        value, m = storable(value, top)
        n += m
        return value

    spans = [
        sp._replace(
            inputs=keep(sp.inputs),
            outputs=keep(sp.outputs),
            error=keep(sp.error, top=False),
            # the store parses each attribute on its own, like the inputs and outputs
            attributes={k: keep(v) for k, v in sp.attributes.items()} if sp.attributes else sp.attributes,
        )
        for sp in rec.spans
    ]
    tags = {k: keep(v, top=False) for k, v in rec.tags.items()}
    pending = [
        p._replace(value=keep(p.value, top=False), rationale=keep(p.rationale, top=False))
        for p in rec.assessments
    ]
    return rec._replace(spans=spans, tags=tags, assessments=pending, n_as_text=n)
