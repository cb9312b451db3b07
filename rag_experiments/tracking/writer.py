"""Everything MLflow (DESIGN §5): experiment, parent/child runs, params, metrics, artifacts, resume.

The layout is a contract that ``compare``, ``gate``, ``report`` and users' dashboards rely on:
one parent run per multirun (tag ``sweep_id``), one child per resolved config, params = the
flattened config plus the Hydra group choices, metrics with the DESIGN §3 keys, the per-query
table as ``per_query.json`` (``mlflow.log_table``) and ``per_query.parquet``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
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

DEFAULT_URI = "sqlite:///mlflow.db"
SWEEP_ENV = "RAG_EXPERIMENTS_SWEEP"
# Keys that never change results: they stay out of config_hash and out of the config diff.
NON_SEMANTIC = ("force", "tracking", "cache_dir", "cache_enabled", "progress", "experiment_name")


def resolve_uri(cfg_uri: str | None) -> str:
    """``MLFLOW_TRACKING_URI`` wins over the config (DESIGN §8)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or cfg_uri or DEFAULT_URI


def get_experiment_id(client: MlflowClient, name: str, artifact_root: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=Path(artifact_root).resolve().as_uri())
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


def config_hash(cfg: dict, corpus_digest: str, evalset_digest: str) -> str:
    """Hash of everything that determines results: the semantic config plus the data digests."""
    from rag_experiments.cache import stable_hash

    semantic = {k: v for k, v in cfg.items() if k not in NON_SEMANTIC}
    return stable_hash("config", semantic, corpus_digest, evalset_digest)[:16]


def find_finished(client: MlflowClient, experiment_id: str, chash: str):
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.config_hash = '{chash}' and attributes.status = 'FINISHED'",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    return runs[0] if runs else None


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


def sweep_context() -> dict | None:
    """Set by the multirun callback; None for a single (non-multirun) job."""
    raw = os.environ.get(SWEEP_ENV)
    return json.loads(raw) if raw else None


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
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
    ``force``; a file lock keeps parallel workers from creating two parents.
    """
    lock = Path(tempfile.gettempdir()) / "rag_experiments_locks" / f"{sweep['invocation']}.lock"
    with _file_lock(lock):
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
                return r.info.run_id, r.data.tags["sweep_id"]
        sweep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
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


# ------------------------------------------------------------------------------ child runs


def _batched(seq: list, n: int):
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def start_child(
    client: MlflowClient, experiment_id: str, run_name: str, tags: dict[str, str], params: dict[str, str]
) -> str:
    run = client.create_run(experiment_id, run_name=run_name, tags=tags)
    rid = run.info.run_id
    items = [Param(k[:250], v[:6000]) for k, v in sorted(params.items())]
    for batch in _batched(items, 100):
        client.log_batch(rid, params=batch)
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
    metrics = [
        Metric(k, float(v), now, 0)
        for k, v in sorted(aggregates.items())
        if v is not None and not (isinstance(v, float) and math.isnan(v))
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


def ui_command(uri: str, artifact_root: str) -> str:
    """A UI command that works from any shell: this venv's Python, absolute store and artifact paths."""
    import shlex
    import sys

    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):  # relative to the cwd
        uri = "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    root = Path(artifact_root).resolve()
    return (
        f"MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false {shlex.quote(sys.executable)} -m mlflow server "
        f"--backend-store-uri {shlex.quote(uri)} --default-artifact-root {shlex.quote(str(root))} "
        f"--workers 1 --port 5000   # then open http://127.0.0.1:5000"
    )
