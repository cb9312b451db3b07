"""A store that survives a kill during its creation (issue 42, item 8): a new sqlite store is
migrated in a temporary file and renamed into place; one left half-created before that is refused
with what to do (exit 2), never "table … already exists" at every start."""

from __future__ import annotations

import sqlite3

import pytest

from rag_experiments.tracking.errors import infrastructure_error
from rag_experiments.tracking.store_check import HalfMigratedStore, create_sqlite_store, half_migrated


def _half_created(path, tables=("alembic_version", "experiments", "trace_info")) -> None:
    """What a kill among MLflow's first migrations leaves: some tables, an early revision, no run."""
    con = sqlite3.connect(path)
    for t in tables:
        con.execute(f"CREATE TABLE {t} (x)")
    con.execute("DROP TABLE alembic_version")
    con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32))")
    con.execute("INSERT INTO alembic_version VALUES ('451aebb31d03')")
    con.commit()
    con.close()


def test_a_half_created_store_is_refused_saying_what_to_do(tmp_path):
    db = tmp_path / "mlflow.db"
    _half_created(db)
    assert "revision 451aebb31d03" in half_migrated(db)
    with pytest.raises(HalfMigratedStore) as e:
        create_sqlite_store(f"sqlite:///{db}")
    message = infrastructure_error(e.value)  # what the CLI prints, exit 2
    assert message and "half-created" in message and f"rm {db}" in message and str(db.resolve()) in message


def test_an_old_store_with_runs_is_left_to_mlflow(tmp_path):
    db = tmp_path / "mlflow.db"
    _half_created(db, tables=("alembic_version", "runs"))
    con = sqlite3.connect(db)
    con.execute("INSERT INTO runs VALUES (1)")
    con.commit()
    con.close()
    assert half_migrated(db) is None  # runs in it: an older schema, `mlflow db upgrade`'s business


@pytest.mark.slow  # runs MLflow's migrations
def test_a_new_store_is_created_whole_and_a_killed_creation_leaves_no_store(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    db = tmp_path / "mlflow.db"
    killed = tmp_path / ".mlflow.db.creating-999999"  # a creation killed mid-migration
    _half_created(killed)

    def kill(*a, **k):
        raise KeyboardInterrupt("killed during the migrations")

    with monkeypatch.context() as m:
        m.setattr(MlflowClient, "search_experiments", kill)
        with pytest.raises(KeyboardInterrupt):
            create_sqlite_store(f"sqlite:///{db}")
    assert not db.exists()  # never a half-created store where the next start looks
    create_sqlite_store(f"sqlite:///{db}")
    assert db.is_file() and half_migrated(db) is None
    assert not list(tmp_path.glob(".mlflow.db.creating-*"))  # the killed creations' files removed
    assert MlflowClient(tracking_uri=f"sqlite:///{db}").get_experiment("0").name == "Default"
