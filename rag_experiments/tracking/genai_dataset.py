"""The eval set as an MLflow GenAI evaluation dataset, one per eval-set digest (docs/tracing.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rag_experiments.tracking.assessments import expectations
from rag_experiments.types import Document, EvalItem


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
        ds.merge_records(dataset_records(items, {d.doc_id: d.text for d in docs}, evalset_digest))
        ds = client.get_dataset(ds.dataset_id)
    entity = run_input_entity(ds)
    client.log_inputs(run_id, datasets=[DatasetInput(entity, tags=[InputTag("mlflow.data.context", "eval")])])
    return ds.dataset_id


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
