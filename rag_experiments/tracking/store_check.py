"""Is a SQLite tracking store's file intact? Asked where a lookup came back empty, so that garbage
in the pages of the runs table or its indexes reads as "store corrupt", not as "unknown run"
(issue 31 item 12). Standard library only at import, so any module can ask (no import cycle
through ``tracking.errors``). A new store is created here too, atomically (:func:`create_sqlite_store`).
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from pathlib import Path


def _path(uri: str) -> Path:
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:limit]


def sqlite_corruption(uri: str | None) -> str | None:
    """What SQLite's ``PRAGMA quick_check`` finds wrong with a ``sqlite:///`` store's file (its first
    line; "file is not a database" for garbage in the header), None when the check passes, the file
    does not exist or the store is not SQLite. Read-only, O(file size): asked only where a lookup
    came back empty, to tell "no such run" from "the page holding it is damaged"."""
    if not uri or not uri.startswith("sqlite:///"):
        return None
    path = _path(uri)
    if not path.is_file():
        return None
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            rows = con.execute("PRAGMA quick_check(5)").fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:  # a damaged header or schema page: not even readable
        return _first_line(e)
    # each row may start with "*** in database main ***" before the page it names
    lines = [ln for r in rows if r and r[0] != "ok" for ln in str(r[0]).splitlines() if not ln.startswith("***")]
    return lines[0][:200] if lines else None


def store_corrupt_message(uri: str | None, answer: str) -> str | None:
    """"store corrupt" instead of ``answer`` (e.g. "unknown run 'x'") when the sqlite store's file
    fails ``PRAGMA quick_check``; None when it passes (then ``answer`` stands)."""
    bad = sqlite_corruption(uri)
    if bad is None:
        return None
    return (
        f"store corrupt: tracking store {uri} (file {_path(uri).resolve()}) fails SQLite's integrity "
        f"check ({bad}), so {answer!r} may only mean the page holding it is damaged. Restore the file from a backup (`sqlite3 FILE .recover` "
        "salvages what is readable), or point --tracking-uri elsewhere."
    )


class HalfMigratedStore(OSError):
    """A sqlite store a process killed while creating it left half-migrated (exit 2, ``tracking.errors``:
    an ``OSError`` naming its file)."""


def _creating(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f".{path.name}.creating-*"))


def _mlflow_head() -> str:
    """The schema revision a complete store of the installed MLflow has (alembic's head of
    MLflow's own migration scripts)."""
    import mlflow
    from alembic.script import ScriptDirectory

    return str(ScriptDirectory(str(Path(mlflow.__file__).parent / "store" / "db_migrations")).get_current_head())


def half_migrated(path: Path) -> str | None:
    """Why the sqlite store at ``path`` is a creation that never finished (None when it is not):
    its schema revision is behind MLflow's and it holds no run. A store *with* runs at an older
    revision is an old store, left to MLflow (``mlflow db upgrade``)."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if not tables:
                return None  # an empty file: MLflow creates the schema in it
            version = con.execute("SELECT version_num FROM alembic_version").fetchone() if "alembic_version" in tables else None
            runs = con.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else 0
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return None  # not readable: the integrity check's to report
    head = _mlflow_head()
    if runs or (version is not None and version[0] == head):
        return None
    at = f"revision {version[0]}" if version else "no schema revision"
    return f"its schema stops at {at} of {head}, with {len(tables)} tables and no run"


def create_sqlite_store(uri: str | None) -> None:
    """Create a new ``sqlite:///`` store atomically, or refuse a half-created one.

    MLflow's migrations create some 40 tables one by one; a process killed among them (kill -9,
    a CI timeout) left a store every later start refused with "table … already exists". Here a new
    store is migrated in a temporary file beside it (``.NAME.creating-PID-…``) and renamed into place
    only when complete, so a kill leaves a temporary file (removed by the next creation) and never a
    half-created store. A store left half-created before this existed raises
    :class:`HalfMigratedStore` saying what to do. Call it under ``tracking.locks.store_lock``."""
    if not uri or not uri.startswith("sqlite:///") or ":memory:" in uri:
        return
    path = _path(uri)
    if path.is_file() and path.stat().st_size:
        if why := half_migrated(path):
            raise HalfMigratedStore(
                0,
                f"tracking store {uri} was left half-created by a process killed while creating it ({why}). "
                f"It holds no run: delete it (rm {path}) and run the same command again; the store is then "
                "created whole.",
                str(path.resolve()),
            )
        return
    for stale in _creating(path):  # a creation killed before us (we hold the store lock)
        stale.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own per attempt: MLflow keeps a store object per URI for the process
    tmp = path.with_name(f".{path.name}.creating-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    from mlflow import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)  # runs the migrations
    os.replace(tmp, path)
