"""Per-item assertions across two runs: which checks fail for a candidate, and whether they failed for
the baseline too (docs/metrics.md, "Per-item assertions").

A check is one entry of an item's ``assert`` list, known by (item id, its index); its results are
the ``assertions`` column of each run's per-query table (``evaluation.assertions``). A check fails
for a run when it fails on any of the run's answers to the item (any replicate). ``gate`` fails a
candidate with any critical check failing, whatever the aggregates (:func:`critical_failures`);
``compare`` lists the checks the candidate newly fails (:func:`newly_failing`). Pure: no MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from rag_experiments.core.query_table import cell

__all__ = ["CheckFailure", "check_results", "critical_failures", "newly_failing"]


@dataclass(frozen=True)
class CheckFailure:
    """A check the candidate fails: the item, the check, why (``detail``: the candidate's first
    failing answer) and the baseline's result on it: ``fails too``, ``passes`` or ``not checked``
    (the baseline has no result for it: another eval-set version, or the item was not generated)."""

    item_id: str
    query: str
    index: int
    type: str
    value: str
    critical: bool
    detail: str
    baseline: str

    @property
    def check(self) -> str:
        """``not_contains 'never'``, ``declines``: the check as a reader names it."""
        return f"{self.type} {self.value!r}" if self.value else self.type

    @property
    def new(self) -> bool:
        """The baseline passes it: the candidate broke it."""
        return self.baseline == "passes"


def check_results(table: pd.DataFrame) -> dict[tuple[str, int], dict]:
    """(item id, check index) → the check with ``passed`` False when any answer to the item fails it
    (its first failing ``detail``) and the item's ``query``; {} for a run without checks."""
    if "assertions" not in table:
        return {}
    out: dict[tuple[str, int], dict] = {}
    queries = table["query"] if "query" in table else table["id"]
    for item, query, cells in zip(table["id"].astype(str), queries, table["assertions"], strict=True):
        for a in cell("assertions", cells):
            key = (item, int(a["index"]))
            seen = out.get(key)
            if seen is None or (seen["passed"] and not a["passed"]):
                out[key] = dict(a) | {"query": str(query)}
    return out


def _failures(baseline: pd.DataFrame, candidate: pd.DataFrame, critical_only: bool) -> list[CheckFailure]:
    base, cand = check_results(baseline), check_results(candidate)
    out = []
    for (item, i), a in sorted(cand.items()):
        if a["passed"] or (critical_only and not a["critical"]):
            continue
        b = base.get((item, i))
        was = "not checked" if b is None else ("passes" if b["passed"] else "fails too")
        out.append(
            CheckFailure(
                item, a["query"], i, a["type"], a["value"] or "", bool(a["critical"]), a["detail"], was
            )
        )
    return sorted(out, key=lambda f: (not f.new, f.item_id, f.index))  # newly broken first


def critical_failures(baseline: pd.DataFrame, candidate: pd.DataFrame) -> list[CheckFailure]:
    """Every critical check the candidate fails, with the baseline's result on it; the ones the
    baseline passes (the candidate broke them) first. Any one fails the gate."""
    return _failures(baseline, candidate, critical_only=True)


def newly_failing(baseline: pd.DataFrame, candidate: pd.DataFrame) -> list[CheckFailure]:
    """Every check, critical or not, the candidate fails and the baseline passes."""
    return [f for f in _failures(baseline, candidate, critical_only=False) if f.new]
