"""Everything MLflow: experiment, parent/child runs, params, metrics, artifacts, resume.

The layout is a contract that ``compare``, ``gate``, ``report`` and users' dashboards rely on:
one parent run per multirun (tag ``sweep_id``), one child per resolved config, params = the
flattened config plus the Hydra group choices, metrics with the registry keys (docs/metrics.md), the per-query
table as ``per_query.json`` (``mlflow.log_table``) and ``per_query.parquet``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import tempfile
import time
import uuid
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from rag_experiments.tracking.uri import artifact_location, is_server  # noqa: F401
from rag_experiments.tracking.uri import tracking_uri as resolve_uri  # noqa: F401  (sweep.py's name)

SWEEP_FILE = ".sweep.json"  # the multirun context, in hydra.sweep.dir (read by every job)


def store_lock(uri: str) -> contextlib.AbstractContextManager:
    """Serialises the first touch of a store: two processes creating one fresh sqlite schema race
    on its migrations ("table already exists")."""
    from rag_experiments.cache import stable_hash

    return file_lock(
        Path(tempfile.gettempdir()) / "rag_experiments_locks" / f"store-{stable_hash(uri)[:16]}.lock"
    )


def open_store(uri: str) -> MlflowClient:
    """A client on ``uri``; constructing one creates a fresh store, so it happens under a lock."""
    with store_lock(uri):
        return MlflowClient(tracking_uri=uri)


def get_experiment_id(client: MlflowClient, name: str, artifact_root: str | None) -> str:
    with store_lock(client.tracking_uri):
        return _get_experiment_id(client, name, artifact_root)


def _get_experiment_id(client: MlflowClient, name: str, artifact_root: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        location = artifact_location(client.tracking_uri, artifact_root)
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # another worker created it between our lookup and create
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def flatten(d: Any, prefix: str = "") -> dict[str, str]:
    """``{"chunking": {"size": 800}}`` → ``{"chunking.size": "800"}`` (MLflow params are strings)."""
    out: dict[str, str] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = json.dumps(d) if isinstance(d, list) else str(d)
    return out


def config_hash(
    cfg: dict, corpus_digest: str, evalset_digest: str, models: dict[str, str] | None = None
) -> str:
    """Hash of what determines results apart from code: the config without its place keys (at
    any depth, ``identity.is_place_key``), the data digests and the stages' model identities
    (weights' sha256 + settings, ``identity.model_identities``). Code is compared separately
    (:func:`resume_decision`), so a re-run can say which of the two changed."""
    from rag_experiments.cache import stable_hash
    from rag_experiments.identity import semantic_config

    parts: list = ["config", semantic_config(cfg), corpus_digest, evalset_digest]
    if models:
        parts.append(models)
    return stable_hash(*parts)[:16]


def find_finished(client: MlflowClient, experiment_id: str, chash: str):
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.config_hash = '{chash}' and attributes.status = 'FINISHED'",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    return runs[0] if runs else None


def resume_decision(client: MlflowClient, experiment_id: str, chash: str, fingerprint: str):
    """(run to reuse or None, why) for a config about to run.

    Skip only when a FINISHED run has this ``config_hash`` AND this ``code_fingerprint``; a
    FINISHED run with the same config but other code is named in the reason for re-running.
    ``why`` is "" when no earlier run matches the config at all.
    """
    same = client.search_runs(
        [experiment_id],
        filter_string=(
            f"tags.config_hash = '{chash}' and tags.code_fingerprint = '{fingerprint}' "
            "and attributes.status = 'FINISHED'"
        ),
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    if same:
        rid = same[0].info.run_id
        return same[0], (
            f"config_hash {chash} and code_fingerprint {fingerprint} already FINISHED as run {rid} "
            "(force=true re-runs)"
        )
    old = find_finished(client, experiment_id, chash)
    if old is None:
        return None, ""
    before = old.data.tags.get("code_fingerprint", "none recorded")
    return None, f"code changed since run {old.info.run_id} (fingerprint {before} -> {fingerprint})"


def git_info(root: Path | None = None) -> dict[str, str]:
    root = root or Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if commit else False
    return {"git_commit": commit or "unknown", "git_dirty": str(dirty).lower()}


def package_versions() -> dict[str, str]:
    out = {}
    for pkg in (
        "rag-experiments",
        "mlflow",
        "hydra-core",
        "sentence-transformers",
        "transformers",
        "torch",
        "numpy",
        "pandas",
        "bm25s",
        "model2vec",
        "semantic-text-splitter",
        "xllamacpp",
        "openai",
    ):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "absent"
    return out


# ------------------------------------------------------------------------------ parent runs


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


@contextlib.contextmanager
def file_lock(path: Path, what: str = ""):
    """An exclusive ``flock`` on ``path``: released by the kernel when the process dies (kill -9).
    Waiting for it prints the holder (``tracking.lock_wait``)."""
    from rag_experiments.tracking.lock_wait import acquire

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        acquire(f, path, what)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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


# ------------------------------------------------------------------------------ child runs


def runner_id() -> str:
    """``host:pid`` of this process: tagged on each child so a later run can tell a dead one."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _runner_alive(runner: str | None) -> bool:
    if not runner or ":" not in runner:
        return False
    host, pid = runner.rsplit(":", 1)
    if host != socket.gethostname():
        return True  # another machine: we cannot tell, so never touch it
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError):
        return False
    except PermissionError:
        return True
    return int(pid) != os.getpid()  # our own pid: a leftover of an earlier job in this process


