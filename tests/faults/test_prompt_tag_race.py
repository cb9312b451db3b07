"""Issue 31 item 12: "an intermittent 'UNIQUE constraint failed: registered_model_tags' warning with
an SQL dump on a fresh store".

Cause: ``MlflowClient.register_prompt`` links the new prompt to the active experiment in a
background thread of its own (read the prompt's ``_mlflow_experiment_ids`` tag, then write it),
outside our per-prompt host lock. Our ``link_prompt_to_experiment`` writes the same tag; when the
thread's read comes before our write and its write after it, its insert loses (the store writes a
tag as select-then-insert) and MLflow logs the IntegrityError, SQL statement included. Which one
wins depends on thread scheduling (load), hence "intermittent": the fault injection below holds
the thread between its read and its write, which makes the bad order certain.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]

# A sweep job's registration step (a separate process, as joblib's are), with MLflow's link thread
# held 1 s between the store's select and insert of the prompt tag (the fault: a slow thread under
# load; SQLAlchemy's merge selects at once and inserts at the flush).
_JOB = r"""
import sys, threading, time
from mlflow.tracking import MlflowClient
from sqlalchemy import event
from sqlalchemy.orm import Session

uri, exp, start = sys.argv[1], sys.argv[2], float(sys.argv[3])

@event.listens_for(Session, "before_flush")
def slow_in_mlflows_link_thread(session, *_):
    if threading.current_thread().name.startswith("link_prompt_to_experiment_thread"):
        time.sleep(1.0)

from rag_experiments.tracking import prompt_registry as pr

client = MlflowClient(tracking_uri=uri)
client.get_experiment(exp)  # the store opened before the start line
time.sleep(max(0.0, start - time.time()))
template = next(t for t in pr.bundled_templates() if t.name == "concise")
print(pr.register(client, template, exp))
time.sleep(2.0)  # MLflow's thread (if still running) ends before the process does
"""


def test_jobs_registering_one_prompt_on_a_fresh_store_print_no_sql(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("sweep")  # the parent run's experiment; no prompt yet
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.time() + 8  # after every process has imported MLflow and opened the store
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _JOB, uri, exp, str(start)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    stderr = "\n".join(err for _, err in outs)
    assert [p.returncode for p in procs] == [0, 0, 0], stderr
    assert [out.strip().splitlines()[-1] for out, _ in outs] == ["('rag-experiments.concise', 1)"] * 3
    assert "UNIQUE constraint" not in stderr and "[SQL:" not in stderr, stderr
    assert "Failed to tag prompt" not in stderr, stderr
    prompt = client.get_prompt("rag-experiments.concise")
    assert prompt.tags["_mlflow_experiment_ids"] == f",{exp},"
    assert len(client.search_prompt_versions("rag-experiments.concise")) == 1


def test_only_the_lost_insert_race_of_mlflows_link_thread_is_silenced(caplog):
    """Across hosts no lock orders MLflow's thread: its lost race is dropped (our link re-reads and
    writes after it), any other failure of the thread still reaches the user."""
    import logging

    from rag_experiments.tracking.mlflow_adapter_session import quiet_lost_prompt_link_races

    quiet_lost_prompt_link_races()
    log = logging.getLogger("mlflow.tracking.client")
    with caplog.at_level(logging.WARNING, logger="mlflow.tracking.client"):
        log.warning(
            "Failed to tag prompt 'p' with experiment ID 1. Error: (sqlite3.IntegrityError) UNIQUE "
            "constraint failed: registered_model_tags.workspace\n[SQL: INSERT INTO registered_model_tags]"
        )
        log.warning("Failed to tag prompt 'p' with experiment ID 1. Error: database is locked")
    assert [r.getMessage() for r in caplog.records] == [
        "Failed to tag prompt 'p' with experiment ID 1. Error: database is locked"
    ]
