"""The home of MLflow internals, first concern: writing a run's traces straight to the store (the
fast path), and the rule for when any fast path may be used (:func:`fast_path_problem`).

``tracking.traces`` writes through MLflow's public API (``MlflowClient.start_trace`` /
``start_span`` / ``end_span`` / ``end_trace``, ``mlflow.log_feedback`` / ``log_expectation``): one
store transaction per trace and one per assessment. This module writes what those calls write,
for all traces of a run at once, with MLflow's internals: hand-built trace and span ids, the trace
schema version, ``SqlAlchemyStore`` ORM tables and private store methods (``_start_trace_once``
and ``_log_spans_once``'s happy paths as executemany inserts in one transaction) on a SQL store,
``TracingClient.start_trace`` (assessments attached) + ``log_spans`` elsewhere (a tracking server).

It is used only on the MLflow versions in :data:`VERIFIED` — the ones
``tests/test_traces.py::test_fast_and_public_paths_store_the_same`` compared, raw rows included,
with the public path — and never when ``RAG_EXPERIMENTS_TRACES=public``; otherwise
:func:`fast_path_problem` names why and ``tracking.traces`` falls back to the public path with one
warning. A run's prompt version is linked to each trace here too (the ``mlflow.linkedPrompts`` tag
and the trace -> prompt-version entity association that the prompt version's Traces view
searches), in the same transaction.

The private MLflow names we rely on live in this module alone (traces, and a new eval-set
dataset's records: :func:`insert_new_records`), so a new MLflow version is checked against it
(nothing else imports private MLflow names, tests/test_layers.py); ``mlflow_adapter_session``
holds what MLflow leaves behind an interrupt (connections, its prompt link threads).

Why this module is long: it is the one place private MLflow names are used, so that a new MLflow
version is checked against one file (its two concerns, traces and dataset records, share the
version gate ``fast_path_problem``).
"""

from __future__ import annotations

import json
import os
import time
from importlib import metadata
from typing import Any

from mlflow.entities import TraceInfo, TraceLocation, TraceState
from mlflow.entities.span import Span, default_log_level_for_span_type
from mlflow.store.tracking.sqlalchemy_store import assessment_aggregate
from mlflow.tracing.client import TracingClient
from mlflow.tracing.constant import (
    AssessmentMetadataKey,
    SpanAttributeKey,
    SpansLocation,
    TraceMetadataKey,
    TraceTagKey,
)
from mlflow.tracing.utils import aggregate_usage_from_spans, dump_span_attribute_value, generate_assessment_id
from mlflow.tracing.utils.prompt import update_linked_prompts_tag

from rag_experiments.tracking.assessments import Pending

#: MLflow versions whose stored traces the fast path reproduces (checked by the test above)
VERIFIED = ("3.17.2",)
ENV = "RAG_EXPERIMENTS_TRACES"  # "public": always the public path; "fast" / unset: fast when verified
SPANS_PER_BATCH = 2000  # spans per log_spans call (non-SQL stores)


def fast_path_problem() -> str:
    """Why the fast path must not be used here ("" when it may): a forced public path, or an
    MLflow version it was not verified against."""
    if os.environ.get(ENV, "").lower() == "public":
        return f"{ENV}=public"
    version = metadata.version("mlflow")
    if version not in VERIFIED:
        return f"mlflow {version} is not one the fast path was verified against ({', '.join(VERIFIED)})"
    return ""


# ------------------------------------------------------------------------------ spans and trace infos


def _b64_id(n: int, nbytes: int) -> str:
    import base64

    return base64.b64encode(n.to_bytes(nbytes, "big")).decode()


def _new_ids() -> tuple[int, str]:
    """(OTel trace id, MLflow trace id ``tr-<32 hex>``), as MLflow's own v3 processor forms them."""
    otel = int.from_bytes(os.urandom(16), "big") or 1
    return otel, f"tr-{otel:032x}"


class _SpanWriter:
    """Builds the immutable spans of one trace (parents before children, explicit times)."""

    def __init__(self, otel_trace_id: int, trace_id: str, experiment_id: str | None = None) -> None:
        self.otel_trace_id, self.trace_id, self.experiment_id = otel_trace_id, trace_id, experiment_id
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
            # what the public start_span/start_trace with an explicit start time record
            SpanAttributeKey.START_TIME_NS: start_ns,
            SpanAttributeKey.LOG_LEVEL: int(default_log_level_for_span_type(span_type)),
            **(
                {SpanAttributeKey.EXPERIMENT_ID: self.experiment_id}
                if parent is None and self.experiment_id
                else {}
            ),
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
                    "attributes": {k: dump_span_attribute_value(v) for k, v in attrs.items()},
                    "status": {
                        "code": "STATUS_CODE_ERROR" if error else "STATUS_CODE_OK",
                        "message": error or "",
                    },
                    "events": [],
                }
            )
        )
        return span_id


