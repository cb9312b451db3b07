"""SIGTERM during a run: the run is KILLED and the process says so in one line, without a
``KeyboardInterrupt`` traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from mlflow.tracking import MlflowClient

from tests.llm_fixtures import fake_llm  # noqa: F401 - fixture
from tests.sweep_helpers import make_tiny, sweep_args


def test_sigterm_prints_no_traceback(fake_llm, tmp_path):  # noqa: F811
    fake_llm.slow_s = 6.0  # the run is inside generation when the signal comes (in-flight aborts: item 3)
    docs, ev = make_tiny(tmp_path, n_items=3)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    args = [
        "generator=openai",
        f"generator.base_url={fake_llm.base_url}",
        "generator.model=slow",
        "generator.timeout_s=120",
        "generation_subset=null",
        "retriever=bm25",
        "judge=heuristic",
        *sweep_args(tmp_path, docs, ev),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag_experiments.sweep", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        while not fake_llm.attempts and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert fake_llm.attempts, "the run never reached the generator"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert "SIGTERM" in err and "KILLED" in err, err[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    assert run.info.status == "KILLED"
