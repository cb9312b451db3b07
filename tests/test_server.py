"""Team tracking against a real MLflow server (PostgreSQL backend, proxied artifacts).

The server is started by ``scripts/mlflow_server.sh`` (as a user would) once per session. A
two-config sweep runs with two joblib writers at once from one working directory, which is then
deleted; compare, gate and report run from another, empty directory knowing only the tracking URI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.tracking.uri import DEFAULT_TRACKING_URI, artifact_location, is_server, tracking_uri
from tests.sweep_helpers import REPO, free_port, make_tiny, run_sweep

SCRIPT = REPO / "scripts" / "mlflow_server.sh"


@pytest.fixture(scope="session")
def mlflow_server():
    # Not pytest's tmp_path: as root, PostgreSQL runs as `postgres`, which must enter the directory.
    d = Path(tempfile.mkdtemp(prefix="rag-mlflow-"))
    d.chmod(0o755)
    # a throwaway store: no fsync (MLflow's ~100 schema migrations dominate start-up otherwise)
    env = {**os.environ, "PYTHON": sys.executable, "MLFLOW_PG_OPTS": "-c fsync=off -c synchronous_commit=off"}
    script = ["bash", str(SCRIPT)]
    try:
        p = subprocess.run(
            [*script, "start", str(d), str(free_port())],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, f"server did not start:\n{p.stdout}\n{p.stderr}"
        uri = p.stdout.strip().splitlines()[-1]
        again = subprocess.run(
            [*script, "start", str(d)], env=env, capture_output=True, text=True, timeout=60
        )
        assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == uri, "start is idempotent"
        yield {"uri": uri, "dir": d}
    finally:
        subprocess.run([*script, "stop", str(d)], env=env, capture_output=True, timeout=120)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def swept(mlflow_server, tmp_path_factory):
    uri = mlflow_server["uri"]
    root = tmp_path_factory.mktemp("sweeper")
    docs, ev = make_tiny(root)
    args = [
        "-m",
        "retriever.k=3,5",
        "generator=none",
        "retriever=bm25",  # this module tests tracking: no embedding model to load
        "corpus=dir",
        f"corpus.path={docs}",
        "evalset=file",
        f"evalset.path={ev}",
        "tracking=server",
        f"tracking.uri={uri}",
        f"cache_dir={root}/cache",
        "progress=false",
        f"hydra.sweep.dir={root}/multirun",
        "experiment_name=team",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",  # two writers at once against the server
    ]
    p = run_sweep(root, *args, timeout=600)
    left = sorted(x.name for x in root.iterdir())
    shutil.rmtree(root)  # nothing the sweep left on this machine is needed from here on
    return {"uri": uri, "left": left, "stdout": p.stdout}


def test_tracking_uri_rule(monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri() == DEFAULT_TRACKING_URI == "sqlite:///mlflow.db"
    assert tracking_uri("http://cfg:5000") == "http://cfg:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert tracking_uri("http://cfg:5000") == "http://env:5000"
    assert (
        "MLFLOW_TRACKING_URI=http://env:5000 is used; it overrides http://cfg:5000" in capsys.readouterr().err
    )
    assert tracking_uri() == "http://env:5000"
    assert is_server("https://x") and not is_server("sqlite:///x.db")
    assert artifact_location("http://x:5000", "mlruns") is None
    assert artifact_location("sqlite:///m.db", "mlruns") == (Path.cwd() / "mlruns").as_uri()


def test_sweep_writes_only_to_the_server(swept):
    c = MlflowClient(tracking_uri=swept["uri"])
    exp = c.get_experiment_by_name("team")
    assert exp.artifact_location.startswith("mlflow-artifacts:"), exp.artifact_location
    runs = c.search_runs([exp.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("is_parent") == "true"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert {r.data.params["retriever.k"] for r in children} == {"3", "5"}
    for r in children:
        assert r.info.artifact_uri.startswith("mlflow-artifacts:"), r.info.artifact_uri
        assert {"per_query.parquet", "per_query.json"} <= {a.path for a in c.list_artifacts(r.info.run_id)}
    # no local store was created next to the sweep
    assert not {"mlflow.db", "mlruns", "mlartifacts"} & set(swept["left"]), swept["left"]


def test_compare_gate_report_from_an_empty_directory(swept, tmp_path):
    """What a CI job on another machine does: only MLFLOW_TRACKING_URI, no local files."""
    c = MlflowClient(tracking_uri=swept["uri"])
    exp = c.get_experiment_by_name("team")
    runs = c.search_runs([exp.experiment_id], max_results=100)
    by_k = {r.data.params["retriever.k"]: r.info.run_id for r in runs if "mlflow.parentRunId" in r.data.tags}
    sweep_id = next(r.data.tags["sweep_id"] for r in runs if r.data.tags.get("is_parent") == "true")
    code = textwrap.dedent(
        f"""
        import json
        from rag_experiments.cli import compare, gate
        from rag_experiments.report import cli as build
        rc = {{
            "compare": compare.main(["{by_k["3"]}", "{by_k["5"]}", "--resamples", "200"]),
            "gate": gate.main(["--baseline", "{by_k["3"]}", "--candidate", "{by_k["5"]}",
                               "--metric", "mrr", "--resamples", "200"]),
            "report": build.main(["{sweep_id}", "--out", "rep", "--resamples", "200"]),
        }}
        print("RC=" + json.dumps(rc))
        """
    )
    env = {**os.environ, "MLFLOW_TRACKING_URI": swept["uri"], "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rc = json.loads(p.stdout.split("RC=")[-1])
    # mrr at k=3 and k=5 is the same ranking: the gate passes; nothing is an input error (2)
    assert rc == {"compare": 0, "gate": 0, "report": 0}, (rc, p.stdout[-3000:], p.stderr[-3000:])
    assert (tmp_path / "rep").is_dir() and any((tmp_path / "rep").glob("*.md"))
    parent = next(r for r in runs if r.data.tags.get("is_parent") == "true")
    logged = {a.path for a in c.list_artifacts(parent.info.run_id)}
    assert any(p_.startswith("report") for p_ in logged), logged
    assert sorted(x.name for x in tmp_path.iterdir()) == ["rep"], "no local store was created"
