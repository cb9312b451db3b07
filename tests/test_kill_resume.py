"""SIGKILL in the middle of generation loses only the requests in flight.

A real default-config run (local SmolLM2 through llama.cpp, heuristic judge) on the tiny corpus,
with short prompts and answers so it stays quick on a loaded 2-core machine (``FAST``), is killed with SIGKILL as soon as the stage cache holds its first committed generation. The re-run
must call the model only for the answers that were not committed, and its per-query results must
equal those of an uninterrupted run in a separate store and cache.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from mlflow.tracking import MlflowClient

from rag_experiments.tracking.runs import load_per_query
from tests.llm_fixtures import requires_smollm2
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

N_ITEMS = 4
FAST = ("retriever.k=2", "generator.max_tokens=32")
VOLATILE = ("latency_", "generation_cached")  # timings and cache provenance differ by design


def _n_generations(cache: Path) -> int:
    try:
        with sqlite3.connect(cache / "kv.sqlite", timeout=5) as db:
            return db.execute("SELECT COUNT(*) FROM kv WHERE stage='generations'").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def _finished_run(root: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    exp = client.get_experiment_by_name("test")
    (run,) = client.search_runs([exp.experiment_id], filter_string="attributes.status = 'FINISHED'")
    table = load_per_query(client, run)
    keep = [c for c in table.columns if not c.startswith(VOLATILE)]
    return run, table[keep].sort_values("id").reset_index(drop=True)


@requires_smollm2
def test_sigkill_mid_generation_then_resume_calls_only_the_missing(tmp_path):
    docs, ev = make_tiny(tmp_path, n_items=N_ITEMS)
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    ref.mkdir()
    killed.mkdir()

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag_experiments.sweep", *sweep_args(killed, docs, ev), *FAST],
        cwd=killed,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 600
        while _n_generations(killed / "cache") == 0:
            assert proc.poll() is None, "the run ended before its first generation was committed"
            assert time.monotonic() < deadline, "no generation committed within 600 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    committed = _n_generations(killed / "cache")
    assert 0 < committed < N_ITEMS, f"{committed} generations committed: the kill was not mid-generation"

    run_sweep(killed, *sweep_args(killed, docs, ev), *FAST)  # the resume
    run_sweep(ref, *sweep_args(ref, docs, ev), *FAST)  # uninterrupted, own store and cache

    resumed_run, resumed = _finished_run(killed)
    ref_run, reference = _finished_run(ref)
    calls = json.loads(resumed_run.data.tags["model_calls"])
    assert calls.get("generation", 0) == N_ITEMS - committed, calls
    assert calls.get("retrieval", 0) == 0, calls  # rankings were committed before the kill
    assert json.loads(ref_run.data.tags["model_calls"])["generation"] == N_ITEMS
    assert resumed["answer"].str.len().gt(0).all()
    pd.testing.assert_frame_equal(resumed, reference)
