"""A run is FINISHED only once its per-query artifact, traces and final checks exist (issue 22.1).

A kill -9 between the per-query table and the traces used to leave a FINISHED run with no traces,
which every later run then skipped for good.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlflow
from mlflow.tracking import MlflowClient

from rag_experiments.tracking import writer
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

ARGS = ("retriever=bm25", "generator=none")
# fault injection: the process kills itself (SIGKILL, nothing runs after) as the traces start
KILL_AT_TRACES = """
import os, runpy, signal
import rag_experiments.tracking.traces as traces
traces.write_records = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # both trace paths write through it
runpy.run_module("rag_experiments.sweep", run_name="__main__", alter_sys=True)
"""


def _runs(root):
    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    exp = client.get_experiment_by_name("test")
    return (
        client,
        exp.experiment_id,
        client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]),
    )


def test_kill_between_table_and_traces_leaves_no_finished_run_and_resume_reruns(tmp_path):
    docs, ev = make_tiny(tmp_path, n_items=3)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AT_TRACES, *sweep_args(tmp_path, docs, ev), *ARGS],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    client, _, (run,) = _runs(tmp_path)
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "per_query.parquet" in names, "the kill came after the per-query table was logged"
    assert run.info.status == "RUNNING", f"a run without its traces is {run.info.status}"
    assert run.data.tags[writer.TRACES_EXPECTED] == "3"

    again = run_sweep(tmp_path, *sweep_args(tmp_path, docs, ev), *ARGS)
    assert "[skip]" not in again.stdout, again.stdout[-2000:]
    client, exp_id, runs = _runs(tmp_path)
    assert [r.info.status for r in runs] == ["KILLED", "FINISHED"]
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    traces = mlflow.search_traces(locations=[exp_id], run_id=runs[1].info.run_id, return_type="list")
    assert len(traces) == 3 and json.loads(runs[1].data.tags["traces"])["n"] == 3


def _finished(client, exp_id, tags: dict[str, str], artifact: bool, tmp_path) -> str:
    rid = client.create_run(exp_id, tags={"config_hash": "h", "code_fingerprint": "f", **tags}).info.run_id
    if artifact:
        p = tmp_path / "per_query.parquet"
        p.write_bytes(b"x")
        client.log_artifact(rid, str(p))
    client.set_terminated(rid, "FINISHED")
    return rid


def test_resume_reruns_a_finished_run_without_its_table_or_traces(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/m.db")
    exp = client.create_experiment("x", artifact_location=(tmp_path / "a").as_uri())
    expect = {writer.TRACES_EXPECTED: "5"}
    cases = [  # (tags, per_query artifact, reason the run is not reused; "" = reused)
        ({**expect, "traces": json.dumps({"n": 5})}, False, "no per_query.parquet artifact"),
        (expect, True, "0 of 5 traces written"),
        ({**expect, "traces": json.dumps({"n": 4})}, True, "4 of 5 traces written"),
        ({}, True, "no traces recorded"),  # an older run: no traces_expected, no traces tag
        ({writer.TRACES_EXPECTED: "0"}, True, ""),  # tracking.traces=false
        ({**expect, "traces": json.dumps({"n": 5})}, True, ""),
    ]
    for tags, artifact, reason in cases:
        rid = _finished(client, exp, tags, artifact, tmp_path)
        done, why = writer.resume_decision(client, exp, "h", "f")
        if reason:
            assert done is None and f"run {rid} is FINISHED but incomplete ({reason})" in why, why
        else:
            assert done is not None and done.info.run_id == rid, why
        client.delete_run(rid)