def config_lock(uri: str, experiment_id: str, chash: str) -> contextlib.AbstractContextManager:
    """One lock per (store, experiment, config_hash): the skip check and the run are atomic, so
    two identical sweeps started together run each config once (the second one skips it)."""
    from rag_experiments.cache import stable_hash

    key = stable_hash("config-lock", uri, experiment_id, chash)[:24]
    lock = Path(tempfile.gettempdir()) / "rag_experiments_locks" / f"{key}.lock"
    return file_lock(lock, f"config_hash {chash[:12]}")


def heal_stale_runs(client: MlflowClient, experiment_id: str, chash: str) -> list[str]:
    """Mark RUNNING runs of ``chash`` whose process is gone as KILLED (tag ``healed``).

    Called under ``config_lock``, so no live process on this host is running that config; a
    run whose ``runner`` is on another host is left alone.
    """
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.config_hash = '{chash}' and attributes.status = 'RUNNING'",
        max_results=100,
    )
    healed = []
    for r in runs:
        if _runner_alive(r.data.tags.get("runner")):
            continue
        client.set_tag(r.info.run_id, "healed", "its process died while RUNNING; marked KILLED by a re-run")
        client.set_terminated(r.info.run_id, "KILLED")
        healed.append(r.info.run_id)
    return healed


def _batched(seq: list, n: int):
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def start_child(
    client: MlflowClient, experiment_id: str, run_name: str, tags: dict[str, str], params: dict[str, str]
) -> str:
    run = client.create_run(experiment_id, run_name=run_name, tags=tags)
    rid = run.info.run_id
    items = [Param(k[:250], v[:6000]) for k, v in sorted(params.items())]
    try:
        for batch in _batched(items, 100):
            client.log_batch(rid, params=batch)
    except BaseException as e:  # a signal between create and the caller's try: never left RUNNING
        client.set_terminated(rid, "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    return rid


def log_results(
    client: MlflowClient,
    run_id: str,
    aggregates: dict[str, float],
    per_query: pd.DataFrame,
    evalset_df: pd.DataFrame,
    evalset_path: str,
    evalset_digest: str,
    artifacts: dict[str, str],
    extra_tags: dict[str, str],
) -> None:
    import math

    import mlflow

    now = int(time.time() * 1000)
    from rag_experiments.tracking.run_page import metric_order

    # logged in reading order: MLflow's run page lists metrics in the order they were logged
    metrics = [
        Metric(k, float(aggregates[k]), now, 0)
        for k in metric_order(aggregates)
        if aggregates[k] is not None and not (isinstance(aggregates[k], float) and math.isnan(aggregates[k]))
    ]
    for batch in _batched(metrics, 1000):
        client.log_batch(run_id, metrics=batch)
    # NaN aggregates (e.g. a metric no query could be scored on) are not logged as numbers;
    # they are named in a tag so their absence is visible, never silent.
    missing = sorted(k for k, v in aggregates.items() if isinstance(v, float) and math.isnan(v))
    tags = [RunTag(k, v) for k, v in extra_tags.items()]
    if missing:
        tags.append(RunTag("nan_metrics", ",".join(missing)[:5000]))
    for batch in _batched(tags, 100):
        client.log_batch(run_id, tags=batch)
    with tempfile.TemporaryDirectory() as tmp:
        pq = Path(tmp) / "per_query.parquet"
        per_query.to_parquet(pq, index=False)
        client.log_artifact(run_id, str(pq))
        for name, content in artifacts.items():
            p = Path(tmp) / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content, encoding="utf-8")
            client.log_artifact(run_id, str(p), artifact_path=str(Path(name).parent) if "/" in name else None)
    with warnings.catch_warnings():  # schema-inference hints about int columns are noise here
        warnings.simplefilter("ignore", UserWarning)
        mlflow.log_table(per_query, artifact_file="per_query.json", run_id=run_id)
        with mlflow.start_run(run_id=run_id):
            ds = mlflow.data.from_pandas(
                evalset_df,
                source=str(Path(evalset_path).resolve()),
                name="evalset",
                digest=evalset_digest[:16],
            )
            mlflow.log_input(ds, context="eval")
    # start_run/end_run above would mark FINISHED; the caller sets the final status explicitly.


def eval_runs_url(base: str, experiment_id: str | None) -> str:
    """The experiment's evaluation-runs view in the MLflow 3 UI (runs with their per-query traces;
    select one and "compare to" another for the side-by-side view); the UI root without an id."""
    base = base.rstrip("/")
    return f"{base}/#/experiments/{experiment_id}/evaluation-runs" if experiment_id else base


def ui_command(uri: str, artifact_root: str | None, experiment_id: str | None = None) -> str:
    """A UI command that works from any shell: this venv's Python, absolute store and artifact
    paths, and the URL of the experiment's evaluation-runs view (:func:`eval_runs_url`)."""
    import shlex
    import sys

    if is_server(uri):
        return f"open {eval_runs_url(uri, experiment_id)}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):  # relative to the cwd
        uri = "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    root = Path(artifact_root or "mlartifacts").resolve()
    return (
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false MLFLOW_DISABLE_TELEMETRY=true "
        f"{shlex.quote(sys.executable)} -m mlflow server "
        f"--backend-store-uri {shlex.quote(uri)} --default-artifact-root {shlex.quote(str(root))} "
        f"--workers 1 --port 5000   # then open {eval_runs_url('http://127.0.0.1:5000', experiment_id)}"
    )
