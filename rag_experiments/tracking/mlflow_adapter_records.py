"""MLflow internals, second concern: a new evaluation dataset's records written straight to a SQL
store in one transaction (:func:`insert_new_records`), as ``EvaluationDataset.merge_records`` would
write them one by one (``tracking.genai_dataset`` calls it; docs/tracing.md).

Used under the same rule as the trace fast path (``tracking.mlflow_adapter.fast_path_problem``:
only on the MLflow versions in ``mlflow_adapter.VERIFIED``, never with
``RAG_EXPERIMENTS_TRACES=public``); ``tests/test_genai_dataset.py`` compares its rows with
``merge_records``'. Private names of MLflow live in the ``tracking/mlflow_adapter*.py`` modules only.
"""

from __future__ import annotations

import json
from typing import Any

from mlflow.tracing.client import TracingClient

from rag_experiments.tracking.mlflow_adapter import fast_path_problem


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
