"""A dead LLM judge (closed port, or a body that is not JSON) behind a working generator: the run
must fail like a dead generator does, with transport errors counted apart from unparseable replies.

The job runs in-process through ``run.sweep.run_job`` into the in-memory run store
(``tracking.run_store.MemoryRunStore``); a failed single run exits 1 there (``sys.exit``), and the
CLI's exit code for such a run is checked end to end by the fault matrix
(``test_dead_reranker_and_transform_fail_the_cli_run``)."""

from __future__ import annotations

import pytest

from rag_experiments.run.sweep import run_job
from rag_experiments.tracking.memory import MemoryStore
from rag_experiments.tracking.run_store import MemoryRunStore
from tests.llm_fixtures import closed_port_url, fake_llm  # noqa: F401 - fixtures
from tests.sweep_helpers import tiny_job


def _job(tmp_path, gen_url: str, judge_url: str, judge_model: str):
    return tiny_job(
        tmp_path,
        "generator=openai",
        f"generator.base_url={gen_url}",
        "generator.model=ok",
        "generator.max_retries=0",
        "generation_subset=null",
        "judge=openai",
        f"judge.base_url={judge_url}",
        f"judge.model={judge_model}",
        "judge.max_retries=0",
        "judge.timeout_s=2",
        n_items=3,
    )


@pytest.mark.parametrize("dead", ["closed", "malformed"])
def test_dead_judge_fails_the_run_and_a_rerun_retries_it(fake_llm, closed_port_url, tmp_path, capsys, dead):  # noqa: F811
    judge_url = closed_port_url if dead == "closed" else fake_llm.base_url
    job = _job(tmp_path, fake_llm.base_url, judge_url, "malformed" if dead == "malformed" else "ok")
    store = MemoryRunStore(MemoryStore(), "test")
    with pytest.raises(SystemExit) as first:
        run_job(job, store)
    err = capsys.readouterr().err
    assert first.value.code == 1, err[-2000:]
    assert "judge" in err and "transport error" in err, err[-2000:]
    (run,) = store.store.runs.values()
    assert run.status == "FAILED"
    m = run.metrics
    assert m["n_judge_errors"] > 0 and m["n_unparseable_verdicts"] == 0, m  # apart, not mixed
    with pytest.raises(SystemExit):
        run_job(job, store)
    assert "[skip]" not in capsys.readouterr().out and len(store.store.runs) == 2
