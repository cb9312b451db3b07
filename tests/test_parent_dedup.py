"""One sweep parent across hosts: the tracking store, not a local lock, decides which one.

Each "host" is its own lock directory (``tempfile.tempdir``) and its own client on one shared
store. The worst case is injected (the only mocks here): host B's search for a parent ran before
host A's insert landed, and B's clock is a minute behind, so B's parent, created after A's child
was attached to A's, is the earlier one and wins. Two real processes racing without injection
check the same end state on sqlite and on the PostgreSQL-backed server.
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
from pathlib import Path

from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from rag_experiments.tracking import writer as tracking
from rag_experiments.tracking.parents import settle_parent, start_sweep_child
from tests.test_server import mlflow_server  # noqa: F401  (session fixture: the real server)

SWEEP = {"sweep_hash": "h" * 16, "invocation": "inv0123456789", "sweep_id": "20260101-000000-inv012"}


def _job(client: MlflowClient, exp_id: str, name: str, sweep: dict = SWEEP) -> tuple[str, str]:
    """What ``sweep.start_run`` does for one job of the multirun (child tags kept minimal)."""

    def child(parent_id: str, sweep_id: str) -> str:
        tags = {"mlflow.parentRunId": parent_id, "sweep_id": sweep_id, "config_hash": name}
        return tracking.start_child(client, exp_id, name, tags, {"job": name})

    return start_sweep_child(client, exp_id, sweep, False, child)


def _end_state(client: MlflowClient, exp_id: str):
    live = client.search_runs([exp_id], max_results=100)
    parents = [r for r in live if r.data.tags.get("is_parent") == "true"]
    children = [r for r in live if r.data.tags.get("is_parent") != "true"]
    return parents, children


def test_a_later_parent_that_wins_takes_every_child(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = tracking.open_store(uri)
    exp_id = tracking.get_experiment_id(client, "test", None)
    host_a, host_b = tmp_path / "host_a", tmp_path / "host_b"

    monkeypatch.setattr(tempfile, "tempdir", str(host_a))
    child_a1, parent_a = _job(client, exp_id, "a1")
    assert client.get_run(child_a1).data.tags["mlflow.parentRunId"] == parent_a

    # host B: its search saw no parent (A's insert not visible yet) and its clock is 60 s behind
    monkeypatch.setattr(tempfile, "tempdir", str(host_b))
    client_b = MlflowClient(tracking_uri=uri)
    real_search = client_b.search_runs
    stale = {"left": 2}  # get_or_create_parent's two searches (by invocation, by sweep_hash)

    def search(*args, **kwargs):
        if stale["left"] and "tags.sweep_" in kwargs.get("filter_string", ""):
            stale["left"] -= 1
            return []
        return real_search(*args, **kwargs)

    monkeypatch.setattr(client_b, "search_runs", search)
    import mlflow.tracking._tracking_service.client as service

    now = service.get_current_time_millis
    monkeypatch.setattr(service, "get_current_time_millis", lambda: now() - 60_000)
    child_b1, parent_b = _job(client_b, exp_id, "b1")
    monkeypatch.setattr(service, "get_current_time_millis", now)
    assert parent_b != parent_a, "the injected race made a second parent"

    # the earlier parent (B's) won: A's child moved to it, A's parent deleted and says why
    assert client.get_run(child_a1).data.tags["mlflow.parentRunId"] == parent_b
    loser = client.get_run(parent_a)
    assert loser.info.lifecycle_stage == "deleted" and loser.data.tags["superseded_by"] == parent_b
    # later jobs on either host adopt it
    monkeypatch.setattr(tempfile, "tempdir", str(host_a))
    assert _job(client, exp_id, "a2")[1] == parent_b
    assert _job(client_b, exp_id, "b2")[1] == parent_b
    assert settle_parent(client, exp_id, SWEEP["invocation"]) == parent_b  # the driver's last pass

    parents, children = _end_state(client, exp_id)
    assert [p.info.run_id for p in parents] == [parent_b]
    assert sorted(c.info.run_name for c in children) == ["a1", "a2", "b1", "b2"]
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent_b}
    assert {c.data.tags["sweep_id"] for c in children} == {SWEEP["sweep_id"]}
    deleted = client.search_runs([exp_id], run_view_type=ViewType.DELETED_ONLY)
    assert [r.info.run_id for r in deleted] == [parent_a]


def _host(uri: str, experiment: str, lock_dir: str, names: list[str], barrier, out) -> None:
    """One host: its own lock directory, its own client; its jobs start together with the other's."""
    tempfile.tempdir = lock_dir
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.get_experiment_by_name(experiment).experiment_id
    barrier.wait()
    out.put([_job(client, exp_id, n) for n in names])


def _two_hosts(uri: str, experiment: str, tmp: Path) -> None:
    client = tracking.open_store(uri)
    exp_id = tracking.get_experiment_id(client, experiment, None)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_host, args=(uri, experiment, str(tmp / h), [f"{h}1", f"{h}2"], barrier, out))
        for h in ("a", "b")
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    winner = settle_parent(client, exp_id, SWEEP["invocation"])  # the driver, after the last job
    parents, children = _end_state(client, exp_id)
    assert [p.info.run_id for p in parents] == [winner]
    assert len(children) == 4 and {c.data.tags["mlflow.parentRunId"] for c in children} == {winner}
    assert {r[1] for rs in results for r in rs} <= {winner} | {
        r.info.run_id for r in client.search_runs([exp_id], run_view_type=ViewType.DELETED_ONLY)
    }


def test_two_processes_with_separate_lock_dirs_sqlite(tmp_path):
    _two_hosts(f"sqlite:///{tmp_path}/mlflow.db", "test", tmp_path)


def test_two_processes_with_separate_lock_dirs_server(mlflow_server, tmp_path):  # noqa: F811
    _two_hosts(mlflow_server["uri"], f"dedup-{tmp_path.name}", tmp_path)
