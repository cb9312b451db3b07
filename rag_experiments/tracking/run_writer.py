"""The run writer: the one door a run's results go out through (issue 28, docs/architecture.md).

A :class:`RunWriter` starts a run (a child of the sweep's parent in a multirun), logs its params,
metrics, per-query table, artifacts and traces, and sets its final status LAST: a run whose
status is FINISHED has everything (resume trusts it, ``resume.incomplete_reason``). Two real
implementations:

- :class:`MlflowRunWriter`: the production one, over an MLflow tracking store; it calls the
  functions of ``tracking.writer``, ``tracking.parents``, ``tracking.traces``,
  ``tracking.app_versions``, ``tracking.prompt_registry`` and ``tracking.reuse``. It is also the
  production :class:`~rag_experiments.tracking.run_store.RunStore`: the job's store-side steps
  (the config lock, healing stale runs, the resume decision, a FINISHED config joining a new
  sweep, prompt registration, the pilot run), so that ``run/`` makes no MLflow call of its own.
- :class:`MemoryRunWriter`: runs kept in a ``tracking.memory.MemoryStore``; the pipeline's unit
  tests record into it (the proof that the protocol is the seam). ``run_store.MemoryRunStore``
  adds the store-side steps.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd

from rag_experiments.core.redaction import error_text
from rag_experiments.core.run_record import RunData
from rag_experiments.tracking.memory import MemoryStore, StoredRun
from rag_experiments.tracking.resume import Resume
from rag_experiments.tracking.trace_settings import TraceSettings

#: Run tags both writers set (``writer.TRACES_EXPECTED`` names the first; kept in step by a test).
TRACES_EXPECTED = "traces_expected"
TRACES_SAMPLED = "traces_sampled"


@dataclass
class RunResults:
    """What one run logs besides its traces: the aggregate ``metrics`` (NaN ones are named in the
    tag ``nan_metrics``, never logged as numbers), the per-query ``table``, the eval set (a
    summary table, its path and digest: the run's dataset input), text ``artifacts`` by relative
    path (``config.yaml`` …) and result ``tags``."""

    metrics: dict[str, float]
    table: pd.DataFrame
    evalset_table: pd.DataFrame
    evalset_path: str
    evalset_digest: str
    artifacts: dict[str, str]
    tags: dict[str, str]


@dataclass(frozen=True)
class TraceInputs:
    """What a run's traces are built from (``traces.TraceJob`` without the app version): the
    settings, the eval items and documents, the prompt, the generator model, the judge and the
    registry's (name, version) of the run's prompt."""

    settings: TraceSettings
    items: Any
    docs: Any
    evalset_digest: str
    prompt: Any = None
    generator_model: str | None = None
    judge: Any = None
    prompt_version: tuple[str, int] | None = None


class RunWriter(Protocol):
    """Where a run's results go. Call order: ``start``, then any of the logging methods, then
    ``end`` (or ``abort`` on an exception) exactly once, last."""

    experiment_id: str

    def start(
        self, name: str, tags: dict[str, str], params: dict[str, str], sweep: dict | None = None, force: bool = False
    ) -> tuple[str, str | None]:
        """Create the run (RUNNING) with its tags and params: (run id, the sweep parent's id or None).
        In a multirun (``sweep``: its context) the run is a child of the sweep's one parent, found
        or created (``force``: never reuse an identical earlier sweep's parent)."""
        ...

    def begin_version(
        self, run_id: str, chash: str, identities: dict[str, str], prompt_refs: Sequence[tuple[str, int]]
    ) -> Any:
        """Before the pipeline: the config's app version (None where the store has none) and the
        run's links to its registered prompts (answer prompt, query transform, LLM reranker)."""
        ...

    def link_version(
        self, run_id: str, chash: str, version: Any, prompt_refs: Sequence[tuple[str, int]]
    ) -> str | None:
        """After the pipeline: the app version's id the metrics and traces are linked to (or None)."""
        ...

    def log_results(self, run_id: str, results: RunResults, model_id: str | None = None) -> None:
        """Metrics, result tags, the per-query table, the artifacts and the eval-set input."""
        ...

    def log_traces(self, run_id: str, table: pd.DataFrame, inputs: TraceInputs, model_id: str | None = None) -> float:
        """One trace per (sampled) row of ``table``; the seconds spent. Sets ``traces_expected``
        before the first trace and ``traces`` after the last."""
        ...

    def register_judges(self, judge: Any) -> None:
        """The run's judge where the store lists judges (MLflow's Judges tab)."""
        ...

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None: ...

    def end(self, run_id: str, status: str) -> None:
        """The final status (FINISHED, FAILED): the last call for the run."""
        ...

    def abort(self, run_id: str, error: BaseException, parent_id: str | None = None) -> str:
        """The run stopped by ``error``: tag ``error``, status KILLED (KeyboardInterrupt, a signal)
        or FAILED, and a sweep parent closed as incomplete. Never raises; returns the status."""
        ...


def _status_of(error: BaseException) -> str:
    return "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"


def _logged_metrics(metrics: Mapping[str, float]) -> tuple[dict[str, float], list[str]]:
    """(the metrics logged as numbers, the NaN ones named in ``nan_metrics``): as ``log_results``."""
    nan = sorted(k for k, v in metrics.items() if isinstance(v, float) and math.isnan(v))
    kept = {k: float(v) for k, v in metrics.items() if v is not None and k not in nan}
    return kept, nan


# ------------------------------------------------------------------------------ MLflow


class MlflowRunWriter:
    """The production writer over an MLflow tracking store (one experiment)."""

    def __init__(self, client, experiment_id: str, artifact_root: str | None = None):
        self.client, self.experiment_id, self.artifact_root = client, experiment_id, artifact_root
        self._runs: dict[str, Any] = {}  # run id → the MLflow Run a RunData was made from

    @classmethod
    def open(cls, uri: str, experiment_name: str, artifact_root: str | None) -> MlflowRunWriter:
        """A writer on the store at ``uri`` (created under a lock) and the experiment, created if new."""
        import mlflow

        from rag_experiments.tracking.writer import get_experiment_id, open_store

        client = open_store(uri)
        mlflow.set_tracking_uri(uri)  # the tracing exporter and log_feedback read it
        return cls(client, get_experiment_id(client, experiment_name, artifact_root), artifact_root)

    @property
    def uri(self) -> str:
        return self.client.tracking_uri

    # -- the protocol

    def start(self, name, tags, params, sweep=None, force=False):
        from rag_experiments.tracking.parents import start_sweep_child
        from rag_experiments.tracking.writer import start_child

        tags = dict(tags)
        if not sweep:
            return start_child(self.client, self.experiment_id, name, tags, params), None

        def child(parent_id: str, sweep_id: str) -> str:
            tags.update({"mlflow.parentRunId": parent_id, "sweep_id": sweep_id})
            return start_child(self.client, self.experiment_id, name, tags, params)

        return start_sweep_child(self.client, self.experiment_id, sweep, force, child)

    def begin_version(self, run_id, chash, identities, prompt_refs):
        from rag_experiments.tracking import app_versions
        from rag_experiments.tracking.prompt_registry import link_run

        version = app_versions.start(self.client, self.experiment_id, run_id, chash, identities)
        for ref in prompt_refs:  # the Prompts tab lists the run under the versions it used
            link_run(self.client, run_id, *ref)
        return version

    def link_version(self, run_id, chash, version, prompt_refs):
        from rag_experiments.tracking import app_versions
        from rag_experiments.tracking.prompt_registry import link_model

        model_id = app_versions.link(self.client, self.experiment_id, run_id, chash, version)  # "Agent versions"
        for ref in prompt_refs:  # the version's prompts, on its page (docs/tracing.md)
            link_model(self.client, model_id, *ref)
        return model_id

    def log_results(self, run_id, results, model_id=None):
        from rag_experiments.tracking.writer import log_results

        r = results
        log_results(
            self.client, run_id, r.metrics, r.table, r.evalset_table, r.evalset_path, r.evalset_digest,
            r.artifacts, r.tags, model_id=model_id,
        )  # fmt: skip

    def log_traces(self, run_id, table, inputs, model_id=None):
        from rag_experiments.tracking import traces

        job = traces.TraceJob(
            inputs.settings, inputs.items, inputs.docs, inputs.evalset_digest, inputs.prompt,
            inputs.generator_model, inputs.judge, model_id, inputs.prompt_version,
        )  # fmt: skip
        return traces.log_traces(self.client, run_id, self.experiment_id, table, job)

    def register_judges(self, judge):
        from rag_experiments.tracking import judges_tab

        judges_tab.register_judges(self.experiment_id, judge)

    def set_tags(self, run_id, tags):
        for k, v in tags.items():
            self.client.set_tag(run_id, k, v)

    def end(self, run_id, status):
        self.client.set_terminated(run_id, status)

    def abort(self, run_id, error, parent_id=None):
        from rag_experiments.tracking.bounds import best_effort
        from rag_experiments.tracking.mlflow_adapter_session import release_interrupted_connections
        from rag_experiments.tracking.parents import close_parent

        status = _status_of(error)
        if status == "KILLED":  # the signal may have hit inside a store transaction
            with best_effort("release the interrupted store connection"):
                release_interrupted_connections(self.uri, error)
        with best_effort(f"mark run {run_id} {status}"):
            self.client.set_tag(run_id, "error", error_text(error, 5000))
            self.client.set_terminated(run_id, status)
            if parent_id:  # the multirun stops here too: its parent must not stay RUNNING
                interrupted = (str(error) or "KeyboardInterrupt") if status == "KILLED" else ""
                close_parent(self.client, self.experiment_id, parent_id, complete=False, interrupted=interrupted)
        return status

    # -- the job's store-side steps (``tracking.run_store.RunStore``)

    def _record(self, run) -> RunData:
        from rag_experiments.tracking.runs import as_record

        self._runs[run.info.run_id] = run
        return as_record(run)

    def _mlflow_run(self, run: RunData):
        found = self._runs.get(run.run_id)
        return found if found is not None else self.client.get_run(run.run_id)

    @contextmanager
    def config_lock(self, chash: str) -> Iterator[None]:
        """Held around the skip check and the run: identical sweeps started together run a config once."""
        from rag_experiments.tracking.locks import config_lock

        with config_lock(self.uri, self.experiment_id, chash):
            yield

    def heal_stale_runs(self, chash: str) -> list[str]:
        from rag_experiments.tracking.writer import heal_stale_runs

        return heal_stale_runs(self.client, self.experiment_id, chash)

    def resume_decision(self, chash: str, fingerprint: str) -> Resume:
        """The FINISHED run to reuse or None, and why: ``writer.resume_decision`` (``resume.decide``)."""
        from rag_experiments.tracking.writer import resume_decision

        done, why = resume_decision(self.client, self.experiment_id, chash, fingerprint)
        return Resume(None if done is None else self._record(done), why)

    def register_prompt(self, prompt) -> tuple[str, int]:
        """The run's prompt template in the Prompt Registry, by content: (name, version)."""
        from rag_experiments.tracking.prompt_registry import register_for_run

        return register_for_run(self.client, self.experiment_id, prompt)

    def register_stage_prompts(self, stages) -> list[tuple[str, int]]:
        """The query transform's and LLM reranker's prompts in the Prompt Registry: (name, version)s."""
        from rag_experiments.tracking.prompt_registry import register_stage_prompts

        return register_stage_prompts(self.client, self.experiment_id, stages)

    def link_reused_run(self, run_id: str, prompt_version: tuple[str, int]) -> None:
        from rag_experiments.tracking.prompt_registry import link_reused_run

        link_reused_run(self.client, self.experiment_id, run_id, *prompt_version)

    def per_query(self, run: RunData, long: bool = False) -> pd.DataFrame:
        """A logged run's per-query table (wide unless ``long``)."""
        from rag_experiments.tracking.runs import load_per_query

        return load_per_query(self.client, self._mlflow_run(run), long=long)

    def latest_finished_of_evalset(self, evalset_digest: str) -> RunData | None:
        """The latest FINISHED run of the experiment on this eval set (the sweep's pilot, ``run.pilot``)."""
        from rag_experiments.tracking.writer import latest_finished_of_evalset

        found = latest_finished_of_evalset(self.client, self.experiment_id, evalset_digest)
        return None if found is None else self._record(found)

    def reuse_in_sweep(
        self, done: RunData, chash: str, sweep: dict, force: bool, start: Callable[[], tuple[str, str | None]]
    ) -> str | None:
        """Make the FINISHED run ``done`` part of this multirun: a child of its parent (``start``
        creates it) that carries ``done``'s results (``tracking.reuse``), so the sweep counts,
        lists and reports the config. None when the parent already holds this config."""
        from rag_experiments.tracking.bounds import best_effort
        from rag_experiments.tracking.parents import get_or_create_parent, settle_parent
        from rag_experiments.tracking.reuse import already_in_parent, copy_results

        parent_id, _ = get_or_create_parent(self.client, self.experiment_id, sweep, force)
        parent_id = settle_parent(self.client, self.experiment_id, sweep["invocation"]) or parent_id
        if already_in_parent(self.client, self.experiment_id, parent_id, chash):
            return None
        run_id, _ = start()
        try:
            copy_results(self.client, self._mlflow_run(done), run_id)
            self.client.set_terminated(run_id, "FINISHED")
        except BaseException:
            with best_effort(f"mark run {run_id} FAILED"):
                self.client.set_terminated(run_id, "FAILED")
            raise
        return run_id

    def ui_line(self) -> str | None:
        """How to open the store's UI on the experiment (printed after a single run)."""
        from rag_experiments.tracking.run_info import ui_command

        return ui_command(self.uri, self.artifact_root, self.experiment_id)


# ------------------------------------------------------------------------------ memory


class MemoryRunWriter:
    """Runs recorded in a :class:`~rag_experiments.tracking.memory.MemoryStore`: what the MLflow
    writer would log, in plain Python (traces as their built records: spans, tags, assessments)."""

    def __init__(self, store: MemoryStore | None = None, experiment: str = "default"):
        self.store = store if store is not None else MemoryStore()
        self.experiment_id = experiment

    def _parent(self, sweep: dict, force: bool) -> StoredRun:
        for run in self.store.runs.values():  # one parent per invocation, or an identical sweep's
            t = run.tags
            if t.get("is_parent") == "true" and (
                t.get("sweep_invocation") == sweep["invocation"]
                or (not force and t.get("sweep_hash") == sweep.get("sweep_hash"))
            ):
                run.tags["sweep_invocation"] = sweep["invocation"]
                run.status = "RUNNING"
                return run
        sweep_id = sweep.get("sweep_id") or time.strftime("%Y%m%d-%H%M%S")
        parent = self.store.new_run(f"sweep {sweep_id}", self.experiment_id)
        parent.tags.update({
            "sweep_id": sweep_id,
            "sweep_hash": str(sweep.get("sweep_hash", "")),
            "sweep_invocation": sweep["invocation"],
            "is_parent": "true",
            "sweep_overrides": json.dumps(sweep.get("overrides", [])),
        })
        return parent

    def start(self, name, tags, params, sweep=None, force=False):
        parent = self._parent(sweep, force) if sweep else None
        run = self.store.new_run(name, self.experiment_id, parent.run_id if parent else None)
        run.tags.update(tags)
        if parent is not None:
            run.tags.update({"mlflow.parentRunId": parent.run_id, "sweep_id": parent.tags["sweep_id"]})
        run.params.update({k[:250]: v[:6000] for k, v in params.items()})  # MLflow's limits
        return run.run_id, parent.run_id if parent else None

    def begin_version(self, run_id, chash, identities, prompt_refs):
        return None  # a memory store keeps no app versions

    def link_version(self, run_id, chash, version, prompt_refs):
        return None

    def log_results(self, run_id, results, model_id=None):
        run = self.store.get(run_id)
        kept, nan = _logged_metrics(results.metrics)
        run.metrics.update(kept)
        run.tags.update(results.tags)
        if nan:
            run.tags["nan_metrics"] = ",".join(nan)[:5000]
        run.table = results.table.copy()
        run.artifacts.update(results.artifacts)

    def log_traces(self, run_id, table, inputs, model_id=None):
        from rag_experiments.tracking.traces import N_AS_TEXT, build_records, select_traced

        t0 = time.perf_counter()
        run = self.store.get(run_id)
        s = inputs.settings
        if not s.enabled:
            run.tags[TRACES_EXPECTED] = "0"
            return time.perf_counter() - t0
        traced, record = select_traced(table, s.sample, s.seed)
        run.tags[TRACES_EXPECTED] = str(len(traced))
        run.tags[TRACES_SAMPLED] = json.dumps(record)
        records = build_records(
            traced, inputs.items, inputs.docs, s.k, inputs.evalset_digest, inputs.prompt, inputs.generator_model,
            inputs.judge,
        )  # fmt: skip
        run.traces.extend(
            {"tags": dict(r.tags), "spans": list(r.spans), "assessments": list(r.assessments), "generated": r.generated}
            for r in records
        )
        run.metrics[N_AS_TEXT] = sum(r.n_as_text for r in records)
        seconds = time.perf_counter() - t0
        run.tags["traces"] = json.dumps({"n": len(records), "seconds": round(seconds, 3)})
        return seconds

    def register_judges(self, judge):
        return None

    def set_tags(self, run_id, tags):
        self.store.get(run_id).tags.update(tags)

    def end(self, run_id, status):
        self.store.get(run_id).status = status

    def abort(self, run_id, error, parent_id=None):
        status = _status_of(error)
        run = self.store.get(run_id)
        run.tags["error"] = error_text(error, 5000)
        run.status = status
        if parent_id:
            self.store.get(parent_id).status = "KILLED" if status == "KILLED" else "FAILED"
        return status
