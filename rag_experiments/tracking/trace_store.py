"""Writing many traces to a SQL tracking store in one transaction (used by ``tracking.traces``).

``TracingClient.start_trace`` costs one transaction per trace (~80 ms on sqlite on a busy 2-core
machine, 14 s for 168 items) and ``log_spans`` a tag merge per trace; :func:`start_traces` writes
what their happy paths write (``SqlAlchemyStore._start_trace_once`` and ``_log_spans_once`` in
mlflow 3.17.2, which ``pyproject.toml`` pins) for all traces of a run at once, spans included, as
executemany inserts in one transaction. Any other store gets the per-trace public calls.
Re-check this module when upgrading mlflow: ``tests/test_traces.py`` reads every value back through
the public API and compares the raw rows with the public path's.
"""

from __future__ import annotations

import json
import time
from typing import Any

from mlflow.entities import TraceInfo
from mlflow.entities.span import Span
from mlflow.store.tracking.sqlalchemy_store import assessment_aggregate
from mlflow.tracing.client import TracingClient
from mlflow.tracing.constant import (
    AssessmentMetadataKey,
    SpanAttributeKey,
    SpansLocation,
    TraceMetadataKey,
    TraceTagKey,
)
from mlflow.tracing.utils import generate_assessment_id

from rag_experiments.tracking.traces import Pending


def _assessment_row(p: Pending, info: TraceInfo, span_id: str, now: int, meta_json: str) -> dict[str, Any]:
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
        run_id=None,
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
) -> bool:
    """Create the traces (info, tags, metadata, assessments, and ``spans`` when given), in one
    transaction on a SQL store; True when the spans were written too (else: ``log_spans`` them).

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
        assessment_rows += [_assessment_row(p, info, span_id, now, meta_json) for p in ps]
    span_rows = _span_rows(store, spans, int(experiment.experiment_id)) if spans is not None else []
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
        ):
            if rows:
                session.execute(sqlalchemy.insert(model.__table__), rows)
        if span_rows:  # log_spans' guard against a concurrent archival of these traces
            store._advance_db_payload_generations_for_db_span_writes(session, [i.trace_id for i in infos])
    return spans is not None
