"""Per-item assertions, evaluated: each check of an eval item's ``assert`` list (``core.types.Check``,
read by ``evalset.checks``) against one generated answer (docs/metrics.md, "Per-item assertions").

Pure functions. :func:`check_result` decides one check; :func:`assertion_columns` gives one row's
per-query columns — ``assertions`` (one struct per check: index, type, value, critical, passed,
detail; declared in ``core/query_table.py``), ``n_assertions_failed`` and ``n_critical_failed`` —
and :func:`assertion_aggregates` the run's sums. A check of an answer that failed (a generation
error) fails: nothing passes silently. Items outside the generation subset are not checked.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

import pandas as pd

from rag_experiments.core.query_table import cell
from rag_experiments.core.slots import steps
from rag_experiments.core.types import Check, EvalItem

__all__ = [
    "add_assertion_columns",
    "assertion_aggregates",
    "assertion_columns",
    "check_result",
    "cited_doc_ids",
    "match_form",
    "serving_latency_s",
]


def match_form(text: str) -> str:
    """What ``contains`` / ``not_contains`` compare: NFKC, casefolded, every run of whitespace one
    space, trimmed ("Never", "NEVER" and "never" match; "24  hours" matches "24 hours")."""
    return " ".join(unicodedata.normalize("NFKC", text or "").casefold().split())


def cited_doc_ids(cited_chunk_ids: Sequence[str] | None) -> list[str]:
    """The documents of the cited chunks (``chunk_id = "{doc_id}#{start}-{end}"``)."""
    return [c.rsplit("#", 1)[0] for c in cited_chunk_ids or []]


def serving_latency_s(row: dict[str, Any]) -> float:
    """The item's serving latency: the sum of its serving steps' ``latency_<column>_s`` (query,
    retrieval, rerank, generation or the app; not the judge), as ``evaluation.cost`` counts it."""
    total = 0.0
    for s in steps():
        v = row.get(f"latency_{s.column}_s") if s.column and s.serving else None
        if isinstance(v, int | float) and not math.isnan(v):
            total += float(v)
    return total


def check_result(
    check: Check,
    answer: str | None,
    declined: bool,
    cited: Sequence[str] | None,
    latency_s: float,
) -> tuple[bool, str]:
    """``(passed, detail)`` of one check on one answer. ``answer`` None: the generation failed, the
    check fails. ``cited``: the documents the answer cites (None: the prompt asks for no
    citations, so ``cites`` fails, saying so)."""
    kind, value = check.type, check.value
    if kind == "max_latency_s":
        ok = latency_s <= float(value)
        return ok, f"serving latency {latency_s:.3f} s {'≤' if ok else '>'} {float(value):g} s"
    if answer is None:
        return False, "no answer (the generation failed)"
    if kind in ("contains", "not_contains"):
        found = match_form(str(value)) in match_form(answer)
        ok = found if kind == "contains" else not found
        return ok, f"{'contains' if found else 'does not contain'} {value!r}"
    if kind in ("regex", "not_regex"):
        m = re.search(str(value), answer)
        ok = bool(m) if kind == "regex" else not m
        return ok, f"matches {m.group(0)[:80]!r}" if m else f"no match for {value!r}"
    if kind == "declines":
        return declined, "declines" if declined else "answers (does not decline)"
    if kind == "answers":
        return not declined, "answers" if not declined else "declines"
    if kind == "cites":
        if cited is None:
            return False, "the prompt asks for no citations (prompt=cite cites [n])"
        ok = value in cited
        return (
            ok,
            f"cites {value}" if ok else f"cites {', '.join(dict.fromkeys(cited)) or 'nothing'}, not {value}",
        )
    raise ValueError(f"unknown check type {kind!r}")  # evalset.checks refuses it at load


def assertion_columns(item: EvalItem, row: dict[str, Any]) -> dict[str, Any]:
    """One generated row's assertion columns: ``assertions`` (a struct per check of ``item``),
    ``n_assertions_failed``, ``n_critical_failed``. Reads the row's ``answer``, ``error``,
    ``declined``, ``cited_chunk_ids`` and latencies."""
    error = row.get("error")
    answer = None if isinstance(error, str) and error else row.get("answer")
    declined = bool(row.get("declined")) if answer is not None else False
    has_cites = row.get("cited_chunk_ids") is not None and not isinstance(row.get("cited_chunk_ids"), float)
    cited = cited_doc_ids(cell("cited_chunk_ids", row["cited_chunk_ids"])) if has_cites else None
    latency = serving_latency_s(row)
    out = []
    for i, c in enumerate(item.checks):
        passed, detail = check_result(c, answer, declined, cited, latency)
        out.append(
            {"index": i, "type": c.type, "value": "" if c.value is None else str(c.value),
             "critical": c.critical, "passed": passed, "detail": detail}
        )  # fmt: skip
    return {
        "assertions": out,
        "n_assertions_failed": sum(not a["passed"] for a in out),
        "n_critical_failed": sum(a["critical"] and not a["passed"] for a in out),
    }


def add_assertion_columns(rows: list[dict], items: Sequence[EvalItem], generated: Sequence[bool]) -> None:
    """The assertion columns on every generated row, when some item has checks (a run without any
    gets no column, so its table is as before); rows not generated get an empty list and NaN counts."""
    if not any(it.checks for it in items):
        return
    for row, it, gen in zip(rows, items, generated, strict=True):
        if gen:
            row.update(assertion_columns(it, row))
        else:
            row.update(assertions=[], n_assertions_failed=math.nan, n_critical_failed=math.nan)


def assertion_aggregates(per_query: pd.DataFrame) -> dict[str, int]:
    """``n_assertions_failed`` and ``n_critical_failed`` summed over the generated answers (every
    replicate), and ``n_assertions`` checked; {} for a run without checks."""
    if "n_assertions_failed" not in per_query:
        return {}
    got = per_query["n_assertions_failed"].notna()
    n = sum(len(cell("assertions", v)) for v in per_query.loc[got, "assertions"])
    return {
        "n_assertions": int(n),
        "n_assertions_failed": int(per_query.loc[got, "n_assertions_failed"].sum()),
        "n_critical_failed": int(per_query.loc[got, "n_critical_failed"].sum()),
    }