def to_spans(specs, trace_ids: tuple[int, str] | None = None, experiment_id: str | None = None) -> list[Span]:
    """Immutable MLflow spans of one trace from ``tracking.traces.SpanSpec``s (parents first)."""
    w = _SpanWriter(*(trace_ids or _new_ids()), experiment_id)
    ids: list[int] = []
    for sp in specs:
        parent = ids[sp.parent] if sp.parent is not None else None
        ids.append(
            w.add(
                sp.name,
                sp.span_type,
                sp.start_ns,
                sp.end_ns,
                sp.inputs,
                sp.outputs,
                parent,
                sp.attributes,
                sp.error,
            )
        )
    return w.spans


def trace_info(
    trace_id: str,
    experiment_id: str,
    run_id: str,
    spans: list[Span],
    tags: dict[str, str],
    model_id: str | None = None,
) -> TraceInfo:
    """The finished trace's info as MLflow's v3 processor and exporter fill it (schema version 3,
    source run, the active model's id, inputs/outputs previews, aggregated token usage)."""
    from mlflow.tracing.utils.truncation import _get_truncated_preview

    root = spans[0]
    start, end = root.start_time_ns, root.end_time_ns
    # previews of the root's JSON-encoded inputs/outputs (a string answer keeps its quotes): the
    # trace_info columns as MLflow's client truncates them, the metadata as its processor does
    ins, outs = (dump_span_attribute_value(v) for v in (root.inputs, root.outputs))
    return TraceInfo(
        trace_id=trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start // 1_000_000,
        execution_duration=(end - start) // 1_000_000,
        state=TraceState.ERROR if root.status.status_code == "ERROR" else TraceState.OK,
        request_preview=_get_truncated_preview(ins, role="user"),
        response_preview=_get_truncated_preview(outs, role="assistant"),
        trace_metadata={
            TraceMetadataKey.SOURCE_RUN: run_id,
            **({TraceMetadataKey.MODEL_ID: model_id} if model_id else {}),  # the config's app version
            "mlflow.trace_schema.version": "3",
            TraceMetadataKey.INPUTS: _metadata_preview(ins),
            TraceMetadataKey.OUTPUTS: _metadata_preview(outs),
            # what MLflow's exporter aggregates on trace end: the UI's Tokens column reads it
            **(
                {TraceMetadataKey.TOKEN_USAGE: json.dumps(u)}
                if (u := aggregate_usage_from_spans(spans))
                else {}
            ),
        },
        tags={TraceTagKey.TRACE_NAME: root.name, **tags},
    )


def _metadata_preview(value: str) -> str:
    """``BaseMlflowSpanProcessor._truncate_metadata`` (mlflow 3.17.2): 250 characters, "..." cut."""
    from mlflow.tracing.constant import MAX_CHARS_IN_TRACE_INFO_METADATA as MAX
    from mlflow.tracing.constant import TRUNCATION_SUFFIX

    return value if len(value) <= MAX else value[: MAX - len(TRUNCATION_SUFFIX)] + TRUNCATION_SUFFIX


def write_fast(
    tracking_uri: str,
    experiment_id: str,
    run_id: str,
    records,
    batch: bool = True,
    model_id: str | None = None,
    prompts: list | None = None,
) -> list[str]:
    """Write ``records`` (``tracking.traces.TraceRecord``) with the fast path; returns trace ids.
    ``batch=False``: the per-trace ``TracingClient.start_trace`` + ``log_spans`` (what a tracking
    server gets). ``model_id``: the LoggedModel the traces are linked to (``mlflow.modelId``);
    ``prompts``: the ``PromptVersion``s each generated item's trace is linked to
    (:func:`start_traces`)."""
    tc = TracingClient(tracking_uri)
    infos, spans, pending, root_ids = [], [], [], []
    # what MlflowClient.link_prompt_versions_to_trace tags (and MLflow's exporter, for a prompt
    # loaded inside a trace): [{"name", "version"}] as JSON
    linked = {TraceTagKey.LINKED_PROMPTS: update_linked_prompts_tag(None, prompts)} if prompts else {}
    for rec in records:
        ids = _new_ids()
        trace_spans = to_spans(rec.spans, ids, experiment_id)
        tags = {**rec.tags, **linked} if rec.generated else rec.tags
        infos.append(trace_info(ids[1], experiment_id, run_id, trace_spans, tags, model_id))
        infos[-1].trace_metadata.update(rec.metadata or {})  # a conversation's session
        spans += trace_spans
        pending.append(rec.assessments)
        root_ids.append(trace_spans[0].span_id)
    if not start_traces(tc, infos, pending, root_ids, run_id, batch, spans if batch else None, prompts):
        for i in range(0, len(spans), SPANS_PER_BATCH):
            tc.log_spans(experiment_id, spans[i : i + SPANS_PER_BATCH])
    return [i.trace_id for i in infos]


