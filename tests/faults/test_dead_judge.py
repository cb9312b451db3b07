"""A dead LLM judge (closed port, or a body that is not JSON) behind a working generator: the run
must fail like a dead generator does, with transport errors counted apart from unparseable replies.
"""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.llm_fixtures import closed_port_url, fake_llm  # noqa: F401 - fixtures
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


def _args(tmp_path, gen_url: str, judge_url: str, judge_model: str) -> list[str]:
    docs, ev = make_tiny(tmp_path, n_items=3)
    return [
        "generator=openai",
        f"generator.base_url={gen_url}",
        "generator.model=ok",
        "generator.max_retries=0",
        "generation_subset=null",
        "retriever=bm25",
        "judge=openai",
        f"judge.base_url={judge_url}",
        f"judge.model={judge_model}",
        "judge.max_retries=0",
        "judge.timeout_s=2",
        *sweep_args(tmp_path, docs, ev),
    ]


@pytest.mark.parametrize("dead", ["closed", "malformed"])
def test_dead_judge_fails_the_run_and_a_rerun_retries_it(fake_llm, closed_port_url, tmp_path, dead):  # noqa: F811
    judge_url = closed_port_url if dead == "closed" else fake_llm.base_url
    args = _args(tmp_path, fake_llm.base_url, judge_url, "malformed" if dead == "malformed" else "ok")
    first = run_sweep(tmp_path, *args, check=False)
    assert first.returncode == 1, first.stdout[-2000:] + first.stderr[-2000:]
    assert "judge" in first.stderr and "transport error" in first.stderr, first.stderr[-2000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp_id = client.get_experiment_by_name("test").experiment_id
    (run,) = client.search_runs([exp_id])
    assert run.info.status == "FAILED"
    m = run.data.metrics
    assert m["n_judge_errors"] > 0 and m["n_unparseable_verdicts"] == 0, m  # apart, not mixed
    again = run_sweep(tmp_path, *args, check=False)
    assert "[skip]" not in again.stdout and len(client.search_runs([exp_id])) == 2
