"""Sweep parent runs: the multirun context every job reads, electing one parent per sweep on a
host (a file lock; across hosts :func:`settle_parent`), starting a job's child under it, and
closing it with its children's final status (``run.multirun`` calls these; no MLflow call there)."""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from rag_experiments.core.run_names import sweep_description
from rag_experiments.tracking.locks import file_lock
from rag_experiments.tracking.run_info import git_info

SWEEP_FILE = ".sweep.json"  # the multirun context, in hydra.sweep.dir (read by every job)


def write_sweep_context(sweep_dir: str | Path, sweep: dict) -> Path:
    """Written once by the multirun callback; every job (in-process, joblib or Ray) reads it."""
    path = Path(sweep_dir) / SWEEP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SWEEP_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(sweep, indent=2), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_sweep_context(sweep_dir: str | Path | None) -> dict | None:
    """The context of the multirun whose sweep dir is ``sweep_dir``; None for a single job."""
    if sweep_dir is None:
        return None
    path = Path(sweep_dir) / SWEEP_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def get_or_create_parent(
    client: MlflowClient, experiment_id: str, sweep: dict, force: bool
) -> tuple[str, str]:
    """(parent run id, sweep_id) for this multirun, created by the first job that needs it.

    Created lazily so that a sweep whose input is rejected leaves no empty parent behind. An
    identical earlier sweep's parent is reused (its finished children are skipped anyway) unless
    ``force``; a file lock keeps parallel workers on one host from creating two parents (across
    hosts :func:`settle_parent` keeps one).
    """
    lock = Path(tempfile.gettempdir()) / "rag_experiments_locks" / f"{sweep['invocation']}.lock"
    with file_lock(lock):
        filters = [f"tags.sweep_invocation = '{sweep['invocation']}'"]
        if not force:
            filters.append(f"tags.sweep_hash = '{sweep['sweep_hash']}'")
        for flt in filters:
            runs = client.search_runs(
                [experiment_id], filter_string=flt, max_results=1, order_by=["attributes.start_time DESC"]
            )
            if runs:
                r = runs[0]
                if r.data.tags.get("sweep_invocation") != sweep["invocation"]:
                    client.set_tag(r.info.run_id, "sweep_invocation", sweep["invocation"])
                if r.info.status != "RUNNING":  # a re-run resumes a KILLED/FAILED sweep
                    client.update_run(r.info.run_id, status="RUNNING")
                return r.info.run_id, r.data.tags["sweep_id"]
        # the driver fixes sweep_id (same on every host); older contexts lack it
        sweep_id = sweep.get("sweep_id") or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        run = client.create_run(
            experiment_id,
            run_name=f"sweep {sweep_id}",
            tags={
                "sweep_id": sweep_id,
                "sweep_hash": sweep["sweep_hash"],
                "sweep_invocation": sweep["invocation"],
                "is_parent": "true",
                "sweep_overrides": json.dumps(sweep.get("overrides", [])),
                "command": sweep.get("command", ""),
                "mlflow.note.content": sweep_description({**sweep, "sweep_id": sweep_id}),  # the constants
                **git_info(),
            },
        )
        return run.info.run_id, sweep_id


def sweep_status(client: MlflowClient, experiment_id: str, parent_id: str) -> tuple[str, int, int]:
    """(status, configs finished, configs) of a sweep from its children's final states.

    A config is one ``config_hash``; it counts as finished when any of its runs FINISHED, so
    a child killed and then re-run does not hold the sweep back. FINISHED when every config
    finished, else FAILED.
    """
    children = client.search_runs(
        [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'", max_results=5000
    )
    by_config: dict[str, bool] = {}
    for c in children:
        key = c.data.tags.get("config_hash", c.info.run_id)
        by_config[key] = by_config.get(key, False) or c.info.status == "FINISHED"
    done = sum(by_config.values())
    return ("FINISHED" if done == len(by_config) else "FAILED"), done, len(by_config)


def close_parent(
    client: MlflowClient, experiment_id: str, parent_id: str, complete: bool = True, interrupted: str = ""
) -> str:
    """Set a sweep parent's final status and tag ``configs_finished`` = ``done/total``.

    ``complete`` (every job of the multirun ran): FINISHED when every config FINISHED, else
    FAILED. An incomplete sweep is KILLED when ``interrupted`` names the signal, else FAILED;
    a re-run that finishes the remaining configs turns it FINISHED.
    """
    status, done, total = sweep_status(client, experiment_id, parent_id)
    if not complete:
        status = "KILLED" if interrupted else "FAILED"
    client.set_tag(parent_id, "configs_finished", f"{done}/{total}")
    if interrupted:
        client.set_tag(parent_id, "killed_by", interrupted[:200])
    client.set_terminated(parent_id, status)
    return status


def find_parent(client: MlflowClient, experiment_name: str, invocation: str):
    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        return None, None
    runs = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.sweep_invocation = '{invocation}'", max_results=1
    )
    return exp.experiment_id, (runs[0] if runs else None)


