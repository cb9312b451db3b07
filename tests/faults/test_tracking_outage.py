"""A tracking store that is away or broken: every CLI exits 2 (never 1, which ``gate`` uses for
"regressed") within the call budget, naming the store; a corrupted ``mlflow.db`` the same.

In-process through each CLI's ``main``; ``test_server_outage`` runs the sweep against a real
``mlflow server`` behind a proxy that goes away mid-run.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time

import pytest

from rag_experiments import spotcheck
from rag_experiments.cli import compare, gate
from rag_experiments.cli import select as select_cli
from rag_experiments.report import cli as report
from rag_experiments.tracking import bounds
from tests.sweep_helpers import free_port
from tests.test_spotcheck import store  # noqa: F401 - a hand-logged judged run in a real sqlite store

RUN = "0123456789abcdef0123456789abcdef"
CLIS = {
    "compare": (compare.main, [RUN, RUN]),
    "gate": (gate.main, ["--baseline", RUN, "--candidate", RUN]),
    "report": (report.main, [RUN, "--no-log"]),
    "select": (select_cli.main, ["sweep-x", "--metric", "hit_at_5"]),
    "spotcheck": (spotcheck.main, ["sample", RUN, "-n", "2"]),
}


@pytest.fixture
def mlflow_env(monkeypatch):
    """MLflow's HTTP variables restored after the test (the CLIs set them for their process)."""
    for key in (bounds.TIMEOUT, bounds.RETRIES, bounds.BACKOFF, bounds.JITTER, bounds.RETRY_AFTER):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return monkeypatch


def _run(name: str, uri: str, capsys) -> tuple[int, str, float]:
    fn, argv = CLIS[name]
    t0 = time.perf_counter()
    rc = fn(["--tracking-uri", uri, *argv] if name == "spotcheck" else [*argv, "--tracking-uri", uri])
    return rc, capsys.readouterr().err, time.perf_counter() - t0


@pytest.mark.parametrize("total", [1, 5, 10, 20, 30, 45, 60, 120, 600])
def test_the_budget_bounds_every_call(total):
    b = bounds.plan_budget(total)
    assert b.worst_case_s() <= max(total, 1) and b.timeout_s >= 1 and b.max_retries >= 0, b
    assert (total < 10) or b.max_retries >= 1  # a budget that allows it keeps retrying blips


def test_default_budget_is_at_most_60_s():
    b = bounds.plan_budget()
    assert b.worst_case_s() <= 60 and b.max_retries == 3, b


@pytest.mark.parametrize("name", list(CLIS))
def test_closed_port_exits_2_naming_the_server(name, mlflow_env, capsys):
    uri = f"http://127.0.0.1:{free_port()}"
    if name != "gate":  # gate with MLflow's variables as we set them; the others quicker
        mlflow_env.setenv(bounds.RETRIES, "1")
    rc, err, took = _run(name, uri, capsys)
    assert rc == 2, (name, rc, err[-2000:])
    assert f"tracking server {uri} is unreachable (connection refused)" in err, err[-2000:]
    assert "Traceback" not in err and took < 60, took
    if name != "gate":
        assert os.environ[bounds.RETRIES] == "1"  # a variable the user exported wins


def _garbage(db) -> None:
    db.write_bytes(os.urandom(64 * 1024))


def _scribbled(db) -> None:
    """The header kept, the pages after the first overwritten: SQLite reads the schema, then fails."""
    data = bytearray(db.read_bytes())
    data[4096:] = os.urandom(len(data) - 4096)
    db.write_bytes(bytes(data))


def _truncated(db) -> None:
    with open(db, "r+b") as f:
        f.truncate(4096 * 3)


