"""Reading runs back: the one door compare, gate, select, plan, report and spotcheck go through.

``RunReader`` is what those readers need from a run store; every answer is the neutral
``core.run_record.RunData`` (params, tags, metrics, status, experiment, parent, start time; the
per-query table once asked for), never an MLflow entity. Two real implementations:

* :class:`MlflowRunReader`: an MLflow tracking store (sqlite, server), through the functions of
  ``tracking.runs`` (``resolve_run``, ``sweep_children``, ``load_per_query`` …);
* :class:`MemoryRunReader`: the runs of a ``tracking.memory.MemoryStore``, no store at all.

Both apply the same rules (latest FINISHED run per ``config_hash``, a replicated table collapsed
unless ``long``) and raise ``RunInputError`` with the same messages, so the comparison code cannot
tell them apart (``tests/test_run_reader.py`` holds that).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Protocol

import pandas as pd

from rag_experiments.core.run_record import RunData
from rag_experiments.tracking import runs as mlflow_runs
from rag_experiments.tracking.memory import MemoryStore, StoredRun
from rag_experiments.tracking.runs import PER_QUERY_ARTIFACT, RunInputError, shape_table

_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


class RunReader(Protocol):
    """The read side of a run store. Runs come back without their table (``table`` None) unless
    said otherwise; :meth:`with_table` adds it."""

    def experiments(self) -> dict[str, str]:
        """experiment id → name, every active experiment."""
        ...

    def experiment_name(self, experiment_id: str) -> str | None:
        """The experiment's name; None when it is gone."""
        ...

    def get(self, run_id: str) -> RunData | None:
        """The run with that id; None when there is none (a deleted parent)."""
        ...

    def resolve(self, run_or_name: str, experiment: str | None = None) -> RunData:
        """A run by id, or by name within ``experiment`` (else every experiment); unknown or
        ambiguous → ``RunInputError`` (the candidates' ids listed)."""
        ...

    def sweep_children(self, sweep_id: str, experiment: str | None = None) -> list[RunData]:
        """Per ``config_hash`` the latest FINISHED child of the sweep, oldest first."""
        ...

    def sweep_config_runs(self, sweep_id: str, experiment: str | None = None) -> list[RunData]:
        """Per ``config_hash`` the latest FINISHED child, else its latest child, oldest first."""
        ...

    def sweep_finished_runs(self, sweep_id: str, experiment: str | None = None) -> list[RunData]:
        """Every FINISHED child of the sweep, replicates of one config included."""
        ...

    def per_query(self, run: RunData, long: bool = False) -> pd.DataFrame:
        """The run's per-query table (``id`` as str), one row per query (replicates collapsed)
        unless ``long``; a missing table → ``RunInputError``."""
        ...

    def text(self, run: RunData, artifact: str) -> str:
        """The text of one artifact of the run; missing → ``RunInputError``."""
        ...

    def with_table(self, run: RunData) -> RunData:
        """A copy of ``run`` with its (collapsed) per-query table."""
        ...


# --------------------------------------------------------------------------------------------- MLflow


