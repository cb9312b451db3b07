"""Issue 31 item 12: "garbage pages in mlflow.db → 'unknown run' instead of 'store corrupt'".

A real sqlite store whose runs table, or one of the indexes a run is looked up through (its
primary key, the tags/params/latest-metrics indexes), holds a page of garbage: SQLite answers the
lookup with nothing (or an error the run lookup swallowed), and ``compare`` / ``gate`` / ``report``
said "unknown run". They now say "store corrupt", naming the file and what SQLite's
``PRAGMA quick_check`` found, exit 2. A damaged header or schema page was already "cannot be read"
(``test_tracking_outage.py``); an intact store still answers "unknown run" for an unknown id.
"""

from __future__ import annotations

import random
import shutil
import sqlite3

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from rag_experiments.cli import compare, gate
from rag_experiments.report import cli as report

CLIS = {"compare": compare.main, "gate": gate.main, "report": report.main}


def _argv(name: str, a: str, b: str, uri: str) -> list[str]:
    args = {"compare": [a, b], "gate": ["--baseline", a, "--candidate", b], "report": [a, "--no-log"]}[name]
    return [*args, "--tracking-uri", uri]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store with 12 finished runs (tags, params, metrics), so each table spans its own pages."""
    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.create_experiment("pages")
    ids = []
    for i in range(12):
        run = client.create_run(
            exp, run_name=f"config-{i}", tags={"sweep_id": "s1", "config_hash": f"{i:040d}"}
        )
        rid = run.info.run_id
        client.log_batch(
            rid,
            metrics=[Metric(f"m{k}", 0.5, 0, 0) for k in range(20)],
            params=[Param(f"p{k}", "v" * 60) for k in range(20)],
        )
        client.set_terminated(rid)
        ids.append(rid)
    con = sqlite3.connect(db)
    pages: dict[str, list[int]] = {}
    for name, pageno in con.execute("SELECT name, pageno FROM dbstat"):
        pages.setdefault(name, []).append(pageno)
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    return db, ids, pages, page_size


def _damaged_copy(store, obj: str, dest) -> str:
    """A copy of the store with every page of ``obj`` (a table or index) overwritten by garbage."""
    db, _, pages, page_size = store
    shutil.copy(db, dest)
    rnd = random.Random(obj)
    with open(dest, "r+b") as f:
        for p in pages[obj]:
            f.seek((p - 1) * page_size)
            f.write(rnd.randbytes(page_size))
    return f"sqlite:///{dest}"


DAMAGED = [
    "runs",
    "sqlite_autoindex_runs_1",
    "index_tags_run_uuid",
    "index_params_run_uuid",
    "index_latest_metrics_run_uuid",
]


@pytest.mark.parametrize("obj", DAMAGED)
@pytest.mark.parametrize("name", list(CLIS))
def test_garbage_in_the_runs_pages_is_store_corrupt_not_unknown_run(name, obj, store, tmp_path, capsys):
    _, ids, _, _ = store
    uri = _damaged_copy(store, obj, tmp_path / "mlflow.db")
    rc = CLIS[name](_argv(name, ids[0], ids[-1], uri))
    err = capsys.readouterr().err
    assert rc == 2, (rc, err[-2000:])
    assert "unknown run" not in err or "error: store corrupt:" in err, err[-2000:]
    assert f"(file {tmp_path / 'mlflow.db'})" in err and (
        "store corrupt" in err or "cannot be read" in err
    ), err
    assert "Traceback" not in err


def test_an_intact_store_still_answers_unknown_run(store, tmp_path, capsys):
    db, ids, _, _ = store
    shutil.copy(db, tmp_path / "mlflow.db")
    rc = compare.main(_argv("compare", "f" * 32, ids[0], f"sqlite:///{tmp_path / 'mlflow.db'}"))
    err = capsys.readouterr().err
    assert rc == 2 and f"unknown run '{'f' * 32}'" in err and "corrupt" not in err, err