# ------------------------------------------------------------------------------ SQL store rows


def _assessment_row(
    p: Pending, info: TraceInfo, span_id: str, now: int, meta_json: str, run_id: str
) -> dict[str, Any]:
    """The ``assessments`` table row of one assessment: the columns and encoding of
    ``SqlAssessments.from_mlflow_entity`` (mlflow 3.17.2), without building entities or ORM objects.
    ``now``: creation time (ms); ``meta_json``: the feedback metadata, JSON (the same for a run)."""
    feedback = p.kind == "feedback"
    aggregate_value, is_numeric = assessment_aggregate(p.value)
    return dict(
        assessment_id=generate_assessment_id(),
        trace_id=info.trace_id,
        name=p.name,
        assessment_type=p.kind,
        value=json.dumps(p.value),
        error=json.dumps(p.error.to_dictionary()) if p.error else None,
        created_timestamp=now,
        last_updated_timestamp=now,
        source_type=p.source.source_type,
        source_id=p.source.source_id,
        run_id=run_id if feedback else None,  # the store copies the feedback's source run here
        span_id=span_id if feedback else None,
        rationale=p.rationale if feedback else None,
        overrides=None,
        valid=True,
        assessment_metadata=meta_json if feedback else None,
        aggregate_value=aggregate_value,
        is_numeric_value=is_numeric,
        experiment_id=int(info.experiment_id),
        trace_timestamp_ms=info.request_time,
    )


def _span_rows(store, spans: list[Span], experiment_id: int) -> list[dict[str, Any]]:
    """The ``spans`` table rows of ``SqlAlchemyStore._log_spans_once`` (mlflow 3.17.2) for spans
    without cost, session or user attributes (ours): same content encoding, model columns."""
    from mlflow.store.tracking import sqlalchemy_store as S

    rows = []
    for span in spans:
        span_dict = S.translate_span_when_storing(span)
        attrs = span_dict.get("attributes", {})
        rows.append(
            dict(
                trace_id=span.trace_id,
                experiment_id=experiment_id,
                span_id=span.span_id,
                parent_span_id=span.parent_id,
                name=span.name,
                type=span.span_type,
                status=span.status.status_code,
                start_time_unix_nano=span.start_time_ns,
                end_time_unix_nano=span.end_time_ns,
                content=json.dumps(span_dict, cls=S.TraceJSONEncoder, ensure_ascii=store.db_type == S.MSSQL),
                input_cost=None,
                output_cost=None,
                total_cost=None,
                model_name=S.bounded_model_dimension(
                    S._try_parse_json_string(attrs.get(SpanAttributeKey.MODEL))
                ),
                model_provider=S.bounded_model_dimension(
                    S._try_parse_json_string(attrs.get(SpanAttributeKey.MODEL_PROVIDER))
                ),
            )
        )
    return rows


def _trace_rows(store, experiment, info: TraceInfo, with_spans: bool) -> tuple[dict, list[dict], list[dict]]:
    """One trace's ``trace_info`` row, tag rows and metadata rows, as ``_start_trace_once`` (and,
    ``with_spans``, ``_log_spans_once``'s spans-location tag) write them in mlflow 3.17.2."""
    from mlflow.store.tracking import sqlalchemy_store as S

    meta = dict(info.trace_metadata)
    info_row = dict(
        request_id=info.trace_id,
        experiment_id=int(info.experiment_id),
        timestamp_ms=info.request_time,
        execution_time_ms=info.execution_duration,
        status=info.state.value,
        client_request_id=info.client_request_id,
        request_preview=info.request_preview,
        response_preview=info.response_preview,
        trace_name=S.validate_trace_name(info.tags.get(TraceTagKey.TRACE_NAME)),
        **S.analytics_columns_from_metadata(meta),
    )
    location = store._get_trace_artifact_location_tag(experiment, info.trace_id)
    tags = {k: v for k, v in info.tags.items() if k != TraceTagKey.TRACE_NAME}
    tags[location.key] = location.value
    if with_spans:  # what log_spans tags: the spans live in this store's spans table
        tags[TraceTagKey.SPANS_LOCATION] = SpansLocation.TRACKING_STORE.value
    for key in S.PROMOTED_TRACE_METADATA_KEYS:
        meta.pop(key, None)
    meta[TraceMetadataKey.TRACE_INFO_FINALIZED] = "true"
    tag_rows = [dict(request_id=info.trace_id, key=k, value=v) for k, v in tags.items()]
    meta_rows = [dict(request_id=info.trace_id, key=k, value=v) for k, v in sorted(meta.items())]
    return info_row, tag_rows, meta_rows


