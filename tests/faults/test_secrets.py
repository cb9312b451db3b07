"""An endpoint that echoes the API key in its errors: the key is stored and printed nowhere.

The key sits in a variable whose name does not look secret (``RAG_FAULTS_ECHO``): only the
stage's ``api_key_env`` registration (``redaction.register_secret_env``) can find it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.core.redaction import error_text, redact, register_secret_env
from rag_experiments.stages.generation import OpenAICompatibleGenerator
from tests.llm_fixtures import fake_llm  # noqa: F401 - the misbehaving OpenAI-compatible server
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

KEY = "xq7Q-DoNotLeak-4f9e8d7c6b5a4f3e2d1c"
ENV = "RAG_FAULTS_ECHO"


@pytest.mark.parametrize(
    "text,gone,kept",
    [
        ("Authorization: Bearer abcdefghijklmnop123", "abcdefghijklmnop123", "Authorization: Bearer"),
        ("Incorrect API key provided: sk-proj-abcdefghijklmnopqrstu", "abcdefghijklmnopqrstu", "provided:"),
        ('{"api_key": "zzzzzzzzzzzzzzzz"}', "zzzzzzzzzzzzzzzz", "api_key"),
        ("connection refused", None, "connection refused"),
        ("store postgresql://mlflow:s3cr3t-pw@db:5432/mlflow failed", "s3cr3t-pw", "postgresql://mlflow:"),
    ],
)
def test_credential_shapes_are_redacted(text, gone, kept):
    out = redact(text)
    assert kept in out and (gone is None or gone not in out), out


def test_registered_and_secret_named_variables_are_redacted(monkeypatch):
    monkeypatch.setenv(ENV, KEY)
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-1234567890")
    register_secret_env(ENV)
    out = redact(f"bad key {KEY} and tok-1234567890 here")
    assert KEY not in out and "tok-1234567890" not in out and f"[REDACTED ${ENV}]" in out, out
    # redacted before the cut: a truncated message never keeps part of the key
    cut = error_text(ValueError("x" * 480 + KEY), limit=500)
    assert KEY[:10] not in cut


def test_generator_error_from_an_echoing_endpoint_has_no_key(fake_llm, monkeypatch):  # noqa: F811
    monkeypatch.setenv(ENV, KEY)
    gen = OpenAICompatibleGenerator(
        base_url=fake_llm.base_url, model="echokey", api_key_env=ENV, max_retries=0, timeout_s=5
    )
    err = gen.complete([{"role": "user", "content": "hi"}]).error
    assert err and err.startswith("HTTP 401") and KEY not in err and f"[REDACTED ${ENV}]" in err, err


def test_echoed_key_is_stored_nowhere(fake_llm, tmp_path):  # noqa: F811
    docs, ev = make_tiny(tmp_path, n_items=3)
    args = [
        "generator=openai",
        f"generator.base_url={fake_llm.base_url}",
        "generator.model=echokey",
        f"generator.api_key_env={ENV}",
        "generator.max_retries=0",
        "generation_subset=null",
        "retriever=bm25",
        "judge=heuristic",
        *sweep_args(tmp_path, docs, ev),
    ]
    os.environ[ENV] = KEY
    try:
        p = run_sweep(tmp_path, *args, check=False)
    finally:
        del os.environ[ENV]
    assert p.returncode == 1 and "queries errored" in p.stderr, p.stderr[-3000:]  # every item failed
    assert KEY not in p.stdout + p.stderr
    leaked = [f for f in Path(tmp_path).rglob("*") if f.is_file() and KEY.encode() in f.read_bytes()]
    assert not leaked, leaked
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    table = pd.read_parquet(client.download_artifacts(run.info.run_id, "per_query.parquet", str(tmp_path)))
    errors = [e for e in table["error"] if e]
    assert errors and all(f"[REDACTED ${ENV}]" in e for e in errors), errors[:2]
    assert json.loads(run.data.tags["model_calls"])  # the endpoint was really called


SK = "sk-proj-Zz9Yy8Xx7Ww6Vv5Uu4Tt3"


def test_a_secret_in_a_200_answer_is_stored_nowhere(fake_llm, tmp_path):  # noqa: F811
    docs, ev = make_tiny(tmp_path, n_items=3)
    args = [
        "generator=openai",
        f"generator.base_url={fake_llm.base_url}",
        "generator.model=leakkey",
        f"generator.api_key_env={ENV}",
        "generator.max_retries=0",
        "generation_subset=null",
        "retriever=bm25",
        "judge=heuristic",
        *sweep_args(tmp_path, docs, ev),
    ]
    os.environ[ENV] = KEY
    try:
        p = run_sweep(tmp_path, *args)
    finally:
        del os.environ[ENV]
    assert KEY not in p.stdout + p.stderr and SK not in p.stdout + p.stderr
    leaked = [
        f for f in Path(tmp_path).rglob("*") if f.is_file() and (KEY.encode() in (b := f.read_bytes()) or SK.encode() in b)
    ]
    assert not leaked, leaked  # store, per-query table, traces, cache
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    table = pd.read_parquet(client.download_artifacts(run.info.run_id, "per_query.parquet", str(tmp_path)))
    answers = [a for a in table["answer"] if a]
    assert answers and all(f"[REDACTED ${ENV}]" in a and "sk-[REDACTED]" in a for a in answers), answers[:2]
