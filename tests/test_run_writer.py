"""The run writer is the seam (issue 28 item 5): one config's pipeline, run by ``sweep.execute`` on a
tiny corpus, written through the MLflow writer (a real sqlite store) and through the memory writer
gives the same params, metrics and per-query table, and both set the run's status last."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from rag_experiments.run.assemble import HydraContext
from rag_experiments.run.sweep import execute, start_run
from rag_experiments.tracking import traces as tracking_traces
from rag_experiments.tracking import writer as tracking_writer
from rag_experiments.tracking.memory import MemoryStore
from rag_experiments.tracking.run_writer import (
    TRACES_EXPECTED,
    TRACES_SAMPLED,
    MemoryRunWriter,
    MlflowRunWriter,
    RunWriter,
)
from rag_experiments.tracking.runs import load_per_query
from tests.sweep_helpers import tiny_job


class Recording:
    """A writer that records the order of the calls made to the one it wraps (no behaviour of its own)."""

    def __init__(self, inner: RunWriter):
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)

        return call


def _job(root, ctx: HydraContext | None = None, extra: tuple[str, ...] = ()):
    """One assembled job (retrieval-only, BM25) on the tiny corpus: what ``sweep.main`` builds."""
    return tiny_job(root, "generator=none", *extra, ctx=ctx)


def _no_latency(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if "latency" not in k}


def _table(df: pd.DataFrame) -> list[dict]:
    """The table's values, latencies (timed, so different on each run) left out."""
    df = df.drop(columns=[c for c in df if c.startswith("latency")]).reset_index(drop=True)
    return json.loads(df.round(9).to_json(orient="records", double_precision=15))


def test_the_pipeline_writes_the_same_run_through_both_writers(tmp_path) -> None:
    job = _job(tmp_path, HydraContext(overrides=("retriever=bm25",), choices={"retriever": "bm25"}))
    mlflow_writer = Recording(MlflowRunWriter.open(f"sqlite:///{tmp_path}/mlflow.db", "test", str(tmp_path / "a")))
    memory_writer = Recording(MemoryRunWriter(MemoryStore(), "test"))

    ids = {}
    for name, w in (("mlflow", mlflow_writer), ("memory", memory_writer)):
        run_id, parent_id = start_run(w, job)
        assert parent_id is None  # a single run
        res, _ = execute(w, run_id, job, parent_id)
        ids[name] = run_id
        # the status is the last thing written, once; the results all come before it
        assert w.calls[0] == "start" and w.calls[-1] == "end" and w.calls.count("end") == 1, w.calls
        assert {"log_results", "log_traces", "set_tags"} <= set(w.calls[1:-1])
        assert "abort" not in w.calls

    client = mlflow_writer.inner.client
    logged = client.get_run(ids["mlflow"])
    stored = memory_writer.inner.store.get(ids["memory"])
    assert logged.info.status == stored.status == "FINISHED"
    assert logged.data.params == stored.params and "retriever.k" in stored.params
    assert stored.params["retriever"] == "bm25"  # the group choice, from Hydra's runtime (HydraContext)
    # the metrics: every aggregate logged as a number in both (latencies are timed, so they differ)
    assert _no_latency(logged.data.metrics) == _no_latency(stored.metrics)
    assert {"hit_at_3", "mrr", "n_queries"} <= set(stored.metrics)
    assert stored.metrics["n_queries"] == len(job.inputs.evalset.items) == 8
    assert res.aggregates["hit_at_3"] == stored.metrics["hit_at_3"]
    # the per-query table: the store's parquet, read back by the reader, equals the memory copy
    assert _table(load_per_query(client, logged, long=False)) == _table(stored.table)
    # the run's own artifacts and tags
    assert stored.artifacts["config.yaml"] == job.setup.config_yaml
    names = {a.path for a in client.list_artifacts(ids["mlflow"])}
    assert {"config.yaml", "cache_keys.json", "per_query.parquet"} <= names
    for tag in ("config_hash", "code_fingerprint", "corpus_digest", "evalset_digest", TRACES_EXPECTED):
        assert logged.data.tags[tag] == stored.tags[tag], tag
    # one trace per eval item, in both
    assert int(stored.tags[TRACES_EXPECTED]) == len(stored.traces) == 8
    assert json.loads(logged.data.tags["traces"])["n"] == json.loads(stored.tags["traces"])["n"] == 8
    assert {t["tags"]["item_id"] for t in stored.traces} == {it.id for it in job.inputs.evalset.items}


def test_a_run_that_fails_is_marked_last_in_memory(tmp_path) -> None:
    """An error while logging: the run is FAILED with the error as a tag, ``abort`` the last call."""
    job = _job(tmp_path, extra=("tracking.traces=false",))

    class Broken(MemoryRunWriter):
        def log_results(self, run_id, results, model_id=None):  # fault injection
            raise RuntimeError("store went away")

    w = Recording(Broken())
    run_id, _ = start_run(w, job)
    with pytest.raises(RuntimeError, match="store went away"):
        execute(w, run_id, job, None)
    run = w.inner.store.get(run_id)
    assert run.status == "FAILED" and "store went away" in run.tags["error"]
    assert w.calls[-1] == "abort" and "end" not in w.calls


def test_traces_off_and_sampled_settings_reach_the_writer(tmp_path) -> None:
    """``tracking.traces=false`` and ``tracking.trace_sample`` arrive typed (``TraceSettings``)."""
    job = _job(tmp_path, extra=("tracking.traces=false",))
    assert job.setup.traces.enabled is False
    w = MemoryRunWriter()
    run_id, _ = start_run(w, job)
    execute(w, run_id, job, None)
    run = w.store.get(run_id)
    assert run.tags[TRACES_EXPECTED] == "0" and run.traces == [] and run.status == "FINISHED"

    job = _job(tmp_path / "b", extra=("tracking.trace_sample=3",))
    assert (job.setup.traces.sample, job.setup.traces.k) == (3, job.k)
    run_id, _ = start_run(w, job)
    execute(w, run_id, job, None)
    run = w.store.get(run_id)
    assert len(run.traces) == int(run.tags[TRACES_EXPECTED]) >= 3
    assert json.loads(run.tags[TRACES_SAMPLED])  # the sampling rule's record, as MLflow's writer tags it


def test_memory_writer_puts_a_sweep_job_under_one_parent(tmp_path) -> None:
    sweep = {"invocation": "inv1", "sweep_hash": "h" * 16, "sweep_id": "20260101-000000-inv1", "varying": []}
    job = _job(tmp_path, HydraContext(sweep=sweep, sweep_dir=str(tmp_path / "multirun")))
    w = MemoryRunWriter()
    a, parent_a = start_run(w, job)
    b, parent_b = start_run(w, job)
    assert parent_a == parent_b is not None and a != b
    assert {r.run_id for r in w.store.children(parent_a)} == {a, b}
    assert w.store.get(a).tags["sweep_id"] == sweep["sweep_id"] == w.store.get(parent_a).tags["sweep_id"]
    execute(w, a, job, parent_a)
    assert w.store.get(a).status == "FINISHED" and w.store.get(parent_a).status == "RUNNING"


def test_the_writers_name_the_same_trace_tags() -> None:
    assert TRACES_EXPECTED == tracking_writer.TRACES_EXPECTED
    assert TRACES_SAMPLED == tracking_traces.TRACES_SAMPLED
