"""One MLflow trace per eval item per run, so MLflow's own evaluation UI shows our per-query results.

Built after the fact from the per-query table ``run_pipeline`` returns and the eval items (no hooks
in the stages). Each trace is linked to its run (trace metadata ``mlflow.sourceRun``) and holds:

- a root span (CHAIN): inputs ``{query, item_id, tags}``, outputs the answer (retrieval-only runs:
  the top chunk ids);
- a RETRIEVER span whose outputs are the ranked chunks as MLflow Documents (``page_content``,
  ``metadata`` doc_id, chunk_id, start, end, score, rank), in rank order;
- with a generator: a CHAT_MODEL span (prompt messages, completion, latency, token usage from the
  ``tokens_in/out_generation`` columns) and one EVALUATOR span per judge step (claims/verdicts, answer relevance);
- expectations from the eval item (``expected_retrieved_context``: the gold spans with their text,
  ``expected_response``, ``expected_facts``) and one feedback per per-query metric column plus the
  failure label, with the metric's definition (``evaluation.registry``) as rationale.

Writing goes straight to the store with explicit timestamps: on a SQL store all trace infos with
their metadata, assessments and spans in one transaction (``tracking.trace_store.start_traces``);
elsewhere ``start_trace`` per trace, then the store's ``log_spans``: the path MLflow's own exporter
takes, minus its per-span and per-assessment round trips. The eval-set dataset: ``tracking.genai_dataset``. See ``docs/tracing.md``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import pandas as pd
from mlflow.entities import (
    AssessmentError,
    AssessmentSource,
    AssessmentSourceType,
    Expectation,
    Feedback,
    SpanType,
    TraceInfo,
    TraceLocation,
    TraceState,
)
from mlflow.entities.span import Span
from mlflow.tracing.client import TracingClient
from mlflow.tracing.constant import SpanAttributeKey, TraceMetadataKey, TraceTagKey
from mlflow.tracing.utils import aggregate_usage_from_spans

from rag_experiments.tracking.runs import parse_json  # NaN cells: items outside generation_subset
from rag_experiments.types import Document, EvalItem

TRACE_NAME = "rag_query"
SPANS_PER_BATCH = 2000  # spans per log_spans transaction
CODE_SOURCE = "rag_experiments.evaluation.metrics"
# Per-query columns that are not per-query metrics of their own (the label is logged as a string).
_NOT_ASSESSED_PREFIXES = ("rate_",)
_PREVIEW_CHARS = 1000


# ------------------------------------------------------------------------------ span building


def _b64_id(n: int, nbytes: int) -> str:
    import base64

    return base64.b64encode(n.to_bytes(nbytes, "big")).decode()


def _new_ids() -> tuple[int, str]:
    """(OTel trace id, MLflow trace id ``tr-<32 hex>``), as MLflow's own v3 processor forms them."""
    otel = int.from_bytes(os.urandom(16), "big") or 1
    return otel, f"tr-{otel:032x}"


