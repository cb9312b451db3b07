"""The eval set as an MLflow evaluation dataset: the adapter's one-INSERT records equal MLflow's
own ``merge_records`` rows; a half-filled dataset is completed; the public path is batched."""

from __future__ import annotations

import json
import sqlite3

import mlflow
import pytest
from mlflow import MlflowClient

from rag_experiments.tracking import genai_dataset, mlflow_adapter
from rag_experiments.tracking.genai_dataset import add_records, dataset_records, link_dataset, n_records
from tests.sweep_helpers import tiny_inputs

DIFFERS = ("dataset_record_id", "dataset_id", "created_time", "last_update_time")  # per write


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module (creating one costs seconds); each test uses its own datasets."""
    tmp_path = tmp_path_factory.mktemp("genai_dataset")
    corpus, items, _ = tiny_inputs(tmp_path, n_items=12)
    uri = f"sqlite:///{tmp_path}/m.db"
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("x", artifact_location=(tmp_path / "a").as_uri())
    recs = dataset_records(items, {d.doc_id: d.text for d in corpus.docs}, "d" * 64)
    return tmp_path / "m.db", uri, c, exp, corpus, items, recs


def _rows(db, dataset_id: str) -> list[tuple]:
    con = sqlite3.connect(db)
    cur = con.execute("SELECT * FROM evaluation_dataset_records WHERE dataset_id = ?", (dataset_id,))
    cols = [d[0] for d in cur.description]
    return sorted(tuple(v for k, v in zip(cols, r, strict=True) if k not in DIFFERS) for r in cur)


def _dataset_row(db, dataset_id: str) -> tuple:
    con = sqlite3.connect(db)
    return con.execute(
        "SELECT schema, profile, created_by, last_updated_by FROM evaluation_datasets WHERE dataset_id = ?",
        (dataset_id,),
    ).fetchone()


def test_fast_records_equal_merge_records_rows(store):
    """Raw-row equality of the records table and the dataset's schema/profile columns."""
    db, uri, c, exp, _, _, recs = store
    mlflow.set_tracking_uri(uri)  # merge_records uses the fluent tracking URI
    assert mlflow.__version__ in mlflow_adapter.VERIFIED
    fast = c.create_dataset("fast", experiment_id=[exp])
    public = c.create_dataset("public", experiment_id=[exp])
    assert mlflow_adapter.insert_new_records(uri, fast, json.loads(json.dumps(recs)))
    public.merge_records(json.loads(json.dumps(recs)))
    got = _rows(db, fast.dataset_id)
    assert len(got) == len(recs) and got == _rows(db, public.dataset_id)
    assert _dataset_row(db, fast.dataset_id) == _dataset_row(db, public.dataset_id)
    assert n_records(c.get_dataset(fast.dataset_id)) == len(recs)
    a, b = c.get_dataset(fast.dataset_id), c.get_dataset(public.dataset_id)
    assert a.digest != fast.digest and a.last_update_time >= fast.last_update_time  # updated, as upsert does
    df_a, df_b = a.to_df(), b.to_df()
    cols = ["inputs", "expectations", "tags", "source", "source_type", "source_id"]
    key = df_a["inputs"].map(lambda i: i["item_id"]), df_b["inputs"].map(lambda i: i["item_id"])
    assert (
        df_a.assign(_k=key[0]).sort_values("_k")[cols].to_dict("records")
        == df_b.assign(_k=key[1]).sort_values("_k")[cols].to_dict("records")
    )


def test_fast_records_refuse_what_merge_records_would_merge(store):
    """Existing records or repeated inputs: nothing written, the caller merges publicly."""
    db, uri, c, exp, _, _, recs = store
    mlflow.set_tracking_uri(uri)
    ds = c.create_dataset("d", experiment_id=[exp])
    assert not mlflow_adapter.insert_new_records(uri, ds, [recs[0], dict(recs[0])])
    assert _rows(db, ds.dataset_id) == []
    ds.merge_records(recs[:3])
    assert not mlflow_adapter.insert_new_records(uri, ds, recs)
    assert len(_rows(db, ds.dataset_id)) == 3


def test_public_path_in_batches_and_a_half_filled_dataset_is_completed(store, monkeypatch):
    """Unverified MLflow: merge_records in calls of RECORDS_PER_CALL; a dataset left with fewer
    records than items (a run died while filling it) is completed on the next link, not reused."""
    db, uri, c, exp, corpus, items, recs = store
    mlflow.set_tracking_uri(uri)
    monkeypatch.setattr(mlflow_adapter, "VERIFIED", ())
    monkeypatch.setattr(genai_dataset, "RECORDS_PER_CALL", 5)
    calls = []
    real = mlflow.entities.EvaluationDataset.merge_records
    monkeypatch.setattr(
        mlflow.entities.EvaluationDataset,
        "merge_records",
        lambda self, r: calls.append(len(r)) or real(self, r),
    )
    digest = "e" * 64
    ds = c.create_dataset(f"evalset-{digest[:16]}", experiment_id=[exp], tags={"evalset_digest": digest})
    add_records(uri, ds, recs[:4])  # what a killed first run left
    assert calls == [4]
    run = c.create_run(exp).info.run_id
    dataset_id = link_dataset(c, run, exp, items, corpus.docs, digest)
    assert dataset_id == ds.dataset_id and calls == [4, 5, 5, 2]
    assert len(_rows(db, ds.dataset_id)) == len(items) == n_records(c.get_dataset(dataset_id))
    calls.clear()
    link_dataset(c, c.create_run(exp).info.run_id, exp, items, corpus.docs, digest)
    assert calls == []  # complete: reused as it is