def sweep_parents(client, experiment_id: str, invocation: str) -> list:
    """Live parent runs of one multirun, in election order: (start_time, run_id) ascending."""
    runs = client.search_runs(
        [experiment_id], filter_string=f"tags.sweep_invocation = '{invocation}'", max_results=1000
    )
    return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))


def settle_parent(client, experiment_id: str, invocation: str) -> str | None:
    """The multirun's one parent, elected by the tracking store; the others' children move to it.

    Jobs on different hosts share no lock directory, so two first jobs can each create a parent
    (:func:`get_or_create_parent` locks only per host). The store arbitrates:
    winner = the earliest-created live parent tagged with this invocation, ties broken by the
    smaller run id, the same answer for every job that sees the same runs. Every child of the
    sweep (tag ``sweep_id``, fixed by the driver, so equal on every host) whose
    ``mlflow.parentRunId`` names another parent is moved under the winner; the other parents are
    tagged ``superseded_by`` and deleted. Each job calls this after creating its child and the
    driver once more after the last job: that pass sees every parent and child, so the sweep
    ends with one parent holding all children (``docs/scale.md``). None when there is no parent.
    """
    from mlflow.entities import ViewType

    parents = sweep_parents(client, experiment_id, invocation)
    if not parents:
        return None
    winner, losers = parents[0], parents[1:]
    win_id = winner.info.run_id
    for sweep_id in {winner.data.tags.get("sweep_id")} | {p.data.tags.get("sweep_id") for p in losers}:
        children = client.search_runs(
            [experiment_id],
            filter_string=f"tags.sweep_id = '{sweep_id}'",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=5000,
        )
        for c in children:
            if c.data.tags.get("is_parent") != "true" and c.data.tags.get("mlflow.parentRunId") != win_id:
                client.set_tag(c.info.run_id, "mlflow.parentRunId", win_id)
                client.set_tag(c.info.run_id, "sweep_id", winner.data.tags.get("sweep_id", ""))
    for p in losers:
        try:
            client.set_tag(p.info.run_id, "superseded_by", win_id)
            client.set_terminated(p.info.run_id, "KILLED")
            client.delete_run(p.info.run_id)
        except MlflowException:  # another job settled it first: it is deleted already
            pass
    return win_id


def start_sweep_child(
    client, experiment_id: str, sweep: dict, force: bool, start_child: Callable[[str, str], str]
) -> tuple[str, str]:
    """(child run id, parent run id) of one job of a multirun, under the parent the store elects.

    ``start_child(parent_id, sweep_id)`` creates the child run. The parent is found or created
    under this host's lock, then settled across hosts (``settle_parent``) before the child is
    created and once more after it, in case a parent another host created meanwhile won.
    """
    parent_id, sweep_id = get_or_create_parent(client, experiment_id, sweep, force)
    parent_id = settle_parent(client, experiment_id, sweep["invocation"]) or parent_id
    run_id = start_child(parent_id, sweep_id)
    try:
        return run_id, settle_parent(client, experiment_id, sweep["invocation"]) or parent_id
    except BaseException as e:  # a signal before the caller's try: the child is never left RUNNING
        if isinstance(e, KeyboardInterrupt):  # it may have hit inside a store transaction
            from rag_experiments.tracking.mlflow_adapter_session import release_interrupted_connections

            release_interrupted_connections(client.tracking_uri, e)
        client.set_terminated(run_id, "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise


def close_sweep_early(uri: str, experiment_name: str, invocation: str, interrupted: str = "") -> tuple[str, str] | None:
    """A multirun that ended early (a signal between jobs, a job's exit 2): its parents settled,
    the parent closed if still RUNNING (KILLED when ``interrupted`` names the signal, else
    FAILED). (parent run id, status), or None when there was nothing to close."""
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment_name)
    if exp is not None:
        settle_parent(client, exp.experiment_id, invocation)
    exp_id, parent = find_parent(client, experiment_name, invocation)
    if parent is None or client.get_run(parent.info.run_id).info.status != "RUNNING":
        return None
    status = close_parent(client, exp_id, parent.info.run_id, complete=False, interrupted=interrupted)
    return parent.info.run_id, status


def end_sweep(uri: str, experiment_name: str, invocation: str):
    """The multirun's end, once every job has ended: this pass sees every parent any host created,
    settles them and closes the one left (FINISHED when every config FINISHED). Returns
    (client, experiment id or None, the parent run re-read or None, its status)."""
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment_name)
    if exp is not None:
        settle_parent(client, exp.experiment_id, invocation)
    exp_id, parent = find_parent(client, experiment_name, invocation)
    if parent is None:
        return client, exp_id, None, "FINISHED"
    status = close_parent(client, exp_id, parent.info.run_id, complete=True)
    return client, exp_id, client.get_run(parent.info.run_id), status
