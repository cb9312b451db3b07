"""Runs kept in memory: the second, real implementation of the run writer and reader
(``tracking.run_writer``, ``tracking.run_reader``). It is what the pipeline's unit tests record
into and what the comparison code reads back without a store; the MLflow implementations are
the production ones. Nothing here imports mlflow.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

#: The run statuses, as MLflow names them (a reader compares them as strings).
STATUSES = ("RUNNING", "FINISHED", "FAILED", "KILLED")


@dataclass
class StoredRun:
    """One run as written: the writer fills it, the reader turns it into ``RunData``."""

    run_id: str
    name: str
    experiment: str
    parent_id: str | None = None
    status: str = "RUNNING"
    start_time: float = field(default_factory=time.time)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    table: pd.DataFrame | None = None
    artifacts: dict[str, str] = field(default_factory=dict)  # relative path -> text
    traces: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[tuple[str, int]] = field(default_factory=list)  # the prompt versions it is linked to


@dataclass
class MemoryStore:
    """Every run of one process, keyed by run id (32 random hex digits, like MLflow's: a run's
    label shows its first 8, so they must differ between runs)."""

    runs: dict[str, StoredRun] = field(default_factory=dict)
    prompts: dict[str, list[str]] = field(default_factory=dict)  # registry name -> texts; version = index + 1
    locks: dict[str, threading.Lock] = field(default_factory=dict)  # one per config_hash

    def new_run(self, name: str, experiment: str, parent_id: str | None = None) -> StoredRun:
        run_id = uuid.uuid4().hex
        run = self.runs[run_id] = StoredRun(run_id, name, experiment, parent_id)
        return run

    def lock(self, key: str) -> threading.Lock:
        return self.locks.setdefault(key, threading.Lock())

    def get(self, run_id: str) -> StoredRun:
        try:
            return self.runs[run_id]
        except KeyError:
            raise KeyError(f"unknown run {run_id!r}") from None

    def children(self, parent_id: str) -> list[StoredRun]:
        return [r for r in self.runs.values() if r.parent_id == parent_id]