class _SpanWriter:
    """Builds the immutable spans of one trace (parents before children, explicit times)."""

    def __init__(self, otel_trace_id: int, trace_id: str) -> None:
        self.otel_trace_id, self.trace_id = otel_trace_id, trace_id
        self.spans: list[Span] = []

    def add(
        self,
        name: str,
        span_type: str,
        start_ns: int,
        end_ns: int,
        inputs: Any,
        outputs: Any,
        parent: int | None = None,
        attributes: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> int:
        span_id = int.from_bytes(os.urandom(8), "big") or 1
        attrs = {
            SpanAttributeKey.REQUEST_ID: self.trace_id,
            SpanAttributeKey.SPAN_TYPE: span_type,
            SpanAttributeKey.INPUTS: inputs,
            SpanAttributeKey.OUTPUTS: outputs,
            **(attributes or {}),
        }
        self.spans.append(
            Span.from_dict(
                {
                    "trace_id": _b64_id(self.otel_trace_id, 16),
                    "span_id": _b64_id(span_id, 8),
                    "parent_span_id": _b64_id(parent, 8) if parent else None,
                    "name": name,
                    "start_time_unix_nano": start_ns,
                    "end_time_unix_nano": max(end_ns, start_ns),
                    # MLflow stores every attribute value JSON-encoded
                    "attributes": {k: json.dumps(v, default=str) for k, v in attrs.items()},
                    "status": {
                        "code": "STATUS_CODE_ERROR" if error else "STATUS_CODE_OK",
                        "message": error or "",
                    },
                    "events": [],
                }
            )
        )
        return span_id


def _documents(retrieved: list[dict], doc_text: dict[str, str]) -> list[dict]:
    """The ranked chunks as MLflow Documents; ``page_content`` = ``doc.text[start:end]`` (exact)."""
    return [
        {
            "page_content": doc_text.get(r["doc_id"], "")[r["start"] : r["end"]],
            "metadata": {
                "doc_id": r["doc_id"],
                "chunk_id": r["chunk_id"],
                "doc_uri": r["doc_id"],
                "start": r["start"],
                "end": r["end"],
                "score": r["score"],
                "rank": r["rank"],
            },
            "id": r["chunk_id"],
        }
        for r in retrieved
    ]


def _num(row: dict, key: str) -> float | None:
    v = row.get(key)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _token_usage(row: dict, stage: str) -> dict[str, int] | None:
    """MLflow's span token usage (``mlflow.chat.tokenUsage``: ``input_tokens``, ``output_tokens``,
    ``total_tokens`` = their sum) from the table's ``tokens_in_{stage}`` / ``tokens_out_{stage}``
    columns (``evaluation.cost.usage_columns``); None when either is missing (NaN: the endpoint
    reported no usage), never a made-up 0."""
    tin, tout = _num(row, f"tokens_in_{stage}"), _num(row, f"tokens_out_{stage}")
    if tin is None or tout is None:
        return None
    usage = {"input_tokens": int(tin), "output_tokens": int(tout)}
    usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
    return usage


def build_spans(
    trace_id_pair: tuple[int, str],
    row: dict,
    item: EvalItem,
    doc_text: dict[str, str],
    start_ns: int,
    k: int,
    prompt=None,
    generator_model: str | None = None,
) -> tuple[list[Span], int]:
    """The spans of one query's trace and its end time (ns). Durations are the table's latencies;
    retrieval runs as one batch, so each query's retrieval span lasts the batch time / n queries."""
    otel, trace_id = trace_id_pair
    w = _SpanWriter(otel, trace_id)
    retrieved = json.loads(row["retrieved"])
    generated = "answer" in row and isinstance(row.get("answer"), str)
    t_ret = int((_num(row, "latency_retrieval_s") or 0.0) * 1e9)
    t_gen = int((_num(row, "latency_generation_s") or 0.0) * 1e9) if generated else 0
    t_jud = int((_num(row, "latency_judge_s") or 0.0) * 1e9) if generated else 0
    end_ns = start_ns + t_ret + t_gen + t_jud
    error = row.get("error") if isinstance(row.get("error"), str) else None
    outputs: Any = row["answer"] if generated else [r["chunk_id"] for r in retrieved[:k]]
    root = w.add(
        TRACE_NAME,
        SpanType.CHAIN,
        start_ns,
        end_ns,
        {"query": item.query, "item_id": item.id, "tags": list(item.tags)},
        outputs,
        error=error,
    )
    docs = _documents(retrieved, doc_text)
    w.add("retrieve", SpanType.RETRIEVER, start_ns, start_ns + t_ret, {"query": item.query}, docs, root)
    if not generated:
        return w.spans, end_ns
    t = start_ns + t_ret
    context_docs = docs[:k]  # what the generator was given (retriever.k)
    messages = prompt.render(item.query, [_chunk(d) for d in context_docs]) if prompt is not None else None
    attrs: dict[str, Any] = {"cached": bool(row.get("generation_cached", False))}
    if generator_model:
        attrs[SpanAttributeKey.MODEL] = generator_model
    if usage := _token_usage(row, "generation"):
        attrs[SpanAttributeKey.CHAT_USAGE] = usage
    w.add(
        "generate",
        SpanType.CHAT_MODEL,
        t,
        t + t_gen,
        {"messages": messages}
        if messages
        else {"query": item.query, "context_chunk_ids": [d["id"] for d in context_docs]},
        {"choices": [{"message": {"role": "assistant", "content": row["answer"]}}]},
        root,
        attrs,
        error,
    )
    t += t_gen
    if not error:
        _judge_spans(w, root, row, item, t, t_jud)
    return w.spans, end_ns


def _judge_spans(w: _SpanWriter, root, row: dict, item: EvalItem, t: int, t_jud: int) -> None:
    """The two judge steps of a generated answer, from ``t`` for ``t_jud`` ns."""
    verdicts = parse_json(row.get("verdicts"), [])
    half = t_jud // 2  # the table has one judge latency per query: split evenly between the steps
    w.add(
        "judge.faithfulness",
        SpanType.EVALUATOR,
        t,
        t + half,
        {"answer": row["answer"], "claims": parse_json(row.get("claims"), [])},
        {"verdicts": verdicts, "faithfulness": _num(row, "faithfulness")},
        root,
        # the table has one judge token count per query, for both steps: it goes here, once
        {SpanAttributeKey.CHAT_USAGE: usage} if (usage := _token_usage(row, "judge")) else None,
    )
    w.add(
        "judge.answer_relevance",
        SpanType.EVALUATOR,
        t + half,
        t + t_jud,
        {"query": item.query, "answer": row["answer"]},
        {"answer_relevance": _num(row, "answer_relevance"), "method": row.get("relevance_method", "")},
        root,
    )


def _chunk(doc: dict):
    from rag_experiments.types import Chunk

    m = doc["metadata"]
    return Chunk(m["chunk_id"], m["doc_id"], m["start"], m["end"], doc["page_content"])


# ------------------------------------------------------------------------------ assessments


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


def assessed_columns(per_query: pd.DataFrame) -> list[str]:
    """Per-query metric columns that become feedback, in registry order (``evaluation.aggregate``)."""
    from rag_experiments.evaluation.aggregate import metric_columns

    return [c for c in metric_columns(per_query) if not c.startswith(_NOT_ASSESSED_PREFIXES)]


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
    verdicts = parse_json(row.get("verdicts"), [])
    bad = [v["claim"] for v in verdicts if v.get("label") != "supported"]
    return ("; unsupported or unparseable claims: " + " | ".join(bad)) if bad else ""


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
    cols: Sequence[str],
    judge_source: AssessmentSource,
    k: int,
) -> list[Pending]:
    """One feedback per metric column and one for the failure label.

    A retrieval metric of an unanswerable item is not applicable and gets no feedback; any other
    missing value is logged as a feedback *error* (``NOT_SCORED`` with the reason), never dropped.
    """
    code = AssessmentSource(AssessmentSourceType.CODE, CODE_SOURCE)
    out = []
    for col in cols:
        side, definition = _definition(col)
        if side == "retrieval" and not item.answerable:
            continue
        source = judge_source if col in ("faithfulness", "answer_relevance") else code
        value = _num(row, col)
        rationale = definition + (_unsupported(row) if col == "faithfulness" else "")
        if value is None:
            reason = (
                row.get("error") if isinstance(row.get("error"), str) else "value undefined for this query"
            )
            err = AssessmentError(error_code="NOT_SCORED", error_message=str(reason)[:1000])
            out.append(Pending("feedback", col, None, source, rationale, err))
        else:
            out.append(Pending("feedback", col, value, source, rationale or None))
    label = row.get("failure_label")
    if isinstance(label, str):
        out.append(Pending("feedback", "failure_label", label, code, _label_rationale(row, k)))
    return out


