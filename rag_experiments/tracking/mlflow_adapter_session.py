"""MLflow internals, third concern: the process around the store. A SQL connection a signal left
mid-transaction is released before cleanup writes (:func:`release_interrupted_connections`), and
MLflow's prompt-to-experiment link threads are joined and their lost insert races quieted
(:func:`wait_for_prompt_link_threads`, :func:`quiet_lost_prompt_link_races`; docs/reliability.md).

Checked against the MLflow versions in ``tracking.mlflow_adapter.VERIFIED``. Private names of
MLflow live in the ``tracking/mlflow_adapter*.py`` modules only.
"""

from __future__ import annotations

import time

from mlflow.tracing.client import TracingClient

# ------------------------------------------------------------------------------ after an interrupt


def release_interrupted_connections(tracking_uri: str, exc: BaseException | None = None) -> None:
    """Let cleanup write to a SQL store that a signal interrupted mid-transaction.

    Ctrl-C / SIGTERM raised inside a store call (e.g. in SQLite's commit) can leave that call's
    connection checked out with its transaction open — on SQLite holding the database's write lock,
    so cleanup's "mark KILLED" fails with "database is locked". The interrupt's frames keep that
    connection alive: cleared (the traceback's text survives) and collected, it rolls back; the
    store's engine is then disposed. ``exc``: default the exception being handled (atexit cleanups
    run from the CLI's ``except KeyboardInterrupt``), else ``sys.last_value``.

    A connection still holding a transaction after that (kept alive by a reference the interrupt
    did not own) is rolled back directly: at this point every open SQLite transaction of this
    process is one a signal abandoned (a CI run left a sweep's parent RUNNING that way)."""
    import gc
    import sqlite3
    import sys
    import traceback

    seen: set[int] = set()
    e: BaseException | None = exc or sys.exc_info()[1] or getattr(sys, "last_value", None)
    while e is not None and id(e) not in seen:  # the interrupt and what it interrupted
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__context__ or e.__cause__
    gc.collect()
    for obj in gc.get_objects():
        if isinstance(obj, sqlite3.Connection):
            try:
                if obj.in_transaction:
                    obj.rollback()
            except sqlite3.Error:  # closed, or owned by another thread: nothing this cleanup can do
                pass
    try:
        engine = getattr(TracingClient(tracking_uri).store, "engine", None)
    except Exception:  # noqa: BLE001 - no store to release (e.g. unreachable): cleanup says so
        return
    if engine is not None:
        engine.dispose()


# ------------------------------------------------------------------------------ MLflow's prompt link thread

#: MLflow 3.17.2's ``register_prompt`` (and ``load_prompt``) links the prompt to the active
#: experiment in a thread of this name: a read, then a write of the prompt's
#: ``_mlflow_experiment_ids`` tag, outside any lock of ours.
PROMPT_LINK_THREAD = "link_prompt_to_experiment_thread-"
_quieted: set[str] = set()


def wait_for_prompt_link_threads(timeout_s: float = 30.0) -> None:
    """Join MLflow's prompt→experiment link threads (bounded by ``timeout_s`` in all). Called under
    our per-prompt host lock right after ``register_prompt``, so the thread's write of the tag
    can no longer interleave with ours or with another job's (issue 31 item 12: its lost insert
    race was logged as a UNIQUE-constraint warning with an SQL dump)."""
    import threading

    deadline = time.monotonic() + timeout_s
    for t in threading.enumerate():
        if t.name.startswith(PROMPT_LINK_THREAD) and t is not threading.current_thread():
            t.join(max(0.0, deadline - time.monotonic()))


def quiet_lost_prompt_link_races() -> None:
    """Drop MLflow's "Failed to tag prompt … UNIQUE constraint failed … [SQL: …]" warning (its link
    thread lost the tag's insert race to another writer, e.g. a job on another host). Nothing is
    lost: ``prompt_links.link_prompt_to_experiment`` writes the link after it, re-read and retried.
    Any other failure of the thread is still shown."""
    import logging

    from rag_experiments.tracking.prompt_links import lost_insert_race

    name = "mlflow.tracking.client"
    if name in _quieted:
        return

    def keep(record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith("Failed to tag prompt") and lost_insert_race(msg))

    logging.getLogger(name).addFilter(keep)
    _quieted.add(name)
