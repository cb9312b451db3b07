"""Distributed sweeps: a real two-node Ray cluster (hydra/launcher=ray) and submitit's local executor.

Each config of the multirun runs in another process than the sweep's driver; the MLflow store
and the stage cache are shared through absolute paths (a shared filesystem on a real cluster).
The Ray nodes are started with ``ray start --block`` in their own process group, and only that
group is stopped afterwards (``ray stop`` would end every Ray on the machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.sweep_helpers import REPO, make_tiny, run_sweep, sweep_args

RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    # Ray workers are children of the node processes: they import our code from the same place
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _start_node(args: list[str], log: Path, timeout: float = 180) -> subprocess.Popen:
    """``ray start --block ARGS`` in a new process group; returns once the node is up."""
    out = open(log, "w")  # noqa: SIM115  (closed by the OS when the node ends)
    p = subprocess.Popen(
        [RAY, "start", "--block", "--disable-usage-stats", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=_env(),
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while "Ray runtime started" not in log.read_text():
        if p.poll() is not None or time.monotonic() > deadline:
            _stop(p)
            raise AssertionError(f"ray node did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    return p


def _stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGTERM)  # --block: the node stops what it started
        p.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def ray_cluster():
    tmp = Path(tempfile.mkdtemp(prefix="ray"))  # short: Ray puts Unix sockets in here
    port = _free_port()
    common = ["--num-cpus=1", "--object-store-memory=80000000"]
    head = _start_node(
        ["--head", f"--port={port}", f"--temp-dir={tmp}", "--include-dashboard=false", *common],
        tmp / "head.log",
    )
    try:
        worker = _start_node([f"--address=127.0.0.1:{port}", *common], tmp / "worker.log")
    except AssertionError:
        _stop(head)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    yield f"127.0.0.1:{port}"
    _stop(worker)
    _stop(head)
    shutil.rmtree(tmp, ignore_errors=True)


def _sweep_runs(root: Path):
    c = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    runs = c.search_runs([c.get_experiment_by_name("test").experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("is_parent") == "true"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


def _cache_files(root: Path, stage: str) -> int:
    return len(list((root / "cache" / stage).rglob("*.*")))


def test_ray_sweep_runs_each_config_as_a_task_on_a_two_node_cluster(ray_cluster, tmp_path):
    docs, ev = make_tiny(tmp_path)
    run_sweep(
        tmp_path,
        "-m",
        "chunking=fixed,markdown",
        "retriever.k=3,5",
        "retriever=bm25",  # retrieval only, no model to load: the launcher is what is tested
        "generator=none",
        "hydra/launcher=ray",
        f"hydra.launcher.ray.init.address={ray_cluster}",
        *sweep_args(tmp_path, docs, ev),
    )
    parents, children = _sweep_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4 and all(r.info.status == "FINISHED" for r in children)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    combos = {(r.data.params["chunking"], r.data.params["retriever.k"]) for r in children}
    assert combos == {("fixed", "3"), ("fixed", "5"), ("markdown", "3"), ("markdown", "5")}
    # one shared stage cache: 2 chunkings -> 2 chunk sets; k does not change the search depth
    assert _cache_files(tmp_path, "chunks") == 2 and _cache_files(tmp_path, "rankings") == 2


def test_submitit_local_sweep(tmp_path):
    docs, ev = make_tiny(tmp_path)
    run_sweep(
        tmp_path,
        "-m",
        "retriever.k=3,5",
        "retriever=bm25",
        "generator=none",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
        *sweep_args(tmp_path, docs, ev),
    )
    parents, children = _sweep_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