def judge_source(judge) -> AssessmentSource:
    """LLM_JUDGE with the model name for model judges; CODE for the offline heuristic judge."""
    if judge is None:
        return AssessmentSource(AssessmentSourceType.CODE, CODE_SOURCE)
    model = getattr(judge, "model", None)
    if model:
        return AssessmentSource(AssessmentSourceType.LLM_JUDGE, str(model))
    return AssessmentSource(AssessmentSourceType.CODE, type(judge).__name__)


# ------------------------------------------------------------------------------ writing


def _preview(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s[:_PREVIEW_CHARS]


def write_traces(
    tracking_uri: str,
    run_id: str,
    experiment_id: str,
    per_query: pd.DataFrame,
    items: Iterable[EvalItem],
    docs: Iterable[Document],
    k: int,
    evalset_digest: str,
    prompt=None,
    generator_model: str | None = None,
    judge=None,
    batch: bool = True,
) -> list[str]:
    """Write one trace per row of ``per_query`` (matched to its eval item by id); returns trace ids.

    ``batch=False`` creates the traces one public ``start_trace`` call at a time (what non-SQL
    stores always get); the stored result is the same.
    """
    tc = TracingClient(tracking_uri)
    by_id = {it.id: it for it in items}
    doc_text = {d.doc_id: d.text for d in docs}
    cols = assessed_columns(per_query)
    jsrc = judge_source(judge)
    t = time.time_ns()
    spans: list[Span] = []
    infos: list[TraceInfo] = []
    pending: list[list[Pending]] = []
    root_ids: list[str] = []
    trace_ids = []
    for row in per_query.to_dict("records"):
        item = by_id[row["id"]]
        ids = _new_ids()
        trace_spans, end = build_spans(ids, row, item, doc_text, t, k, prompt, generator_model)
        root = trace_spans[0]
        pending.append([*expectations(item, doc_text, evalset_digest), *feedbacks(row, item, cols, jsrc, k)])
        root_ids.append(root.span_id)
        error = isinstance(row.get("error"), str)
        info = TraceInfo(
            trace_id=ids[1],
            trace_location=TraceLocation.from_experiment_id(experiment_id),
            request_time=t // 1_000_000,
            execution_duration=(end - t) // 1_000_000,
            state=TraceState.ERROR if error else TraceState.OK,
            request_preview=_preview(root.inputs),
            response_preview=_preview(root.outputs),
            trace_metadata={
                TraceMetadataKey.SOURCE_RUN: run_id,
                "mlflow.trace_schema.version": "3",
                TraceMetadataKey.INPUTS: _preview(root.inputs),
                TraceMetadataKey.OUTPUTS: _preview(root.outputs),
                # what MLflow's exporter aggregates on trace end: the UI's Tokens column reads it
                **(
                    {TraceMetadataKey.TOKEN_USAGE: json.dumps(u)}
                    if (u := aggregate_usage_from_spans(trace_spans))
                    else {}
                ),
            },
            tags={TraceTagKey.TRACE_NAME: TRACE_NAME, "item_id": item.id, "eval_tags": ",".join(item.tags)},
        )
        infos.append(info)
        spans += trace_spans
        trace_ids.append(ids[1])
        t = end + 1_000_000  # traces in item order, 1 ms apart
    from rag_experiments.tracking.trace_store import start_traces

    if not start_traces(tc, infos, pending, root_ids, run_id, batch, spans if batch else None):
        for i in range(0, len(spans), SPANS_PER_BATCH):
            tc.log_spans(experiment_id, spans[i : i + SPANS_PER_BATCH])
    return trace_ids


# ------------------------------------------------------------------------------ sweep entry point


def log_traces(
    client, run_id: str, experiment_id: str, per_query: pd.DataFrame, evalset, corpus, cfg, stages
) -> None:
    """The sweep's one call: eval-set dataset + one trace per eval item, unless ``tracking.traces=false``."""
    if not cfg.tracking.get("traces", True):
        return
    gen = stages.generator  # run_types.Stages
    t0 = time.perf_counter()
    from rag_experiments.tracking.genai_dataset import link_dataset

    link_dataset(client, run_id, experiment_id, evalset.items, corpus.docs, evalset.digest)
    ids = write_traces(
        client.tracking_uri,
        run_id,
        experiment_id,
        per_query,
        evalset.items,
        corpus.docs,
        int(cfg.retriever.k),
        evalset.digest,
        prompt=stages.prompt,
        generator_model=getattr(gen, "model", None) if gen is not None else None,
        judge=stages.judge,
    )
    # how long tracing took, so its overhead is visible per run (scripts/bench_traces.py)
    client.set_tag(
        run_id, "traces", json.dumps({"n": len(ids), "seconds": round(time.perf_counter() - t0, 3)})
    )