@pytest.mark.parametrize("damage", [_garbage, _scribbled, _truncated], ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("name", ["compare", "gate", "report"])
def test_corrupted_mlflow_db_exits_2_naming_the_store(name, damage, store, tmp_path, mlflow_env, capsys):  # noqa: F811
    src_uri, _, rid = store
    db = tmp_path / "mlflow.db"
    shutil.copy(src_uri.removeprefix("sqlite:///"), db)
    assert sqlite3.connect(db).execute("pragma integrity_check").fetchone() == ("ok",)
    damage(db)
    uri = f"sqlite:///{db}"
    fn, argv = CLIS[name]
    argv = [rid if a == RUN else a for a in argv]
    rc = fn([*argv, "--tracking-uri", uri])
    err = capsys.readouterr().err
    assert rc == 2, (name, rc, err[-3000:])
    assert f"tracking store {uri} (file {db})" in err and "cannot be read" in err, err[-3000:]
    assert "Traceback" not in err


class FlakyProxy:
    """A TCP proxy to a real tracking server that goes away when a request matches ``trigger``:
    ``refuse`` resets every connection from then on, ``hang`` accepts and never answers."""

    def __init__(self, upstream: str, trigger: bytes, mode: str):
        import re
        import socket
        import threading

        self.upstream = int(upstream.rsplit(":", 1)[1])
        self.trigger, self.mode = re.compile(trigger), mode
        self.down = threading.Event()
        self.held: list = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _fail(self, conn) -> None:
        import socket
        import struct

        if self.mode == "hang":
            self.held.append(conn)
            return
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
        conn.close()

    def _serve(self, conn) -> None:
        import socket
        import threading

        if self.down.is_set():
            return self._fail(conn)
        up = socket.create_connection(("127.0.0.1", self.upstream))
        threading.Thread(target=_pump, args=(up, conn), daemon=True).start()
        while True:
            try:
                data = conn.recv(1 << 16)
            except OSError:
                data = b""
            if data and self.trigger.search(data):
                self.down.set()
            if self.down.is_set():
                up.close()
                return self._fail(conn)
            if not data:
                up.close()
                return
            up.sendall(data)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


def _pump(src, dst) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass


METRICS_BATCH = rb'"metrics":\s*\[\s*\{'  # log_results' first call: the run exists, its work is done


def _sweep(root, uri: str, *extra: str):
    import subprocess
    import sys

    from tests.sweep_helpers import make_tiny, sweep_args

    docs, ev = make_tiny(root, n_items=3)
    args = [a for a in sweep_args(root, docs, ev) if not a.startswith(("tracking.", "experiment_name"))]
    args += [] if any(a.startswith("experiment_name") for a in extra) else ["experiment_name=test"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for key in ("MLFLOW_TRACKING_URI", bounds.TIMEOUT, bounds.RETRIES, bounds.BACKOFF):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "rag_experiments.sweep", "generator=none", "retriever=bm25", *args]
    cmd += [f"tracking.uri={uri}", "tracking.artifact_root=null", "tracking.traces=false", *extra]
    return subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One real ``mlflow server`` for the outage cases (each uses its own experiment)."""
    from tests.mlflow_ui import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("server")) as base:
        yield base


def test_server_outage_mid_run_exits_2_and_the_next_start_heals(tmp_path, server):
    from mlflow.tracking import MlflowClient

    base = server
    proxy = FlakyProxy(base, METRICS_BATCH, "refuse")
    p = _sweep(tmp_path, proxy.url)
    out, err = p.communicate(timeout=240)
    assert p.returncode == 2, (p.returncode, err[-3000:])
    assert f"tracking server {proxy.url} is unreachable" in err and "Traceback" not in err, err[-3000:]
    proxy.close()
    runs = MlflowClient(base).search_runs([MlflowClient(base).get_experiment_by_name("test").experiment_id])
    assert [r.info.status for r in runs] == ["RUNNING"]  # the store was away: nothing could mark it
    again = _sweep(tmp_path, base)
    out, err = again.communicate(timeout=240)
    assert again.returncode == 0, err[-3000:]
    assert f"[healed] run {runs[0].info.run_id}" in out, out[-3000:]
    client = MlflowClient(base)
    assert client.get_run(runs[0].info.run_id).info.status == "KILLED"


def test_sigterm_while_the_server_hangs_ends_promptly(tmp_path, server):
    import signal

    base = server
    proxy = FlakyProxy(base, METRICS_BATCH, "hang")
    p = _sweep(tmp_path, proxy.url, "experiment_name=sigterm")
    deadline = time.monotonic() + 240
    while not proxy.down.is_set() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proxy.down.is_set(), p.communicate()[1][-3000:]
    time.sleep(2)  # inside the first request's 13 s timeout, before any retry
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    took = time.monotonic() - t0
    proxy.close()
    assert p.returncode != 0 and took < 30, (took, err[-3000:])  # before: 120 s per try, 8 tries
    assert "could not mark run" in err, err[-3000:]
