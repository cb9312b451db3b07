"""The assessments of a query's trace: the eval item's expectations and the feedback on its metrics.

Built from the per-query table and the eval items, independent of how traces are written (the
public MLflow API or the SQL fast path, ``tracking.mlflow_adapter``). Fewer, richer assessments
(docs/tracing.md, "What it costs"): one feedback per *headline* per-query metric (hit@k at every k,
at ``retriever.k`` evidence recall, nDCG and context precision, MRR, every generation metric), the
failure label, one ``more_metrics`` feedback holding every other metric column as a dict, and one
feedback per check of the item's ``assert`` list (``assert/<index>``: passed or not, with the
check and why; ``evaluation.assertions``).
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, NamedTuple

import pandas as pd
from mlflow.entities import AssessmentError, AssessmentSource, AssessmentSourceType, Expectation, Feedback

from rag_experiments.core.query_table import cell  # NaN cells: items outside generation_subset
from rag_experiments.core.types import EvalItem

CODE_SOURCE = "rag_experiments.evaluation.metrics"
MORE_METRICS = "more_metrics"  # the feedback holding the non-headline metric columns
# Per-query columns that are not per-query metrics of their own (the label is logged as a string).
_NOT_ASSESSED_PREFIXES = ("rate_",)
_HIT_AT_K = re.compile(r"hit_at_\d+")


def _num(row: dict, key: str) -> float | None:
    v = row.get(key)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


class Pending(NamedTuple):
    """An assessment before it is written: building 3,000 ``Feedback`` entities per run was a
    fifth of the tracing time, so the SQL path writes rows from these and only the per-trace
    fallback builds entities (:meth:`entity`)."""

    kind: str  # "feedback" | "expectation"
    name: str
    value: Any
    source: AssessmentSource
    rationale: str | None = None
    error: AssessmentError | None = None

    def entity(self, trace_id: str, span_id: str | None, metadata: dict[str, str]):
        if self.kind == "expectation":
            return Expectation(self.name, self.value, source=self.source, trace_id=trace_id)
        return Feedback(
            self.name,
            self.value,
            error=self.error,
            source=self.source,
            trace_id=trace_id,
            span_id=span_id,
            metadata=metadata,
            rationale=self.rationale,
        )


@functools.lru_cache(maxsize=1024)
def _definition(col: str) -> tuple[str, str]:
    """(side, definition) of a per-query column from the metric registry ('' when unregistered)."""
    from rag_experiments.evaluation import registry

    got = registry.parse(col)
    return (got[0].side, got[0].definition) if got else ("", "")


def metric_definitions(per_query: pd.DataFrame) -> dict[str, str]:
    """Every assessed column's definition (logged once per run, not once per feedback)."""
    return {c: _definition(c)[1] for c in _metric_columns(per_query)}


def _metric_columns(per_query: pd.DataFrame) -> list[str]:
    from rag_experiments.evaluation.aggregate import metric_columns

    # failure-label rates only (rate_over_refusal etc. are metrics of their own)
    return [
        c
        for c in metric_columns(per_query)
        if not (c.startswith(_NOT_ASSESSED_PREFIXES) and _definition(c)[0] == "label")
    ]


def assessed_columns(per_query: pd.DataFrame, k: int) -> tuple[list[str], list[str]]:
    """(columns with a feedback each, columns bundled into ``more_metrics``), in registry order.

    Own feedback: ``hit_at_<k>`` at every k (the binary columns one picks in MLflow's UI), at
    ``retriever.k`` evidence recall, nDCG and context precision, ``mrr``, and every generation
    metric (the judge's). Everything else (other cut-offs, token overlaps, budgeted and
    diagnostic metrics) goes into one dict-valued feedback.
    """
    own_at_k = {f"{m}_at_{k}" for m in ("evidence_recall", "ndcg", "context_precision")} | {"mrr"}
    own, more = [], []
    for c in _metric_columns(per_query):
        side = _definition(c)[0]
        (own if _HIT_AT_K.fullmatch(c) or c in own_at_k or side == "generation" else more).append(c)
    return own, more


