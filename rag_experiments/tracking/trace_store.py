"""Writing many traces to a SQL tracking store in one transaction (used by ``tracking.traces``).

``TracingClient.start_trace`` costs one transaction per trace (~80 ms on sqlite on a busy 2-core
machine, 14 s for 168 items); :func:`start_traces` writes what its happy path writes
(``SqlAlchemyStore._start_trace_once`` in mlflow 3.17.2, which ``pyproject.toml`` pins) for all
traces of a run at once, as executemany inserts. Any other store gets the per-trace public call.
Re-check this module when upgrading mlflow: ``tests/test_traces.py`` reads every value back through
the public API.
"""

from __future__ import annotations

import json
import time
from typing import Any

from mlflow.entities import TraceInfo
from mlflow.tracing.client import TracingClient
from mlflow.tracing.constant import AssessmentMetadataKey, TraceMetadataKey, TraceTagKey

from rag_experiments.tracking.traces import Pending


def _assessment_row(p: Pending, info: TraceInfo, span_id: str, run_id: str) -> dict[str, Any]:
    """The ``assessments`` table row of one assessment: the columns and encoding of
    ``SqlAssessments.from_mlflow_entity`` (mlflow 3.17.2), without building entities or ORM objects."""
    from mlflow.store.tracking.sqlalchemy_store import assessment_aggregate
    from mlflow.tracing.utils import generate_assessment_id

    now = int(time.time() * 1000)
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
        assessment_metadata=json.dumps({AssessmentMetadataKey.SOURCE_RUN_ID: run_id}) if feedback else None,
        aggregate_value=aggregate_value,
        is_numeric_value=is_numeric,
        experiment_id=int(info.experiment_id),
        trace_timestamp_ms=info.request_time,
    )


def start_traces(
    tc: TracingClient,
    infos: list[TraceInfo],
    pending: list[list[Pending]],
    root_span_ids: list[str],
    run_id: str,
    batch: bool = True,
) -> None:
    """Create the traces (info, tags, metadata, assessments), in one transaction on a SQL store.

    ``TracingClient.start_trace`` costs one transaction (~80 ms on sqlite here) per trace; this does
    what its happy path does (``SqlAlchemyStore._start_trace_once`` in mlflow 3.17.2, pinned) for all
    traces at once. Other stores (a tracking server), or ``batch=False``, get the per-trace call.
    """
    import sqlalchemy
    from mlflow.store.tracking import sqlalchemy_store as S

    store = tc.store
    if not (batch and isinstance(store, S.SqlAlchemyStore)) or not infos:
        meta = {AssessmentMetadataKey.SOURCE_RUN_ID: run_id}
        for info, ps, span_id in zip(infos, pending, root_span_ids, strict=True):
            info.assessments = [p.entity(info.trace_id, span_id, meta) for p in ps]
            tc.start_trace(info)
        return
    experiment = store.get_experiment(infos[0].experiment_id)
    store._check_experiment_is_active(experiment)
    infos_rows, tag_rows, meta_rows, assessment_rows = [], [], [], []
    for info, ps, span_id in zip(infos, pending, root_span_ids, strict=True):
        meta = dict(info.trace_metadata)
        infos_rows.append(
            dict(
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
        )
        location = store._get_trace_artifact_location_tag(experiment, info.trace_id)
        tags = {k: v for k, v in info.tags.items() if k != TraceTagKey.TRACE_NAME}
        tags[location.key] = location.value
        tag_rows += [dict(request_id=info.trace_id, key=k, value=v) for k, v in tags.items()]
        for key in S.PROMOTED_TRACE_METADATA_KEYS:
            meta.pop(key, None)
        meta[TraceMetadataKey.TRACE_INFO_FINALIZED] = "true"
        meta_rows += [dict(request_id=info.trace_id, key=k, value=v) for k, v in sorted(meta.items())]
        assessment_rows += [_assessment_row(p, info, span_id, run_id) for p in ps]
    with store.ManagedSessionMaker(read_only=False) as session:
        S.enqueue_rollup_rebuild_partitions(
            session,
            [
                (family, int(experiment.experiment_id), sorted({i.request_time for i in infos}))
                for family in (S.RollupFamily.TRACE_METRIC, S.RollupFamily.ASSESSMENT)
            ],
        )
        # Core executemany inserts: the ORM's per-object bookkeeping was most of the cost
        for model, rows in (
            (S.SqlTraceInfo, infos_rows),
            (S.SqlTraceTag, tag_rows),
            (S.SqlTraceMetadata, meta_rows),
            (S.SqlAssessments, assessment_rows),
        ):
            if rows:
                session.execute(sqlalchemy.insert(model.__table__), rows)
