"""Sweep parent runs: the multirun context every job reads, electing one parent per sweep on a
host (a file lock; across hosts ``multirun.settle_parent``), and closing it with its children's
final status."""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from pathlib import Path

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
    hosts ``multirun.settle_parent`` keeps one).
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
