"""Healing in-process on a real sqlite store: latest FINISHED child per config, stale RUNNING
runs, the parent's status from its configs, the early-exit guard, prompt abort of generation,
an all-errors run that must not be skippable, and a secret that must not leak."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.run.multirun import _SweepGuard
from rag_experiments.run.steps import StepRecord, failure_reason
from rag_experiments.stages.generation import OpenAICompatibleGenerator
from rag_experiments.tracking import writer
from rag_experiments.tracking.runs import sweep_children
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("heal")
    uri = f"sqlite:///{root}/mlflow.db"
    client = writer.open_store(uri)
    return uri, client, writer.get_experiment_id(client, "heal", str(root / "mlruns"))


def _sweep(client, exp, sweep_hash: str) -> tuple[str, str]:
    ctx = {"sweep_hash": sweep_hash, "invocation": sweep_hash + "-inv", "overrides": []}
    return writer.get_or_create_parent(client, exp, ctx, force=False)


def _child(client, exp, parent: tuple[str, str], chash: str, status: str | None, runner: str = "") -> str:
    tags = {"config_hash": chash, "mlflow.parentRunId": parent[0], "sweep_id": parent[1]}
    if runner:
        tags["runner"] = runner
    rid = writer.start_child(client, exp, f"cfg-{chash}", tags, {"x": "1"})
    if status:
        client.set_terminated(rid, status)
    return rid


def _dead_runner() -> str:
    pid = 4_000_000  # above pid_max on Linux: never a live process
    return f"{socket.gethostname()}:{pid}"


def test_sweep_children_are_the_latest_finished_run_per_config(store):
    _, client, exp = store
    parent = _sweep(client, exp, "children")
    _child(client, exp, parent, "a", "KILLED")
    time.sleep(0.01)
    a2 = _child(client, exp, parent, "a", "FINISHED")
    b = _child(client, exp, parent, "b", "FINISHED")
    _child(client, exp, parent, "c", None, _dead_runner())  # kill -9: no per_query table, RUNNING
    _child(client, exp, parent, "d", "FAILED")
    assert [r.info.run_id for r in sweep_children(client, parent[1])] == [a2, b]


def test_stale_running_runs_are_killed_live_ones_left_alone(store):
    _, client, exp = store
    parent = _sweep(client, exp, "stale")
    dead = _child(client, exp, parent, "s", None, _dead_runner())
    live = _child(client, exp, parent, "s", None, f"{socket.gethostname()}:{os.getppid()}")
    other_host = _child(client, exp, parent, "s", None, "elsewhere.example:1")
    assert writer.heal_stale_runs(client, exp, "s") == [dead]
    assert client.get_run(dead).info.status == "KILLED" and client.get_run(dead).data.tags["healed"]
    assert {client.get_run(r).info.status for r in (live, other_host)} == {"RUNNING"}


@pytest.mark.parametrize(
    "children,complete,interrupted,expected",
    [
        ([("a", "FINISHED"), ("b", "FINISHED")], True, "", "FINISHED"),
        ([("a", "KILLED"), ("a", "FINISHED"), ("b", "FINISHED")], True, "", "FINISHED"),  # healed by a re-run
        ([("a", "FINISHED"), ("b", "FAILED")], True, "", "FAILED"),
        ([("a", "FINISHED")], False, "SIGTERM", "KILLED"),
        ([("a", "FINISHED")], False, "", "FAILED"),  # a job exited 2 mid-sweep
    ],
)
def test_parent_status_reflects_its_configs(store, children, complete, interrupted, expected):
    _, client, exp = store
    parent = _sweep(client, exp, f"status-{expected}-{len(children)}-{complete}")
    for chash, status in children:
        _child(client, exp, parent, chash, status)
    assert writer.close_parent(client, exp, parent[0], complete, interrupted) == expected
    assert client.get_run(parent[0]).info.status == expected


def test_rerun_reopens_a_killed_parent(store):
    _, client, exp = store
    first = _sweep(client, exp, "reopen")
    client.set_terminated(first[0], "KILLED")
    again = _sweep(client, exp, "reopen")
    assert again == first and client.get_run(first[0]).info.status == "RUNNING"


def test_guard_closes_a_parent_left_running_between_jobs(store):
    uri, client, exp = store
    parent = _sweep(client, exp, "guard")
    _child(client, exp, parent, "g", "FINISHED")
    guard = _SweepGuard(uri, "heal", "guard-inv")
    guard.interrupted = "SIGTERM"
    guard.on_exit()
    assert client.get_run(parent[0]).info.status == "KILLED"
    assert client.get_run(parent[0]).data.tags["killed_by"] == "SIGTERM"


def test_sweep_context_is_a_file_in_the_sweep_dir(tmp_path):
    ctx = {"sweep_hash": "h", "invocation": "i", "overrides": ["a=1"]}
    writer.write_sweep_context(tmp_path, ctx)
    assert writer.read_sweep_context(tmp_path) == ctx
    assert writer.read_sweep_context(tmp_path / "other") is None and writer.read_sweep_context(None) is None
    assert "RAG_EXPERIMENTS_SWEEP" not in os.environ


def test_every_item_failed():
    assert failure_reason({"generator": StepRecord("generator", 3, 3)})
    assert not failure_reason({"generator": StepRecord("generator", 3, 2)})
    assert not failure_reason({"generator": StepRecord("generator", 0, 0)})  # asked nothing: nothing failed


@pytest.mark.parametrize("lands_on", ["process", "another thread"])
def test_interrupt_aborts_in_flight_requests_promptly(lands_on):
    """Ctrl-C during generation ends it within seconds, not after the timeouts. The kernel hands a
    process-directed signal to any thread: "another thread" sends it to the timer thread itself,
    which the main thread, blocked waiting for its workers, only notices because it waits in
    slices (core.parallel.POLL_S); it waited out every timeout once under pytest-xdist."""
    # an endpoint that accepts and never answers: before, Ctrl-C/SIGTERM waited for the timeouts
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: [held.append(srv.accept()[0]) for _ in range(16)], daemon=True).start()
    gen = OpenAICompatibleGenerator(
        base_url=f"http://127.0.0.1:{srv.getsockname()[1]}/v1",
        model="m",
        api_key_env="X",
        timeout_s=15,
        max_retries=2,
        concurrency=4,
    )
    sent: list[float] = []

    def ctrl_c():  # a real signal, as Ctrl-C or a CI cancel (SIGTERM is mapped to the same)
        sent.append(time.perf_counter())
        if lands_on == "process":
            os.kill(os.getpid(), signal.SIGINT)
        else:
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    threading.Timer(0.5, ctrl_c).start()
    with pytest.raises(KeyboardInterrupt):
        gen.generate([[{"role": "user", "content": "hi"}]] * 8)
    assert time.perf_counter() - sent[0] < 3.0, "waited for in-flight requests (timeout_s=15)"
    assert gen.complete([{"role": "user", "content": "x"}]).error.startswith("aborted")
    srv.close()


def test_dead_endpoint_run_is_failed_retried_and_the_key_never_stored(tmp_path):
    key = "sk-test-DoNotLeak-8c1f0e9a7b6d5c4e3f2a1b0c"
    docs, ev = make_tiny(tmp_path, n_items=2)
    args = [
        "generator=openai",
        "generator.base_url=http://127.0.0.1:9/v1",
        "generator.api_key_env=RAG_FAULTS_KEY",
        "generator.timeout_s=1",
        "retriever=bm25",
        "generator.max_retries=0",
        "judge=heuristic",
        *sweep_args(tmp_path, docs, ev),
    ]
    os.environ["RAG_FAULTS_KEY"] = key
    try:
        first = run_sweep(tmp_path, *args, check=False)
    finally:
        del os.environ["RAG_FAULTS_KEY"]
    assert first.returncode == 1 and "marked FAILED so a re-run retries it" in first.stderr, first.stderr[
        -2000:
    ]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp_id = client.get_experiment_by_name("test").experiment_id
    runs = client.search_runs([exp_id])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert "queries errored" in runs[0].data.tags["failure_reason"]
    assert writer.find_finished(client, exp_id, runs[0].data.tags["config_hash"]) is None  # not skippable
    assert key not in first.stdout + first.stderr
    leaked = [f for f in Path(tmp_path).rglob("*") if f.is_file() and key.encode() in f.read_bytes()]
    assert not leaked, leaked
    assert json.loads(runs[0].data.tags["model_calls"])  # the generator was really called


def test_joblib_workers_get_the_sweep_context_from_the_sweep_dir(tmp_path):
    # the context used to travel in os.environ, which worker processes do not necessarily share
    docs, ev = make_tiny(tmp_path, n_items=3)
    args = [a for a in sweep_args(tmp_path, docs, ev) if not a.startswith("hydra.sweep.dir")]
    grid = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "retriever=bm25", "retriever.k=1,2"]
    run_sweep(tmp_path, *grid, "generator=none", *args)
    (ctx_file,) = (tmp_path / "multirun").rglob(".sweep.json")
    ctx = json.loads(ctx_file.read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("is_parent") == "true"]
    assert parent.data.tags["sweep_invocation"] == ctx["invocation"] and parent.info.status == "FINISHED"
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(kids) == 2 and len({r.data.tags["runner"] for r in kids}) >= 1
