"""``prompt=registry`` with bad input or an unreachable registry: exit 2 before any run exists,
naming the registry entry (or the server), within the tracking client's bounded timeout."""

from __future__ import annotations

import time

from mlflow.tracking import MlflowClient

from rag_experiments.tracking import prompt_registry as pr
from tests.sweep_helpers import free_port, make_tiny, run_sweep, sweep_args

CONCISE = "rag-experiments.concise"


def _args(root, *extra: str) -> list[str]:
    docs, ev = make_tiny(root, n_items=3)
    return [
        *sweep_args(root, docs, ev),
        "generator=openai",
        f"generator.base_url=http://127.0.0.1:{free_port()}/v1",  # never reached: no run starts
        "generator.api_key_env=null",
        "retriever=bm25",
        "prompt=registry",
        f"prompt.name={CONCISE}",
        *extra,
    ]


def _store_with_concise(root) -> MlflowClient:
    client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    exp = client.create_experiment("test")
    pr.register(client, next(t for t in pr.bundled_templates() if t.name == "concise"), exp)
    return client


def _runs(client: MlflowClient) -> list:
    exp = client.get_experiment_by_name("test")
    return client.search_runs([exp.experiment_id]) if exp else []


def test_unknown_version_in_a_sweep_exits_2_before_any_run(tmp_path):
    client = _store_with_concise(tmp_path)
    p = run_sweep(tmp_path, "-m", *_args(tmp_path, "prompt.version=1,9"), check=False)
    assert p.returncode == 2, p.stderr[-3000:]
    assert "no run was created" in p.stderr
    assert (
        f"conf/prompt: version: prompts:/{CONCISE}/9 does not exist" in p.stderr
        and "(versions: 1)" in p.stderr
    )
    assert "Traceback" not in p.stderr and _runs(client) == []


def test_unknown_alias_in_a_single_run_exits_2_naming_it(tmp_path):
    client = _store_with_concise(tmp_path)
    client.set_prompt_alias(CONCISE, "production", 1)
    p = run_sweep(tmp_path, *_args(tmp_path, "prompt.alias=staging"), check=False)
    assert p.returncode == 2, p.stderr[-3000:]
    assert f"prompts:/{CONCISE}@staging does not exist" in p.stderr and "production → 1" in p.stderr
    assert "Traceback" not in p.stderr and _runs(client) == []


def test_unreachable_registry_exits_2_within_the_budget(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nobody listens: the server is down
    args = [a for a in _args(tmp_path, "prompt.version=1") if not a.startswith("tracking.uri")]
    t0 = time.monotonic()
    p = run_sweep(tmp_path, "-m", *args, f"tracking.uri={uri}", "tracking.timeout_s=5", check=False)
    took = time.monotonic() - t0
    assert p.returncode == 2, p.stderr[-3000:]
    assert f"tracking server {uri} is unreachable (connection refused)" in p.stderr, p.stderr[-3000:]
    assert "gives up within 5 s" in p.stderr and "Traceback" not in p.stderr
    assert took < 120, took  # process start + one bounded call, not MLflow's default ≈ 4 min of retries
