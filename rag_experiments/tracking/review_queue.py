"""Review queues in MLflow's Review tab, through MLflow's public API only (mlflow >= 3.14).

MLflow's OSS tracking store (sqlite, PostgreSQL, ``mlflow server``) has, since 3.14, experiment-
scoped **label schemas** (``mlflow.genai.label_schemas.create_label_schema``) and **review queues**
(``mlflow.genai.review_queues``: a named set of traces plus the schemas reviewers answer, shown in
the experiment's Review tab at ``#/experiments/<id>/review-queue``). A reviewer's answer is a
``Feedback`` assessment named after the schema, source type ``HUMAN``, on the item's trace.
``mlflow.genai.labeling`` (``create_labeling_session`` and friends) is Databricks-only in 3.17.2:
its store registry knows only the ``databricks`` scheme, so a sqlite URI raises
``UnsupportedLabelingStoreURIException`` (``tests/test_review_queue.py`` checks it) — review
queues are the OSS equivalent ("the analog of a Databricks LabelingSession", MLflow's docstring).

One queue item is one trace; this module writes one small trace per item (:func:`write_item`),
tagged with the item's key, so a queue of claims holds one trace per claim. ``mlflow.genai``'s
queue functions use the global tracking URI, so every call here sets it first.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.entities import Feedback, SpanType
from mlflow.exceptions import MlflowException

from rag_experiments.tracking.runs import RunInputError

QUEUE_TAG = "review.queue"  # trace tag: the queue the trace was written for (crash-safe re-runs)
KEY_TAG = "review.key"  # trace tag: the item's key within the queue
HUMAN = "HUMAN"
RECORD_SPAN = "review_item"  # child span: the item's exact fields, as written


@dataclass(frozen=True)
class QueueItem:
    """One queue item: its trace, tags and the HUMAN feedback on it under the queue's schema."""

    trace_id: str
    status: str  # pending / complete / declined (the queue's shared-pool status)
    tags: dict[str, str]
    record: dict[str, Any]  # the item's exact fields (the RECORD_SPAN's inputs)
    feedback: list[tuple[str, Any, int]]  # (reviewer, value, last update ms), valid HUMAN only


def _use(uri: str) -> None:
    if mlflow.get_tracking_uri() != uri:
        mlflow.set_tracking_uri(uri)


def _not_found(e: MlflowException) -> bool:
    return e.error_code == "RESOURCE_DOES_NOT_EXIST"


def ensure_schema(uri: str, experiment_id: str, name: str, options: Sequence[str], instruction: str):
    """The experiment's categorical feedback schema ``name`` (created once, comments enabled).

    An existing schema is reused as it is (a user may have edited its instruction in the UI) when
    its options are ``options``; other options → :class:`RunInputError` naming it.
    """
    from mlflow.genai import label_schemas as ls

    _use(uri)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        existing = [s for s in _all_schemas(ls, experiment_id) if s.name == name]
        if existing:
            s = existing[0]
            got = getattr(s.input, "options", None)
            if s.type.value != "feedback" or list(got or []) != list(options):
                raise RunInputError(
                    f"label schema {name!r} of experiment {experiment_id} exists with another input "
                    f"({type(s.input).__name__} {got}); expected categorical {list(options)}"
                )
            return s
        try:
            return ls.create_label_schema(
                name,
                type="feedback",
                input=ls.InputCategorical(options=list(options)),
                instruction=instruction,
                enable_comment=True,
                experiment_id=experiment_id,
            )
        except MlflowException:  # another process created it first: check and take theirs
            if not any(s.name == name for s in _all_schemas(ls, experiment_id)):
                raise
    return ensure_schema(uri, experiment_id, name, options, instruction)


def _all_schemas(ls, experiment_id: str) -> list:
    out, token = [], None
    while True:
        page = ls.list_label_schemas(experiment_id, page_token=token)
        out += list(page)
        token = page.token
        if not token:
            return out


def get_or_create_queue(uri: str, experiment_id: str, name: str, schema_id: str):
    """(queue, created): the experiment's custom queue ``name``, created with ``schema_id``."""
    from mlflow.genai import review_queues as rq

    _use(uri)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        try:
            return rq.get_review_queue(name=name, experiment_id=experiment_id), False
        except MlflowException as e:
            if not _not_found(e):
                raise
        try:
            q = rq.create_review_queue(
                name, queue_type="custom", schema_ids=[schema_id], experiment_id=experiment_id
            )
        except MlflowException:  # another process created it first: take theirs
            return rq.get_review_queue(name=name, experiment_id=experiment_id), False
        return q, True


def find_queue(uri: str, queue: str, experiment_ids: Sequence[str]):
    """The queue with id or name ``queue`` in one of ``experiment_ids``; none or several →
    :class:`RunInputError` naming it."""
    from mlflow.genai import review_queues as rq

    _use(uri)
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if queue.startswith("rq-"):
            try:
                return rq.get_review_queue(queue)
            except MlflowException as e:
                if not _not_found(e):
                    raise
        for eid in experiment_ids:
            try:
                found.append(rq.get_review_queue(name=queue, experiment_id=eid))
            except MlflowException as e:
                if not _not_found(e):
                    raise
    if not found:
        raise RunInputError(
            f"review queue {queue!r} does not exist (searched {len(experiment_ids)} experiment(s)"
            f"{': ' + ', '.join(experiment_ids[:10]) if experiment_ids else ''})"
        )
    if len(found) > 1:
        raise RunInputError(
            f"review queue {queue!r} exists in experiments {', '.join(q.experiment_id for q in found)}: "
            "name one with --experiment, or pass the queue id"
        )
    return found[0]


