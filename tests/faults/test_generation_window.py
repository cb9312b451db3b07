"""A dead generation endpoint under the default ``generation_subset`` and prompts larger than the
local model's window: neither may give a FINISHED run that a re-run then skips."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from rag_experiments.sweep import every_item_failed
from rag_experiments.tracking import writer
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


def test_every_item_failed_counts_the_generated_items_only():
    # the default subset generates 24 of 168 items: 24 errors is every generated item
    assert every_item_failed({"n_queries": 168, "n_generated": 24, "n_errors": 24})
    assert not every_item_failed({"n_queries": 168, "n_generated": 24, "n_errors": 23})
    assert not every_item_failed({"n_queries": 168, "n_errors": 0})  # retrieval only


def test_dead_endpoint_with_a_generation_subset_fails_and_is_retried(tmp_path):
    docs, ev = make_tiny(tmp_path, n_items=6)
    args = [
        "generator=openai",
        "generator.base_url=http://127.0.0.1:9/v1",
        "generator.timeout_s=1",
        "generator.max_retries=0",
        "generation_subset=2",  # 2 of 6 items generated, as 24 of 168 by default
        "retriever=bm25",
        "judge=heuristic",
        *sweep_args(tmp_path, docs, ev),
    ]
    first = run_sweep(tmp_path, *args, check=False)
    assert first.returncode != 0, first.stdout[-2000:]
    assert "every one of the 2 generated queries errored" in first.stderr, first.stderr[-2000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp_id = client.get_experiment_by_name("test").experiment_id
    (run,) = client.search_runs([exp_id])
    assert run.info.status == "FAILED"
    assert writer.find_finished(client, exp_id, run.data.tags["config_hash"]) is None
    again = run_sweep(tmp_path, *args, check=False)
    assert "[skip]" not in again.stdout and len(client.search_runs([exp_id])) == 2