class MlflowRunReader:
    """Runs of an MLflow tracking store (``tracking_uri``), read through ``tracking.runs``."""

    def __init__(self, tracking_uri: str):
        from mlflow.tracking import MlflowClient

        self.uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self._runs: dict[str, object] = {}  # run id → the MLflow Run it was read from

    def _record(self, run) -> RunData:
        self._runs[run.info.run_id] = run
        return mlflow_runs.as_record(run)

    def _records(self, runs: Iterable) -> list[RunData]:
        return [self._record(r) for r in runs]

    def _run(self, rec: RunData):
        run = self._runs.get(rec.run_id)
        return run if run is not None else self.client.get_run(rec.run_id)

    def experiments(self) -> dict[str, str]:
        return {e.experiment_id: e.name for e in self.client.search_experiments(max_results=1000)}

    def get(self, run_id: str) -> RunData | None:
        from mlflow.exceptions import MlflowException

        try:
            return self._record(self.client.get_run(run_id))
        except MlflowException:
            return None

    def experiment_name(self, experiment_id: str) -> str | None:
        """The name of an experiment, deleted ones too (the report names where its runs live)."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_experiment(experiment_id).name
        except MlflowException:
            return None

    def resolve(self, run_or_name: str, experiment: str | None = None) -> RunData:
        return self._record(mlflow_runs.resolve_run(self.client, run_or_name, experiment))

    def sweep_children(self, sweep_id: str, experiment: str | None = None) -> list[RunData]:
        return self._records(mlflow_runs.sweep_children(self.client, sweep_id, experiment))

    def sweep_config_runs(self, sweep_id: str, experiment: str | None = None) -> list[RunData]:
        return self._records(mlflow_runs.sweep_config_runs(self.client, sweep_id, experiment))

    def sweep_finished_runs(self, sweep_id: str, experiment: str | None = None) -> list[RunData]:
        return self._records(mlflow_runs.sweep_finished_runs(self.client, sweep_id, experiment))

    def per_query(self, run: RunData, long: bool = False) -> pd.DataFrame:
        return mlflow_runs.load_per_query(self.client, self._run(run), long=long)

    def text(self, run: RunData, artifact: str) -> str:
        return mlflow_runs.download_text(self.client, self._run(run), artifact)

    def with_table(self, run: RunData) -> RunData:
        return replace(run, table=self.per_query(run))


# --------------------------------------------------------------------------------------------- memory


def latest_per_config(children: Iterable[RunData], finished_only: bool = True) -> list[RunData]:
    """Per ``config_hash`` (a child without one is its own config) the latest FINISHED run; with
    ``finished_only`` False a config that never finished keeps its latest run, whatever its
    status. ``children`` oldest first; the result oldest first (``tracking.runs.sweep_children``
    and ``sweep_config_runs``, on records)."""
    latest: dict[str, RunData] = {}
    for r in children:  # oldest first: later ones win
        key = r.tags.get("config_hash") or r.run_id
        if r.status == "FINISHED" or (
            not finished_only and (latest.get(key) is None or latest[key].status != "FINISHED")
        ):
            latest[key] = r
    return sorted(latest.values(), key=lambda r: r.start_time or 0)


class MemoryRunReader:
    """Runs of a ``MemoryStore``; an experiment's id is its name (the store keeps no other)."""

    def __init__(self, store: MemoryStore):
        self.store = store

    @staticmethod
    def record(run: StoredRun) -> RunData:
        return RunData(
            run_id=run.run_id,
            name=run.name or run.run_id,
            params=dict(run.params),
            tags=dict(run.tags),
            metrics=dict(run.metrics),
            status=run.status,
            experiment_id=run.experiment,
            parent_id=run.parent_id,
            start_time=int(run.start_time * 1000),
            run_name=run.name,
        )

    def experiments(self) -> dict[str, str]:
        return {r.experiment: r.experiment for r in self.store.runs.values()}

    def experiment_name(self, experiment_id: str) -> str | None:
        return self.experiments().get(experiment_id)

    def get(self, run_id: str) -> RunData | None:
        run = self.store.runs.get(run_id)
        return None if run is None else self.record(run)

    def _in(self, experiment: str | None) -> list[StoredRun]:
        if experiment and experiment not in self.experiments():
            raise RunInputError(f"unknown experiment {experiment!r}")
        return [r for r in self.store.runs.values() if not experiment or r.experiment == experiment]

    def resolve(self, run_or_name: str, experiment: str | None = None) -> RunData:
        if _RUN_ID.match(run_or_name) and run_or_name in self.store.runs:
            return self.record(self.store.runs[run_or_name])
        found = [r for r in self._in(experiment) if r.name == run_or_name]
        if not found and mlflow_runs.is_id_prefix(run_or_name):  # the one prefix rule (tracking.runs)
            rid = mlflow_runs.pick_by_prefix(
                run_or_name,
                [(r.run_id, f"name={r.name}  status={r.status}") for r in self._in(experiment)],
            )
            found = [self.store.runs[rid]] if rid else []
        if not found:
            where = f" in experiment {experiment!r}" if experiment else ""
            raise RunInputError(f"unknown run {run_or_name!r}{where}: no run with that id, id prefix or name")
        if len(found) > 1:
            lines = "\n".join(
                f"  {r.run_id}  experiment={r.experiment}  status={r.status}  "
                f"sweep_id={r.tags.get('sweep_id', '-')}"
                for r in found
            )
            raise RunInputError(f"run name {run_or_name!r} is ambiguous; pass one of these run ids:\n{lines}")
        return self.record(found[0])

    def _sweep(self, sweep_id: str, experiment: str | None) -> list[RunData]:
        kids = [
            self.record(r)
            for r in self._in(experiment)
            if r.tags.get("sweep_id") == sweep_id and r.parent_id is not None
        ]
        return sorted(kids, key=lambda r: r.start_time)

    def sweep_children(self, sweep_id: str, experiment: str | None = None) -> list[RunData]:
        return latest_per_config(self._sweep(sweep_id, experiment))

    def sweep_config_runs(self, sweep_id: str, experiment: str | None = None) -> list[RunData]:
        return latest_per_config(self._sweep(sweep_id, experiment), finished_only=False)

    def sweep_finished_runs(self, sweep_id: str, experiment: str | None = None) -> list[RunData]:
        return [r for r in self._sweep(sweep_id, experiment) if r.status == "FINISHED"]

    def per_query(self, run: RunData, long: bool = False) -> pd.DataFrame:
        table = self.store.get(run.run_id).table
        if table is None:
            raise RunInputError(f"run {run.label} has no {PER_QUERY_ARTIFACT} artifact")
        return shape_table(table, run.label, long)

    def text(self, run: RunData, artifact: str) -> str:
        try:
            return self.store.get(run.run_id).artifacts[artifact]
        except KeyError:
            raise RunInputError(f"run {run.label} has no {artifact} artifact") from None

    def with_table(self, run: RunData) -> RunData:
        return replace(run, table=self.per_query(run))