def traces_written_for(
    uri: str, experiment_id: str, queue_name: str
) -> dict[str, tuple[str, dict[str, str]]]:
    """key → (trace id, tags) of the traces already written for ``queue_name`` (attached or not:
    a run killed between writing and attaching leaves some)."""
    client = MlflowClient(tracking_uri=uri)
    out, token = {}, None
    filt = f"tags.`{QUEUE_TAG}` = '{_quote(queue_name)}'"
    while True:
        page = client.search_traces(
            locations=[experiment_id],
            filter_string=filt,
            include_spans=False,
            page_token=token,
            flush=True,  # this process's own traces still in MLflow's async export queue count too
            max_results=500,
        )
        for t in page:
            out.setdefault(t.info.tags.get(KEY_TAG, ""), (t.info.trace_id, dict(t.info.tags)))
        token = page.token
        if not token:
            return out


def _quote(s: str) -> str:
    return s.replace("\\", "\\\\").replace("'", "\\'")


def flush() -> None:
    """Write out the traces MLflow's async exporter still holds (before attaching them)."""
    mlflow.flush_trace_async_logging()


def write_item(
    uri: str,
    experiment_id: str,
    queue_name: str,
    key: str,
    name: str,
    shown: tuple[Any, Any],
    record: Mapping,
    tags: Mapping,
) -> str:
    """One finished trace for a queue item; returns its id. The root span (CHAIN) holds what the
    Review tab shows, ``shown`` = (inputs, outputs); a child span :data:`RECORD_SPAN` holds
    ``record``, the item's exact fields (what :func:`read_items` reads back)."""
    client = MlflowClient(tracking_uri=uri)
    _use(uri)
    inputs, outputs = shown
    span = client.start_trace(
        name,
        SpanType.CHAIN,
        inputs=inputs,
        tags={**{k: str(v) for k, v in tags.items()}, QUEUE_TAG: queue_name, KEY_TAG: key},
        experiment_id=experiment_id,
    )
    child = client.start_span(RECORD_SPAN, span.trace_id, span.span_id, SpanType.UNKNOWN, inputs=dict(record))
    client.end_span(span.trace_id, child.span_id)
    client.end_trace(span.trace_id, outputs=outputs)
    return span.trace_id


def attach(uri: str, queue_id: str, trace_ids: Sequence[str]) -> None:
    """Attach traces to the queue (idempotent per trace: a re-attached item keeps its status)."""
    from mlflow.genai import review_queues as rq

    _use(uri)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for i in range(0, len(trace_ids), 100):
            rq.add_items_to_review_queue(queue_id, item_ids=list(trace_ids[i : i + 100]))


def queue_items(uri: str, queue_id: str) -> list:
    """The queue's ``ReviewQueueItem``s (all pages)."""
    from mlflow.genai import review_queues as rq

    _use(uri)
    items, token = [], None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        while True:
            page = rq.list_review_queue_items(queue_id, max_results=500, page_token=token)
            items += list(page)
            token = page.token
            if not token:
                return items


def _queue_traces(client: MlflowClient, experiment_id: str, queue_name: str) -> dict[str, Any]:
    """trace id → trace (spans and assessments) of the traces written for the queue, a page of
    500 per call instead of one call per item."""
    out, token = {}, None
    while True:
        page = client.search_traces(
            locations=[experiment_id],
            filter_string=f"tags.`{QUEUE_TAG}` = '{_quote(queue_name)}'",
            page_token=token,
            max_results=500,
        )
        out |= {t.info.trace_id: t for t in page}
        token = page.token
        if not token:
            return out


def read_items(uri: str, queue, schema_name: str) -> list[QueueItem]:
    """Every item of ``queue`` with its tags and valid HUMAN feedback named ``schema_name``
    (traces someone added to the queue by hand are fetched one by one)."""
    client = MlflowClient(tracking_uri=uri)
    ours = _queue_traces(client, queue.experiment_id, queue.name)
    out = []
    for it in queue_items(uri, queue.queue_id):
        trace = ours.get(it.item_id) or client.get_trace(it.item_id)
        info = trace.info
        rec = [sp.inputs for sp in trace.data.spans if sp.name == RECORD_SPAN and isinstance(sp.inputs, dict)]
        fb = [
            (a.source.source_id or "", a.value, a.last_update_time_ms or a.create_time_ms or 0)
            for a in info.assessments or []
            if a.name == schema_name
            and a.source.source_type == HUMAN
            and a.valid is not False
            and isinstance(a, Feedback)
        ]
        out.append(QueueItem(it.item_id, str(it.status.value), dict(info.tags), rec[0] if rec else {}, fb))
    return out