def expectations(item: EvalItem, doc_text: dict[str, str], evalset_digest: str) -> list[Pending]:
    """The eval item's gold data under MLflow's standard expectation names (so its judges read them)."""
    src = AssessmentSource(AssessmentSourceType.HUMAN, f"evalset:{evalset_digest[:16]}")
    gold = [
        {
            "doc_uri": s.doc_id,
            "start": s.start,
            "end": s.end,
            "content": doc_text.get(s.doc_id, "")[s.start : s.end],
        }
        for s in item.gold_spans
    ]
    out = [Pending("expectation", "expected_retrieved_context", gold, src)]
    if item.gold_answer:
        out.append(Pending("expectation", "expected_response", item.gold_answer, src))
    if item.key_facts:
        out.append(Pending("expectation", "expected_facts", list(item.key_facts), src))
    return out


def _unsupported(row: dict) -> str:
    verdicts = cell("verdicts", row.get("verdicts"))
    bad = [v["claim"] for v in verdicts if v.get("label") != "supported"]
    return ("unsupported or unparseable claims: " + " | ".join(bad)) if bad else ""


def _label_rationale(row: dict, k: int) -> str:
    """The inputs of the decision table that produced the label (``evaluation.labels.failure_label``)."""
    parts = [f"hit_at_{k}={_num(row, f'hit_at_{k}')}"]
    for col in ("correctness", "faithfulness"):
        if col in row:
            parts.append(f"{col}={_num(row, col)}")
    if isinstance(row.get("error"), str):
        parts.append(f"error={row['error'][:200]}")
    return ", ".join(parts) + " (decision table: rag_experiments.evaluation.labels.failure_label)"


def feedbacks(
    row: dict,
    item: EvalItem,
    cols: tuple[list[str], list[str]],
    judge_source: AssessmentSource,
    k: int,
) -> list[Pending]:
    """One feedback per headline metric column, one ``more_metrics`` dict, one failure label.

    ``cols``: :func:`assessed_columns`. A retrieval metric of an unanswerable item is not
    applicable and gets no feedback; any other missing value is a feedback *error* (``NOT_SCORED``
    with the reason), never dropped. Rationale only where it says something about this query
    (faithfulness: the unsupported claims; the label: its decision inputs); the definitions are
    logged once per run (``metric_definitions.json``, :func:`metric_definitions`).
    """
    code = AssessmentSource(AssessmentSourceType.CODE, CODE_SOURCE)
    own, more = cols
    out = []
    for col in own:
        side = _definition(col)[0]
        if side == "retrieval" and not item.answerable:
            continue
        source = judge_source if col in ("faithfulness", "answer_relevance") else code
        value = _num(row, col)
        rationale = _unsupported(row) if col == "faithfulness" else ""
        if value is None:
            reason = (
                row.get("error") if isinstance(row.get("error"), str) else "value undefined for this query"
            )
            err = AssessmentError(error_code="NOT_SCORED", error_message=str(reason)[:1000])
            out.append(Pending("feedback", col, None, source, rationale or None, err))
        else:
            out.append(Pending("feedback", col, value, source, rationale or None))
    values = {c: v for c in more if (v := _num(row, c)) is not None}
    if values:  # undefined values (NaN) are left out of the dict
        out.append(Pending("feedback", MORE_METRICS, values, code))
    label = row.get("failure_label")
    if isinstance(label, str):
        out.append(Pending("feedback", "failure_label", label, code, _label_rationale(row, k)))
    return out + check_feedbacks(row)


def check_feedbacks(row: dict) -> list[Pending]:
    """One feedback per check of the item's ``assert`` list on this answer: ``assert/<index>``,
    value True (passed) or False, rationale the check, ``critical`` and why."""
    code = AssessmentSource(AssessmentSourceType.CODE, "rag_experiments.evaluation.assertions")
    out = []
    for a in cell("assertions", row.get("assertions")):
        check = f"{a['type']} {a['value']!r}" if a.get("value") else a["type"]
        why = f"{check}{' (critical)' if a.get('critical') else ''}: {a.get('detail', '')}"
        out.append(Pending("feedback", f"assert/{a['index']}", bool(a["passed"]), code, why))
    return out


def judge_source(judge) -> AssessmentSource:
    """LLM_JUDGE with the model name for model judges; CODE for the offline heuristic judge."""
    if judge is None:
        return AssessmentSource(AssessmentSourceType.CODE, CODE_SOURCE)
    model = getattr(judge, "model", None)
    if model:
        return AssessmentSource(AssessmentSourceType.LLM_JUDGE, str(model))
    return AssessmentSource(AssessmentSourceType.CODE, type(judge).__name__)
