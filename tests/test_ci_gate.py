"""The CI recipe (docs/ci.md) against a real local ``mlflow server``: the workflow's steps are
``scripts/ci_gate.sh`` calls, run here as the workflow runs them, with two candidate configs.

Checked: the Markdown parses as CommonMark (+ GFM tables), the exit codes (0 pass, 1 fail, 2 bad
input), and every link in it resolves on that server (the page, and the run or trace it names
through the server's REST API: HTTP 200).
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from tests.mlflow_ui import mlflow_server
from tests.sweep_helpers import REPO
from tests.test_gate_summary import links, parse, tables

pytestmark = pytest.mark.slow
SCRIPT = REPO / "scripts" / "ci_gate.sh"
WORKFLOW = REPO / "examples" / "github-actions-gate.yml"
CONFIG = ["retriever=bm25", "generator=none", "judge=none"]  # retrieval only: seconds per run


def test_workflow_calls_the_script_and_docs_show_the_file() -> None:
    wf = yaml.safe_load(WORKFLOW.read_text())
    steps = wf["jobs"]["gate"]["steps"]
    runs = [s for s in steps if "scripts/ci_gate.sh" in s.get("run", "")]
    assert [s["name"] for s in runs] == ["Baseline (push to main)", "Gate (pull request)"]
    assert runs[0]["env"]["GATE_MODE"] == "baseline"
    assert wf["jobs"]["gate"]["env"]["GATE_BASELINE_EXPERIMENT"] == runs[0]["env"]["GATE_EXPERIMENT"]
    script = SCRIPT.read_text()
    for var in ("MLFLOW_TRACKING_URI", "GATE_BASELINE_EXPERIMENT", "GATE_ARGS", "GATE_EXPERIMENT", "PYTHON"):
        assert var in script
    assert WORKFLOW.read_text().strip() in (REPO / "docs" / "ci.md").read_text()


def _gate(root: Path, uri: str, summary: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess:
    e = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHON": sys.executable,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "MLFLOW_TRACKING_URI": uri,
        "GATE_SUMMARY": str(summary),
        "GATE_BASELINE_EXPERIMENT": "ci-baseline",
        "GATE_EXPERIMENT": "ci-pr-7",
        "GATE_ARGS": "--resamples 500",
        **env,
    }
    e.pop("GITHUB_STEP_SUMMARY", None)
    return subprocess.run(
        ["bash", str(SCRIPT), *CONFIG, f"cache_dir={root}/cache", *overrides],
        cwd=root, env=e, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status


def _resolves(base: str, href: str) -> None:
    """The page answers 200, and the run or trace in its route exists on the server."""
    assert href.startswith(base + "/#/experiments/"), href
    assert _get(href.split("#")[0]) == 200
    route = urlsplit(href.split("#", 1)[1])
    parts = route.path.strip("/").split("/")
    if parts[2] == "runs":
        assert _get(f"{base}/api/2.0/mlflow/runs/get?run_id={parts[3]}") == 200
    else:
        assert parts[2] == "traces"
        trace = parse_qs(route.query)["selectedEvaluationId"][0]
        assert _get(f"{base}/api/3.0/mlflow/traces/{trace}") == 200


def test_ci_gate_script_on_a_tracking_server(tmp_path: Path) -> None:
    with mlflow_server(tmp_path / "server") as base:
        root = tmp_path / "ws"
        root.mkdir()
        p = _gate(root, base, tmp_path / "none.md", GATE_MODE="baseline", GATE_EXPERIMENT="ci-baseline")
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        assert "baseline run:" in p.stdout

        # the same config: identical per-query results, PASS
        same = tmp_path / "same.md"
        p = _gate(root, base, same)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        md = same.read_text()
        assert "Regression gate: ✅ PASS" in md and "No query is worse" in md
        for href in links(parse(md)):
            _resolves(base, href)

        # 120-character chunks: hit@5 drops by about 0.3, FAIL; its flipped queries link to traces
        worse = tmp_path / "worse.md"
        # the chunks differ: hit@5 and mrr are compared on purpose (the equal-budget metric is not logged here)
        p = _gate(root, base, worse, "chunking=fixed", "chunking.size=120", "chunking.overlap=0",
                  GATE_ARGS="--resamples 500 --metric hit_at_5 --metric mrr --allow-incomparable")
        assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
        md = worse.read_text()
        toks = parse(md)
        metrics, diff, flips = tables(toks)
        assert [r[0] for r in metrics[1:]] == ["hit_at_5", "mrr"] and metrics[1][8] == "FAIL"
        assert ["chunking", "markdown", "fixed"] in diff
        assert len(flips) == 11 and all(r[0] == "hit_at_5" for r in flips[1:])
        hrefs = links(toks)
        assert sum("/traces?selectedEvaluationId=" in h for h in hrefs) == 20  # 10 queries × 2 runs
        for href in hrefs:
            _resolves(base, href)

        # bad input: exit 2, the summary says the gate did not run
        for env, overrides, why in (
            ({"GATE_BASELINE": "no-such-run"}, (), "could not compare"),
            ({}, ("chunking=nope",), "sweep failed"),
            ({"GATE_BASELINE_EXPERIMENT": "nobody"}, (), "no baseline"),
        ):
            out = tmp_path / "bad.md"
            out.unlink(missing_ok=True)
            p = _gate(root, base, out, *overrides, **env)
            assert p.returncode == 2, (why, p.stdout[-2000:], p.stderr[-2000:])
            text = out.read_text()
            assert text.startswith("## Regression gate: not run") and why in text
            assert len(tables(parse(text))) == 0
