"""Partial generation errors (2 of 4 requests HTTP 400): the run is FINISHED with its errors
counted, and a re-run retries exactly the failed items instead of skipping the config.

The job runs in-process through ``run.sweep.run_job`` into the in-memory run store
(``tracking.run_store.MemoryRunStore``): what is checked is the pipeline and the resume rule, which
``tests/test_run_store.py`` holds the MLflow store to as well."""

from __future__ import annotations

from rag_experiments.run.sweep import run_job
from rag_experiments.tracking.memory import MemoryStore
from rag_experiments.tracking.run_store import MemoryRunStore
from tests.llm_fixtures import fake_llm  # noqa: F401 - fixture
from tests.sweep_helpers import tiny_job


def test_a_run_with_failed_items_is_resumed_for_those_items_only(fake_llm, tmp_path, capsys):  # noqa: F811
    job = tiny_job(
        tmp_path,
        "generator=openai",
        f"generator.base_url={fake_llm.base_url}",
        "generator.model=flaky400",
        "generator.max_retries=0",
        "generation_subset=null",
        "judge=none",  # what is checked is the generator's errors; a judge (MiniLM) took 3/4 of the time
        n_items=4,
    )
    store = MemoryRunStore(MemoryStore(), "test")
    run_job(job, store)
    first = capsys.readouterr().out
    assert "errors 2" in first, first[-2000:]
    assert sorted(fake_llm.attempts.values()) == [1, 1, 1, 1]

    run_job(job, store)
    again = capsys.readouterr().out
    assert "[skip]" not in again and "[rerun]" in again, again[-2000:]
    assert "errors 0" in again, again[-2000:]
    assert sorted(fake_llm.attempts.values()) == [1, 1, 2, 2]  # only the 2 failed items were asked again
    runs = sorted(store.store.runs.values(), key=lambda r: r.start_time, reverse=True)
    assert len(runs) == 2 and runs[0].metrics["n_errors"] == 0 and runs[1].metrics["n_errors"] == 2
    assert {r.status for r in runs} == {"FINISHED"}

    run_job(job, store)
    assert "[skip]" in capsys.readouterr().out  # complete now: reused
    assert len(store.store.runs) == 2
