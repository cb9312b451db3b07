"""What a run records about where it ran and how to look at it: git state, package versions,
the runner (``host:pid``) and the MLflow UI command. Reads only; writes nothing to MLflow."""

from __future__ import annotations

import os
import socket
import subprocess
from importlib import metadata
from pathlib import Path

from rag_experiments.tracking.uri import is_server


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
