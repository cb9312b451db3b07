"""Partial generation errors (2 of 4 requests HTTP 400): the run is FINISHED with its errors
counted, and a re-run retries exactly the failed items instead of skipping the config."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from tests.llm_fixtures import fake_llm  # noqa: F401 - fixture
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


def test_a_run_with_failed_items_is_resumed_for_those_items_only(fake_llm, tmp_path):  # noqa: F811
    docs, ev = make_tiny(tmp_path, n_items=4)
    args = [
        "generator=openai",
        f"generator.base_url={fake_llm.base_url}",
        "generator.model=flaky400",
        "generator.max_retries=0",
        "generation_subset=null",
        "retriever=bm25",
        "judge=heuristic",
        *sweep_args(tmp_path, docs, ev),
    ]
    first = run_sweep(tmp_path, *args)
    assert "errors 2" in first.stdout, first.stdout[-2000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp_id = client.get_experiment_by_name("test").experiment_id
    asked = dict(fake_llm.attempts)
    assert sorted(asked.values()) == [1, 1, 1, 1]

    again = run_sweep(tmp_path, *args)
    assert "[skip]" not in again.stdout and "[rerun]" in again.stdout, again.stdout[-2000:]
    assert "errors 0" in again.stdout, again.stdout[-2000:]
    assert sorted(fake_llm.attempts.values()) == [1, 1, 2, 2]  # only the 2 failed items were asked again
    runs = client.search_runs([exp_id], order_by=["attributes.start_time DESC"])
    assert len(runs) == 2 and runs[0].data.metrics["n_errors"] == 0

    third = run_sweep(tmp_path, *args)
    assert "[skip]" in third.stdout  # complete now: reused
