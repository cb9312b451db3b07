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

from rag_experiments import compare, gate, spotcheck
from rag_experiments import select as select_cli
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
