"""A PostgreSQL tracking store that is away: bounded, exit 2, the URI named with its password redacted.

libpq waits for a host that does not answer without limit, and MLflow retries creating its engine
10 times (≈ 100 s of backoff) even on a refused connection. ``tracking.uri.tracking_uri`` adds
``connect_timeout`` (from the tracking budget) to PostgreSQL URIs and reaches the store once first.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from rag_experiments.tracking import bounds, uri
from tests.sweep_helpers import free_port, make_tiny, run_sweep, sweep_args

PASSWORD = "s3cr3t-pw"
RUN = "0123456789abcdef0123456789abcdef"


def _pg(port: int) -> str:
    return f"postgresql+psycopg2://mlflow:{PASSWORD}@127.0.0.1:{port}/mlflow"  # the driver we ship


@pytest.fixture
def mlflow_env(monkeypatch):
    """MLflow's HTTP variables unset during the test and restored after it (``bound_tracking_calls``
    writes them to ``os.environ``; a leftover would look exported by the user to a subprocess)."""
    for key in (bounds.TIMEOUT, bounds.RETRIES, bounds.BACKOFF, bounds.JITTER, bounds.RETRY_AFTER):
        monkeypatch.setenv(key, "")  # recorded, so the teardown restores the value from before
        monkeypatch.delenv(key)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return monkeypatch


@pytest.fixture
def silent_host():
    """A TCP port that accepts connections and never answers: a host that went away mid-handshake
    (what a blackholed address does, without depending on this machine's routing)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held, stop = [], threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except TimeoutError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def test_connect_timeout_added_to_postgresql_uris_only(mlflow_env):
    assert uri.with_connect_timeout(_pg(5432), 13) == _pg(5432) + "?connect_timeout=13"
    kept = "postgresql+psycopg2://u:p%40ss@db:5432/m?sslmode=require&connect_timeout=3"
    assert uri.with_connect_timeout(kept, 13) == kept  # the user's own value wins
    assert uri.with_connect_timeout("postgresql://u:p%40ss@db/m?sslmode=require", 1) == (
        "postgresql://u:p%40ss@db/m?sslmode=require&connect_timeout=2"  # libpq's minimum
    )
    for other in ("sqlite:///mlflow.db", "http://127.0.0.1:5000", "mysql://u:p@db/m"):
        assert uri.with_connect_timeout(other, 13) == other
    bounds.bound_tracking_calls(60)  # the default budget: 13 s per request
    assert uri.with_connect_timeout(_pg(1)).endswith("connect_timeout=13")
    mlflow_env.setenv(bounds.TIMEOUT, "7")  # exported by the user: wins
    assert uri.with_connect_timeout(_pg(1)).endswith("connect_timeout=7")


COMPARE = """
import sys
from rag_experiments.cli import compare
sys.exit(compare.main([sys.argv[1], sys.argv[1], "--tracking-uri", sys.argv[2]]))
"""


def _compare(store: str, env: dict[str, str]) -> tuple[int, str, float]:
    """``compare`` in a subprocess (a hang before the fix must not hang the test run)."""
    import os

    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-c", COMPARE, RUN, store],
        env={**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, **env},
        capture_output=True,
        text=True,
        timeout=90,
    )
    return p.returncode, p.stderr, time.perf_counter() - t0


def _named_and_redacted(err: str, port: int) -> None:
    assert "tracking store postgresql+psycopg2://mlflow:" in err and f"127.0.0.1:{port}/mlflow" in err, err[
        -2000:
    ]
    assert "is unreachable" in err and "Traceback" not in err, err[-2000:]
    assert PASSWORD not in err


def test_closed_port_exits_2_at_once(mlflow_env):
    """Refused: one try, no engine retries (MLflow alone: ≈ 100 s)."""
    port = free_port()
    rc, err, took = _compare(_pg(port), {})
    assert rc == 2, err[-2000:]
    _named_and_redacted(err, port)
    assert "Connection refused" in err and took < 30, took


def test_silent_host_exits_2_within_the_connect_timeout(silent_host, mlflow_env):
    """A host that never answers: libpq gives up after ``connect_timeout`` (here the exported
    per-request timeout, 2 s), not never."""
    rc, err, took = _compare(_pg(silent_host), {bounds.TIMEOUT: "2"})
    assert rc == 2, err[-2000:]
    _named_and_redacted(err, silent_host)
    assert "timeout expired" in err and "connect_timeout=2" in err, err[-2000:]
    assert took < 30, took


def test_sweep_on_a_silent_host_exits_2_before_any_run(tmp_path, silent_host, mlflow_env):
    """The sweep: ``tracking.timeout_s`` 5 → connect_timeout 5; exit 2 naming the store, and no
    run was started (the store never accepted a connection, so nothing can be left RUNNING; the
    stage work ran first, as with any store error)."""
    docs, ev = make_tiny(tmp_path, n_items=3)
    args = [a for a in sweep_args(tmp_path, docs, ev) if not a.startswith("tracking.uri=")]
    t0 = time.perf_counter()
    p = run_sweep(
        tmp_path, *args, f"tracking.uri={_pg(silent_host)}", "tracking.timeout_s=5", "generator=none",
        check=False, timeout=300,
    )  # fmt: skip
    took = time.perf_counter() - t0
    err = p.stdout + p.stderr
    assert p.returncode == 2, err[-3000:]
    _named_and_redacted(err, silent_host)
    assert "connect_timeout=5" in err and "[run" not in p.stdout and "== " not in p.stdout
    assert took < 240, took
