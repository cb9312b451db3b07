"""The eval set as an MLflow GenAI evaluation dataset, one per eval-set digest (docs/tracing.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rag_experiments.core.types import Document, EvalItem
from rag_experiments.tracking.assessments import expectations
from rag_experiments.tracking.locks import host_lock

RECORDS_PER_CALL = 500  # records per public merge_records call: one store transaction or request each


def dataset_records(items: Iterable[EvalItem], doc_text: dict[str, str], evalset_digest: str) -> list[dict]:
    """The eval set as MLflow evaluation-dataset records: inputs, expectations, tags."""
    out = []
    for it in items:
        exp = {e.name: e.value for e in expectations(it, doc_text, evalset_digest)}
        out.append(
            {
                "inputs": {"query": it.query, "item_id": it.id},
                "expectations": exp,
                "tags": {"eval_tags": ",".join(it.tags)},
            }
        )
    return out


def link_dataset(
    client,
    run_id: str,
    experiment_id: str,
    items: Sequence[EvalItem],
    docs: Iterable[Document],
    evalset_digest: str,
) -> str:
    """Create (or reuse, by digest) the eval set as an MLflow GenAI evaluation dataset and log it
    as the run's ``eval`` input. Returns the dataset id.

    The dataset is named ``evalset-<digest16>`` and tagged ``evalset_digest``: the same eval set
    content is one dataset however many runs or experiments use it.
    """
    import mlflow
    from mlflow.entities import DatasetInput, InputTag

    name = f"evalset-{evalset_digest[:16]}"
    if mlflow.get_tracking_uri() != client.tracking_uri:  # the dataset's own calls use it
        mlflow.set_tracking_uri(client.tracking_uri)
    # the configs of a parallel sweep start together: one host lock per (store, dataset) so only
    # one of them creates and fills it (two inserts of the same records violate its UNIQUE key)
    with host_lock("dataset", f"dataset {name}", client.tracking_uri, name):
        ds = _find_or_fill(client, name, experiment_id, items, docs, evalset_digest)
    entity = run_input_entity(ds)
    client.log_inputs(run_id, datasets=[DatasetInput(entity, tags=[InputTag("mlflow.data.context", "eval")])])
    return ds.dataset_id


def _find_or_fill(client, name: str, experiment_id: str, items, docs, evalset_digest: str):
    """The eval set's dataset, created and filled with its records when new or incomplete."""
    found = client.search_datasets(filter_string=f"name = '{name}'", max_results=1)
    if found:
        ds = found[0]
        if experiment_id not in (ds.experiment_ids or []):
            from mlflow.genai.datasets import add_dataset_to_experiments

            add_dataset_to_experiments(ds.dataset_id, [experiment_id])
    else:
        ds = client.create_dataset(
            name, experiment_id=[experiment_id], tags={"evalset_digest": evalset_digest}
        )
    if n_records(ds) < len(items):  # new, or a run died while filling it: add what is missing
        add_records(
            client.tracking_uri, ds, dataset_records(items, {d.doc_id: d.text for d in docs}, evalset_digest)
        )
        ds = client.get_dataset(ds.dataset_id)
    return ds


def n_records(ds) -> int:
    """The dataset's record count as its profile states it (0 before any record was added)."""
    import json

    profile = ds.profile
    return int((json.loads(profile) if isinstance(profile, str) else profile or {}).get("num_records", 0))


def add_records(tracking_uri: str, ds, records: list[dict]) -> None:
    """``ds.merge_records(records)``: in one INSERT on a SQL store when the dataset is still empty
    (``mlflow_adapter.insert_new_records``: MLflow's own upsert costs two statements per record,
    ~30 s for 20,000), else through MLflow's public API in calls of :data:`RECORDS_PER_CALL`
    records, so that no single request to a tracking server outlasts its timeout
    (``tracking.timeout_s``). The upsert is keyed by the record's inputs: a repeated call adds
    nothing twice."""
    from rag_experiments.tracking.mlflow_adapter import insert_new_records

    if insert_new_records(tracking_uri, ds, records):
        return
    for i in range(0, len(records), RECORDS_PER_CALL):
        ds.merge_records(records[i : i + RECORDS_PER_CALL])


def run_input_entity(ds):
    """``ds._to_mlflow_entity()`` without loading every record: that goes through the evaluation
    dataset's ``to_dict``, which reads all records only to drop them (~0.2-0.7 s per run here)."""
    from mlflow.data.dataset import Dataset
    from mlflow.entities import Dataset as DatasetEntity

    base = Dataset.to_dict(ds)  # name, digest, source, source_type
    return DatasetEntity(
        name=base["name"],
        digest=base["digest"],
        source_type=base["source_type"],
        source=base["source"],
        schema=ds.schema,
        profile=ds.profile,
    )


def log_version(
    tracking_uri: str,
    experiment: str,
    items: Sequence[EvalItem],
    docs: Iterable[Document],
    evalset_digest: str,
    parent_digest: str,
    lineage: dict[str, str],
) -> str:
    """A new eval set (``evalset accept`` of a trace review) as the next version of the evaluation
    dataset: the dataset ``evalset-<digest16>`` (one per digest, as :func:`link_dataset` names it),
    tagged with its parent's digest and its source; each record from a trace carries the tag
    ``source_trace`` (lineage: trace id → item id). Returns the dataset id; an existing one is
    reused (accepting the same review again adds nothing)."""
    import mlflow
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    if mlflow.get_tracking_uri() != tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    name = f"evalset-{evalset_digest[:16]}"
    by_item = {item: trace for trace, item in lineage.items()}
    with host_lock("dataset", f"dataset {name}", tracking_uri, name):
        found = client.search_datasets(filter_string=f"name = '{name}'", max_results=1)
        ds = found[0] if found else client.create_dataset(
            name, experiment_id=[exp_id],
            tags={"evalset_digest": evalset_digest, "parent_digest": parent_digest, "source": "from-traces",
                  "lineage_n": str(len(lineage))},
        )  # fmt: skip
        if n_records(ds) < len(items):
            records = dataset_records(items, {d.doc_id: d.text for d in docs}, evalset_digest)
            for rec in records:
                if trace := by_item.get(rec["inputs"]["item_id"]):
                    rec["tags"]["source_trace"] = trace
            add_records(tracking_uri, ds, records)
    return ds.dataset_id
