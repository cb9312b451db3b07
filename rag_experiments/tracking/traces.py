"""One MLflow trace per traced eval item per run, so MLflow's own evaluation UI shows our per-query results.

Built after the fact from the per-query table and the eval items (no hooks in the stages); each
trace is linked to its run (trace metadata ``mlflow.sourceRun``) and holds:

- a root span (CHAIN): inputs ``{query, item_id, tags}``, outputs the answer (or the top chunk ids);
- one span per step that ran for the item, in run order, each of its slot's span type
  (``core.slots.Slot.span``): the query transform (LLM), a RETRIEVER span whose outputs are the
  ranked chunks as MLflow Documents (``page_content``, ``metadata`` doc_id, chunk_id, start, end,
  score, rank), in rank order, the reranker (RERANKER), with a generator a CHAT_MODEL span (prompt
  messages, completion, latency, token usage from the ``tokens_in/out_generation`` columns) and one
  EVALUATOR span per judge step (claims/verdicts, answer relevance). A slot declared later gets its
  span from its declaration alone (:func:`_step_span`);
- the assessments of ``tracking.assessments`` (expectations from the eval item, feedback on the
  headline metrics, the rest in one dict, the failure label).

Which items get a trace: every item up to ``tracking.trace_sample`` items, beyond that a seeded
sample with every failure that fits (:func:`select_traced`, docs/tracing.md). How they are written:
MLflow's public tracing API (:func:`write_public`), or on an MLflow version it was verified against
the fast path of ``tracking.mlflow_adapter`` (all traces of a run in one transaction). The eval-set
dataset: ``tracking.genai_dataset``. See ``docs/tracing.md``.

Why this module is long: it is one format, the spans MLflow's trace UI reads back (their names,
types, attributes and documents), from the built-in steps' detailed spans to the span any slot gets
from its declaration; split, two modules would have to agree on that format. (To split next: the
built-in steps' span builders into their own module.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import mlflow
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import SpanStatus, SpanStatusCode, SpanType
from mlflow.tracing.constant import SpanAttributeKey, TraceMetadataKey

from rag_experiments.core.query_table import cell  # NaN cells: items outside generation_subset
from rag_experiments.core.slots import Slot, steps
from rag_experiments.core.types import Document, EvalItem
from rag_experiments.tracking.assessments import (
    Pending,
    assessed_columns,
    expectations,
    feedbacks,
    judge_source,
    metric_definitions,
)
from rag_experiments.tracking.assessments import _num as _num
from rag_experiments.tracking.store_values import storable_record
from rag_experiments.tracking.trace_sampling import select_traced
from rag_experiments.tracking.trace_settings import DEFAULT_SAMPLE, TraceSettings  # noqa: F401

log = logging.getLogger(__name__)
TRACE_NAME = "rag_query"
TRACES_SAMPLED = "traces_sampled"  # run tag: the sampling rule's inputs and outcome
N_AS_TEXT = "n_values_stored_as_text"  # run metric: trace values stored as plain text (store_values)
_warned: set[str] = set()


@dataclass(frozen=True)
class TraceJob:
    """Everything one run's traces are built from: the settings, the eval items and documents, and
    what the spans name (the prompt, the generator model, the judge), the config's app version
    (``model_id``, linked to every trace) and the registry's (name, version) of the run's prompt
    (linked to the trace of every item it generated)."""

    settings: TraceSettings
    items: Sequence[EvalItem]
    docs: Sequence[Document]
    evalset_digest: str
    prompt: Any = None
    generator_model: str | None = None
    judge: Any = None
    model_id: str | None = None
    prompt_version: tuple[str, int] | None = None


# ------------------------------------------------------------------------------ span building


class SpanSpec(NamedTuple):
    """One span before it is written: ``parent`` is the index of its parent span (None: root)."""

    name: str
    span_type: str
    start_ns: int
    end_ns: int
    inputs: Any
    outputs: Any
    parent: int | None = None
    attributes: dict[str, Any] | None = None
    error: str | None = None


class _Specs:
    def __init__(self) -> None:
        self.spans: list[SpanSpec] = []

    def add(
        self, name, span_type, start_ns, end_ns, inputs, outputs, parent=None, attributes=None, error=None
    ):
        self.spans.append(
            SpanSpec(
                name, span_type, start_ns, max(end_ns, start_ns), inputs, outputs, parent, attributes, error
            )
        )
        return len(self.spans) - 1


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


class _Cx(NamedTuple):
    """What every span builder of one row reads: the row, its item, the ranked chunks as Documents,
    the queries searched, the context cut-off and what the generate span names."""

    row: dict
    item: EvalItem
    docs: list[dict]
    searched: list[str]
    k: int
    prompt: Any
    generator_model: str | None
    generated: bool
    error: str | None


def build_spans(
    row: dict,
    item: EvalItem,
    doc_text: dict[str, str],
    start_ns: int,
    k: int,
    prompt=None,
    generator_model: str | None = None,
) -> tuple[list[SpanSpec], int]:
    """The spans of one query's trace (root first) and its end time (ns): one span per step that ran
    for this row, in run order (``core.slots``: a slot with a ``span`` type), back to back.

    Durations are the table's latencies (``latency_<column>_s``); retrieval runs as one batch, so
    each query's retrieval span lasts the batch time / n. The built-in slots' spans carry their rich
    content (:data:`_BUILDERS`: documents, chat messages, the judge's two steps); any other slot gets
    :func:`_step_span` from its declaration (name, span type, declared output columns, seconds)."""
    w = _Specs()
    retrieved = cell("retrieved", row["retrieved"])
    generated = "answer" in row and isinstance(row.get("answer"), str)
    error = row.get("error") if isinstance(row.get("error"), str) else None
    outputs: Any = row["answer"] if generated else [r["chunk_id"] for r in retrieved[:k]]
    root = w.add(
        TRACE_NAME,
        SpanType.CHAIN,
        start_ns,
        start_ns,  # its end is set once its children are laid out
        {"query": item.query, "item_id": item.id, "tags": list(item.tags)},
        outputs,
        attributes={"rag.replicates": cell("replicates", row["replicates"])} if "replicates" in row else None,
        error=error,
    )
    cx = _Cx(row, item, _documents(retrieved, doc_text), _search_queries(row.get("search_queries"), item.query),
             k, prompt, generator_model, generated, error)  # fmt: skip
    t = start_ns
    for s in steps():
        if s.span:
            t += _BUILDERS.get(s.name, _step_span)(w, root, s, cx, t)
    w.spans[root] = w.spans[root]._replace(end_ns=t)
    return w.spans, t


def _ns(row: dict, column: str) -> int:
    return int((_num(row, f"latency_{column}_s") or 0.0) * 1e9)


def _text(row: dict, key: str) -> str | None:
    return row.get(key) if isinstance(row.get(key), str) else None


def _step_span(w: _Specs, root: int, s: Slot, cx: _Cx, t: int) -> int:
    """A slot's span from its declaration alone: named by its step, of its span type, the question
    in, its declared output columns out, ``<column>_error`` as its error, its tokens when priced,
    lasting ``latency_<column>_s``. Only for a row the step ran on: its latency column is there (or,
    without a column, one of its outputs is)."""
    row = cx.row
    ran = f"latency_{s.column}_s" in row if s.column else any(c in row for c in s.outputs)
    if not ran:
        return 0
    d = _ns(row, s.column) if s.column else 0
    usage = _token_usage(row, s.column) if s.priced else None
    out = {c: _plain(row.get(c)) for c in s.outputs if c in row}
    w.add(s.step, s.span, t, t + d, {"query": cx.item.query}, out, root,
          {SpanAttributeKey.CHAT_USAGE: usage} if usage else None, _text(row, f"{s.column}_error"))  # fmt: skip
    return d


def _plain(v: Any) -> Any:
    """A cell as JSON-ready data (numpy arrays and scalars as lists and numbers, NaN as None)."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    return None if isinstance(v, float) and v != v else v


def _query_span(w: _Specs, root: int, s: Slot, cx: _Cx, t: int) -> int:
    """The query transform (query != none): the question in, the queries it searched out."""
    if f"latency_{s.column}_s" not in cx.row:
        return 0
    d, usage = _ns(cx.row, s.column), _token_usage(cx.row, s.column)
    w.add("query", s.span, t, t + d, {"question": cx.item.query}, {"search_queries": cx.searched}, root,
          {SpanAttributeKey.CHAT_USAGE: usage} if usage else None, _text(cx.row, "query_error"))  # fmt: skip
    return d


def _retrieve_span(w: _Specs, root: int, s: Slot, cx: _Cx, t: int) -> int:
    """Always: the ranked chunks as MLflow Documents (with the searched queries after a transform)."""
    d = _ns(cx.row, s.column)
    transformed = "latency_query_s" in cx.row
    w.add("retrieve", s.span, t, t + d, {"query": cx.item.query,
          **({"search_queries": cx.searched} if transformed else {})}, cx.docs, root)  # fmt: skip
    return d


def _rerank_span(w: _Specs, root: int, s: Slot, cx: _Cx, t: int) -> int:
    """A reranker set (rerank != none). The table keeps only the final (reranked) list: both the
    retrieve and the rerank span show it (docs/stages.md)."""
    if f"latency_{s.column}_s" not in cx.row:
        return 0
    d = _ns(cx.row, s.column)
    w.add("rerank", s.span, t, t + d, {"query": cx.item.query}, cx.docs, root, error=_text(cx.row, "rerank_error"))
    return d


def _generate_span(w: _Specs, root: int, s: Slot, cx: _Cx, t: int) -> int:
    """The chat call of a generated answer: the rendered messages, the completion, model and tokens."""
    if not cx.generated:
        return 0
    row, d = cx.row, _ns(cx.row, s.column)
    context_docs = cx.docs[: cx.k]  # what the generator was given (retriever.k)
    prompt = cx.prompt
    history = prompt.recent(cx.item.history, int(_num(cx.row, "history_turns_cut") or 0)) if prompt is not None else []
    messages = prompt.render(cx.item.query, [_chunk(x) for x in context_docs], history) if prompt is not None else None
    attrs: dict[str, Any] = {"cached": bool(row.get("generation_cached", False))}
    if cx.generator_model:
        attrs[SpanAttributeKey.MODEL] = cx.generator_model
    if usage := _token_usage(row, s.column):
        attrs[SpanAttributeKey.CHAT_USAGE] = usage
    if isinstance(row.get("cited_chunk_ids"), list):  # prompt=cite: the passages the answer cites
        attrs["rag.cited_chunk_ids"] = row["cited_chunk_ids"]
    w.add(
        "generate",
        s.span,
        t,
        t + d,
        {"messages": messages}
        if messages
        else {"query": cx.item.query, "context_chunk_ids": [x["id"] for x in context_docs]},
        {"choices": [{"message": {"role": "assistant", "content": row["answer"]}}]},
        root,
        attrs,
        cx.error,
    )
    return d


def _judge_step_spans(w: _Specs, root: int, s: Slot, cx: _Cx, t: int) -> int:
    """The judge's two steps of a generated answer (none when it errored or was not judged)."""
    if not cx.generated:
        return 0
    d = _ns(cx.row, s.column)
    if not cx.error and cx.row.get("relevance_method", True):  # "": not judged (judge=none)
        _judge_spans(w, root, cx.row, cx.item, t, d)
    return d


#: The built-in slots' spans with their rich content; a slot not here gets :func:`_step_span`.
_BUILDERS: dict[str, Callable[[_Specs, int, Slot, _Cx, int], int]] = {
    "query_transform": _query_span,
    "retriever": _retrieve_span,
    "reranker": _rerank_span,
    "generator": _generate_span,
    "judge": _judge_step_spans,
}


def _search_queries(value: Any, question: str) -> list[str]:
    """The per-query ``search_queries`` cell as a list (``core.query_table.cell``: a list, an array
    read back, or JSON text); the question alone when the cell is missing."""
    return [str(x) for x in cell("search_queries", value, [question])]


def _judge_spans(w: _Specs, root, row: dict, item: EvalItem, t: int, t_jud: int) -> None:
    """The two judge steps of a generated answer, from ``t`` for ``t_jud`` ns."""
    verdicts = cell("verdicts", row.get("verdicts"))
    half = t_jud // 2  # the table has one judge latency per query: split evenly between the steps
    w.add(
        "judge.faithfulness",
        SpanType.EVALUATOR,
        t,
        t + half,
        {"answer": row["answer"], "claims": cell("claims", row.get("claims"))},
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
    from rag_experiments.core.types import Chunk

    m = doc["metadata"]
    return Chunk(m["chunk_id"], m["doc_id"], m["start"], m["end"], doc["page_content"])


# ------------------------------------------------------------------------------ writing


class TraceRecord(NamedTuple):
    """One query's trace before it is written: spans (root first), tags, assessments; ``generated``:
    the item was answered (so it used the run's prompt: only such traces are linked to it)."""

    spans: list[SpanSpec]
    tags: dict[str, str]
    assessments: list[Pending]
    generated: bool = False
    n_as_text: int = 0  # values stored as plain text (``tracking.store_values``)
    # trace metadata beyond the source run: a conversation's turn carries its session
    # (``mlflow.trace.session`` = the conversation id), what MLflow's Sessions view groups by
    metadata: dict[str, str] | None = None


def build_records(
    per_query: pd.DataFrame,
    items: Iterable[EvalItem],
    docs: Iterable[Document],
    k: int,
    evalset_digest: str,
    prompt=None,
    generator_model: str | None = None,
    judge=None,
) -> list[TraceRecord]:
    """One :class:`TraceRecord` per row of ``per_query`` (matched to its eval item by id), 1 ms apart."""
    by_id = {it.id: it for it in items}
    doc_text = {d.doc_id: d.text for d in docs}
    cols = assessed_columns(per_query, k)
    jsrc = judge_source(judge)
    t = time.time_ns()
    out = []
    for row in per_query.to_dict("records"):
        item = by_id[row["id"]]
        specs, end = build_spans(row, item, doc_text, t, k, prompt, generator_model)
        pending = [*expectations(item, doc_text, evalset_digest), *feedbacks(row, item, cols, jsrc, k)]
        tags = {"item_id": item.id, "eval_tags": ",".join(item.tags)}
        if row.get("app_trace_id"):  # the app's own trace of this question (docs/app.md)
            tags["app_trace_id"] = str(row["app_trace_id"])
        # a conversation's turns: one session in MLflow's Sessions view (docs/conversations.md)
        meta = {TraceMetadataKey.TRACE_SESSION: str(item.conversation_id)} if item.conversation_id else None
        answered = isinstance(row.get("answer"), str)
        out.append(storable_record(TraceRecord(specs, tags, pending, answered, metadata=meta)))
        t = end + 1_000_000  # traces in item order, 1 ms apart
    return out


def write_public(
    tracking_uri: str,
    experiment_id: str,
    run_id: str,
    records: Sequence[TraceRecord],
    model_id: str | None = None,
    prompts: Sequence = (),
) -> list[str]:
    """Write the traces with MLflow's public API only (any MLflow 3.x): ``MlflowClient.start_trace``
    / ``start_span`` / ``end_span`` / ``end_trace`` with the table's times, then one
    ``mlflow.log_feedback`` / ``log_expectation`` per assessment. MLflow forms the ids, the schema
    version, previews and token totals itself. One store round trip per trace and per assessment.
    ``model_id``: the active model while the traces start (``mlflow.set_active_model``), which
    MLflow records as the traces' ``mlflow.modelId``. ``prompts``: ``PromptVersion``s linked to
    each generated item's trace (``MlflowClient.link_prompt_versions_to_trace``, one call each)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    if mlflow.get_tracking_uri() != tracking_uri:  # the tracing exporter and log_feedback use it
        mlflow.set_tracking_uri(tracking_uri)
    with mlflow.set_active_model(model_id=model_id) if model_id else contextlib.nullcontext():
        roots = [_start_public(client, experiment_id, run_id, rec) for rec in records]
    mlflow.flush_trace_async_logging()
    meta = {"mlflow.assessment.sourceRunId": run_id}
    for rec, (trace_id, root_id) in zip(records, roots, strict=True):
        for p in rec.assessments:
            if p.kind == "expectation":
                mlflow.log_expectation(trace_id=trace_id, name=p.name, value=p.value, source=p.source)
            else:
                mlflow.log_feedback(
                    trace_id=trace_id, name=p.name, value=p.value, source=p.source, error=p.error,
                    rationale=p.rationale, metadata=meta, span_id=root_id,
                )  # fmt: skip
    for rec, (trace_id, _) in zip(records, roots, strict=True):
        if prompts and rec.generated:
            client.link_prompt_versions_to_trace(list(prompts), trace_id)
    return [t for t, _ in roots]


def _start_public(client: MlflowClient, experiment_id: str, run_id: str, rec: TraceRecord) -> tuple[str, str]:
    """Start, fill and end one trace through the public client; (trace id, root span id)."""
    root = rec.spans[0]
    span = client.start_trace(
        root.name, root.span_type, inputs=root.inputs, attributes=root.attributes, tags=rec.tags,
        experiment_id=experiment_id, start_time_ns=root.start_ns, run_id=run_id,
    )  # fmt: skip
    if rec.metadata:
        from rag_experiments.tracking.mlflow_adapter import pending_trace_metadata

        pending_trace_metadata(span.trace_id, rec.metadata)
    ids = [span.span_id]
    for sp in rec.spans[1:]:
        child = client.start_span(
            sp.name, span.trace_id, ids[sp.parent], sp.span_type, inputs=sp.inputs,
            attributes=sp.attributes, start_time_ns=sp.start_ns,
        )  # fmt: skip
        ids.append(child.span_id)
        client.end_span(
            span.trace_id,
            child.span_id,
            outputs=sp.outputs,
            status=_status(sp.error),
            end_time_ns=sp.end_ns,
        )
    client.end_trace(span.trace_id, outputs=root.outputs, status=_status(root.error), end_time_ns=root.end_ns)
    return span.trace_id, span.span_id


def _status(error: str | None) -> SpanStatus:
    return SpanStatus(SpanStatusCode.ERROR, error) if error else SpanStatus(SpanStatusCode.OK)


def write_traces(
    tracking_uri: str, run_id: str, experiment_id: str, per_query: pd.DataFrame, job: TraceJob
) -> list[str]:
    """Write one trace per row of ``per_query``; returns the trace ids.

    ``job.settings.path``: ``"public"`` (:func:`write_public`), ``"fast"`` (the adapter's
    one-transaction SQL path, or its per-trace client path off SQL), ``"fast-per-trace"``, or
    ``"auto"``: the fast path when ``mlflow_adapter.fast_path_problem()`` is empty, else the public
    one with one warning. ``job.model_id``: the config's app version (``tracking.app_versions``), on
    every trace. ``job.prompt_version``: linked to the trace of every item it generated (items
    outside ``generation_subset`` never used it).
    """
    return write_records(tracking_uri, run_id, experiment_id, _records(per_query, job), job)


def _records(per_query: pd.DataFrame, job: TraceJob) -> list[TraceRecord]:
    return build_records(
        per_query, job.items, job.docs, job.settings.k, job.evalset_digest, job.prompt, job.generator_model,
        job.judge,
    )  # fmt: skip


def write_records(
    tracking_uri: str, run_id: str, experiment_id: str, records: Sequence[TraceRecord], job: TraceJob
) -> list[str]:
    """Write built records by the path ``job.settings.path`` names (:func:`write_traces`)."""
    prompts = _prompt_versions(tracking_uri, job.prompt_version)
    path = job.settings.path
    if path == "auto":
        from rag_experiments.tracking.mlflow_adapter import fast_path_problem

        problem = fast_path_problem()
        path = "public" if problem else "fast"
        if problem and problem not in _warned and not problem.endswith("=public"):
            _warned.add(problem)
            log.warning("traces: %s; writing through MLflow's public API (slower, same content)", problem)
    if path == "public":
        return write_public(tracking_uri, experiment_id, run_id, records, job.model_id, prompts)
    from rag_experiments.tracking.mlflow_adapter import write_fast

    return write_fast(
        tracking_uri, experiment_id, run_id, records, path == "fast", job.model_id, prompts
    )


def _prompt_versions(tracking_uri: str, ref: tuple[str, int] | None) -> list:
    """The ``PromptVersion`` to link answered items' traces to (one read per run), [] without one."""
    if not ref:
        return []
    if len(f"{ref[0]}/{ref[1]}") > 36 and ref[0] not in _warned:  # MLflow's column; SQLite ignores it
        _warned.add(ref[0])
        log.warning(
            "traces: prompts:/%s/%s is longer than MLflow's 36-character link column: off SQLite its "
            "traces carry the mlflow.linkedPrompts tag only, and its Traces view cannot list them",
            *ref,
        )
    return [MlflowClient(tracking_uri=tracking_uri).get_prompt_version(ref[0], str(ref[1]))]


# ------------------------------------------------------------------------------ sweep entry point


def log_traces(client, run_id: str, experiment_id: str, per_query: pd.DataFrame, job: TraceJob) -> float:
    """The sweep's one call: eval-set dataset + the traces, unless ``job.settings.enabled`` is off
    (``tracking.traces=false``). Returns the seconds spent (the per-stage table's ``traces`` row)."""
    from rag_experiments.tracking.writer import TRACES_EXPECTED

    t0 = time.perf_counter()
    s = job.settings
    if not s.enabled:
        client.set_tag(run_id, TRACES_EXPECTED, "0")
        return time.perf_counter() - t0
    traced, record = select_traced(per_query, s.sample, s.seed)
    # before the first trace: resume compares it with the ``traces`` tag set after the last one
    client.set_tag(run_id, TRACES_EXPECTED, str(len(traced)))
    client.set_tag(run_id, TRACES_SAMPLED, json.dumps(record))
    from rag_experiments.tracking.genai_dataset import link_dataset

    t_ds = time.perf_counter()
    link_dataset(client, run_id, experiment_id, job.items, job.docs, job.evalset_digest)
    dataset_s = time.perf_counter() - t_ds  # seconds on the first run of an eval set, ~0 after
    client.log_dict(run_id, metric_definitions(per_query), "metric_definitions.json")
    records = _records(traced, job)
    ids = write_records(client.tracking_uri, run_id, experiment_id, records, job)
    n_as_text = sum(r.n_as_text for r in records)
    client.log_metric(run_id, N_AS_TEXT, n_as_text)
    if n_as_text:
        log.warning("traces: %d values the store cannot hold as they are, stored as plain text", n_as_text)
    seconds = time.perf_counter() - t0
    # how long tracing took, so its overhead is visible per run (scripts/bench_traces.py)
    tag = {"n": len(ids), "seconds": round(seconds, 3), "dataset_seconds": round(dataset_s, 3)}
    client.set_tag(run_id, "traces", json.dumps(tag))
    return seconds