def start_traces(
    tc: TracingClient,
    infos: list[TraceInfo],
    pending: list[list[Pending]],
    root_span_ids: list[str],
    run_id: str,
    batch: bool = True,
    spans: list[Span] | None = None,
    prompts: list | None = None,
) -> bool:
    """Create the traces (info, tags, metadata, assessments, and ``spans`` when given), in one
    transaction on a SQL store; True when the spans were written too (else: ``log_spans`` them).
    ``prompts``: ``PromptVersion``s the traces tagged ``mlflow.linkedPrompts`` are linked to
    (:func:`_association_rows`; elsewhere the store's ``link_prompts_to_trace``, one call per
    trace: its REST request takes one trace).

    ``TracingClient.start_trace`` costs one transaction (~80 ms on sqlite here) per trace and
    ``log_spans`` one tag merge (a SELECT + INSERT) per trace; this does what their happy paths do
    (``SqlAlchemyStore._start_trace_once`` and ``_log_spans_once`` in mlflow 3.17.2, pinned) for all
    traces at once, for traces that are new and finished. Other stores (a tracking server), or
    ``batch=False``, get the per-trace call.
    """
    import sqlalchemy
    from mlflow.store.tracking import sqlalchemy_store as S

    store = tc.store
    if not (batch and isinstance(store, S.SqlAlchemyStore)) or not infos:
        meta = {AssessmentMetadataKey.SOURCE_RUN_ID: run_id}
        for info, ps, span_id in zip(infos, pending, root_span_ids, strict=True):
            info.assessments = [p.entity(info.trace_id, span_id, meta) for p in ps]
            tc.start_trace(info)
            if prompts and TraceTagKey.LINKED_PROMPTS in info.tags:
                store.link_prompts_to_trace(info.trace_id, prompts)
        return False
    experiment = store.get_experiment(infos[0].experiment_id)
    store._check_experiment_is_active(experiment)
    infos_rows, tag_rows, meta_rows, assessment_rows = [], [], [], []
    now, meta_json = int(time.time() * 1000), json.dumps({AssessmentMetadataKey.SOURCE_RUN_ID: run_id})
    for info, ps, span_id in zip(infos, pending, root_span_ids, strict=True):
        info_row, tags, metas = _trace_rows(store, experiment, info, spans is not None)
        infos_rows.append(info_row)
        tag_rows += tags
        meta_rows += metas
        assessment_rows += [_assessment_row(p, info, span_id, now, meta_json, run_id) for p in ps]
    # one executemany takes its columns from the first row: a trace without token usage (an item
    # not generated) has no token columns, so every row gets them all (None where absent)
    cols = {k: None for row in infos_rows for k in row}
    infos_rows = [{**cols, **row} for row in infos_rows]
    span_rows = _span_rows(store, spans, int(experiment.experiment_id)) if spans is not None else []
    linked = [i for i in infos if TraceTagKey.LINKED_PROMPTS in i.tags]  # the generated items' traces
    link_rows = _association_rows(store, linked, prompts or [])
    with store.ManagedSessionMaker(read_only=False) as session:
        families = [S.RollupFamily.TRACE_METRIC, S.RollupFamily.ASSESSMENT]
        partitions = [
            (f, int(experiment.experiment_id), sorted({i.request_time for i in infos})) for f in families
        ]
        if span_rows:
            stamps = sorted({r["start_time_unix_nano"] // 1_000_000 for r in span_rows})
            partitions.append((S.RollupFamily.SPAN_COST, int(experiment.experiment_id), stamps))
        S.enqueue_rollup_rebuild_partitions(session, partitions)
        # Core executemany inserts: the ORM's per-object bookkeeping was most of the cost
        for model, rows in (
            (S.SqlTraceInfo, infos_rows),
            (S.SqlTraceTag, tag_rows),
            (S.SqlTraceMetadata, meta_rows),
            (S.SqlAssessments, assessment_rows),
            (S.SqlSpan, span_rows),
            (S.SqlEntityAssociation, link_rows),
        ):
            if rows:
                session.execute(sqlalchemy.insert(model.__table__), rows)
        if span_rows:  # log_spans' guard against a concurrent archival of these traces
            store._advance_db_payload_generations_for_db_span_writes(session, [i.trace_id for i in infos])
    return spans is not None


def _association_rows(store, infos: list[TraceInfo], prompts: list) -> list[dict[str, Any]]:
    """The ``entity_associations`` rows (trace -> prompt version ``name/version``) of
    ``SqlAlchemyStore.link_prompts_to_trace`` (mlflow 3.17.2) for new traces: what the prompt
    version's Traces view searches (``prompt = 'name/version'``). Its id column holds 36
    characters: a longer ``name/version`` fails there outside SQLite, and MLflow's link then keeps
    only the trace tag; so does this."""
    import uuid

    from mlflow.entities.entity_type import EntityAssociationType as E
    from mlflow.store.db.db_types import SQLITE

    ids = [f"{pv.name}/{pv.version}" for pv in prompts]
    ids = [i for i in dict.fromkeys(ids) if len(i) <= 36 or store.db_type == SQLITE]
    now = int(time.time() * 1000)
    return [
        dict(association_id=uuid.uuid4().hex, source_type=E.TRACE, source_id=info.trace_id,
             destination_type=E.PROMPT_VERSION, destination_id=pid, created_time=now)
        for info in infos for pid in ids
    ]  # fmt: skip


# -- a new evaluation dataset's records, in one transaction (tracking.genai_dataset; docs/tracing.md)


def insert_new_records(tracking_uri: str, ds, records: list[dict[str, Any]]) -> bool:
    """Add ``records`` to the evaluation dataset ``ds`` as ``ds.merge_records(records)`` would, in
    one executemany transaction on a SQL store; False (nothing written) when the fast path does not
    apply: not a SQL store, an unverified MLflow, ``RAG_EXPERIMENTS_TRACES=public``, or records
    whose inputs repeat (``merge_records`` would merge them), or a dataset that has records already.

    ``merge_records`` (``EvaluationDataset.merge_records`` + ``SqlAlchemyStore.upsert_dataset_records``
    in mlflow 3.17.2) looks each record up by its input hash and adds one ORM object, and every
    lookup autoflushes the previous insert: two statements per record, ~1.5 ms each (20,000 records:
    ~30 s, most of a first traced run's tracing). For records none of which exist this writes the
    same rows (source types inferred, ``mlflow.user`` tag, input hash, the dataset's schema, profile
    and digest updated) with one INSERT for all.
    """
    if fast_path_problem() or not records:
        return False
    import hashlib

    import sqlalchemy
    from mlflow.entities.dataset_record import DatasetRecord
    from mlflow.entities.dataset_record_source import DatasetRecordSource
    from mlflow.store.tracking import sqlalchemy_store as S
    from mlflow.tracking.context import registry as context_registry
    from mlflow.utils.mlflow_tags import MLFLOW_USER
    from mlflow.utils.time import get_current_time_millis

    store = TracingClient(tracking_uri).store
    if not isinstance(store, S.SqlAlchemyStore):
        return False
    records = [dict(r) for r in records]  # merge_records edits its records in place: not the caller's
    ds._validate_record_dicts(records)
    ds._infer_source_types(records)
    ds._schema = store.get_dataset(ds.dataset_id).schema
    ds._validate_schema(records)
    if user := context_registry.resolve_tags().get(MLFLOW_USER):
        for r in records:
            tags = r.get("tags") or {}
            r["tags"] = {**tags, MLFLOW_USER: tags.get(MLFLOW_USER, user)}  # merge_records' key order
    hashes = [
        hashlib.sha256(json.dumps(r.get("inputs", {}), sort_keys=True).encode()).hexdigest() for r in records
    ]
    if len(set(hashes)) < len(hashes):
        return False  # repeated inputs: merge_records merges them into one record
    Rec = S.SqlEvaluationDatasetRecord
    with store.ManagedSessionMaker(read_only=False) as session:
        store._validate_dataset_accessible(session, ds.dataset_id)
        if session.query(Rec).filter(Rec.dataset_id == ds.dataset_id).count():
            return False  # not a new dataset: its records need merging (the public path)
        now = get_current_time_millis()
        rows, sources = [], {}  # each distinct source once: its to_dict (dataclasses.asdict) is slow
        for r, h in zip(records, hashes, strict=True):
            src = r.get("source")
            if isinstance(src, dict):
                key = json.dumps(src, sort_keys=True)
                if key not in sources:
                    made = DatasetRecordSource.from_dict(src)
                    sources[key] = (made, made.to_dict())
                src = sources[key]
            rec = DatasetRecord(  # as upsert_dataset_records builds it (source id and type from source)
                dataset_record_id=None, dataset_id=ds.dataset_id, inputs=r.get("inputs", {}),
                outputs=r.get("outputs", {}), created_time=now, last_update_time=now,
                expectations=r.get("expectations"), tags=r.get("tags"),
                source=src[0] if isinstance(src, tuple) else src,
                created_by=(r.get("tags") or {}).get(MLFLOW_USER),
                last_updated_by=(r.get("tags") or {}).get(MLFLOW_USER),
            )  # fmt: skip
            rows.append(_record_row(rec, h, src[1] if isinstance(src, tuple) else None))
        session.execute(sqlalchemy.insert(Rec.__table__), rows)
        _finish_upsert(store, session, ds.dataset_id, records, now)
    ds._records = None
    return True


def _record_row(rec, input_hash: str, source_dict: dict | None = None) -> dict[str, Any]:
    """The ``evaluation_dataset_records`` row of ``SqlEvaluationDatasetRecord.from_mlflow_entity``
    (mlflow 3.17.2) without the ORM object; ``source_dict``: ``rec.source.to_dict()`` if known."""
    from mlflow.entities.dataset_record import DATASET_RECORD_WRAPPED_OUTPUT_KEY
    from mlflow.store.tracking import sqlalchemy_store as S

    return dict(
        dataset_record_id=S.SqlEvaluationDatasetRecord.generate_record_id(),
        dataset_id=rec.dataset_id,
        inputs=rec.inputs,
        outputs={DATASET_RECORD_WRAPPED_OUTPUT_KEY: rec.outputs} if rec.outputs is not None else None,
        expectations=rec.expectations,
        tags=rec.tags,
        source=source_dict if source_dict is not None else rec.source.to_dict() if rec.source else None,
        source_id=rec.source_id,
        source_type=rec.source.source_type if rec.source else None,
        created_time=rec.created_time,
        last_update_time=rec.last_update_time,
        created_by=rec.created_by,
        last_updated_by=rec.last_updated_by,
        input_hash=input_hash,
    )


def _finish_upsert(store, session, dataset_id: str, records: list[dict], now: int) -> None:
    """The end of ``upsert_dataset_records`` (mlflow 3.17.2): schema, profile, digest, update time."""
    from mlflow.store.tracking import sqlalchemy_store as S
    from mlflow.utils.mlflow_tags import MLFLOW_USER

    D = S.SqlEvaluationDataset
    info = (
        store._dataset_query(session)
        .with_entities(D.schema, D.name)
        .filter(D.dataset_id == dataset_id)
        .first()
    )
    schema, name = (info[0], info[1]) if info else (None, None)
    updated_by = None
    for r in records:
        if (tags := r.get("tags")) and MLFLOW_USER in tags:
            updated_by = tags[MLFLOW_USER]
    fields: dict[str, Any] = {
        "last_update_time": now,
        "last_updated_by": updated_by,
        "digest": store._compute_dataset_digest(name, now),
    }
    if new_schema := store._update_dataset_schema(schema, records):
        fields["schema"] = json.dumps(new_schema)
    if profile := store._compute_dataset_profile(session, dataset_id):
        fields["profile"] = json.dumps(profile)
    store._dataset_query(session).filter(D.dataset_id == dataset_id).update(fields)


def pending_trace_metadata(trace_id: str, metadata: dict[str, str]) -> None:
    """Add ``metadata`` to a trace the public client started and has not ended yet (its in-memory
    record, ``InMemoryTraceManager``, mlflow 3.17.2): ``MlflowClient.start_trace`` takes tags but no
    metadata, and the session key (``mlflow.trace.session``) is metadata."""
    from mlflow.tracing.trace_manager import InMemoryTraceManager

    with InMemoryTraceManager.get_instance().get_trace(trace_id) as trace:
        if trace is not None:
            trace.info.trace_metadata.update(metadata)
