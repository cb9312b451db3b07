"""An endpoint that ignores ``max_tokens`` (2 MB answers): answers are cut at
``generator.max_answer_chars`` (default ``max_tokens * 16``) and the cuts are counted."""

from __future__ import annotations

from rag_experiments.run.sweep import run_job
from rag_experiments.stages.generation import OpenAICompatibleGenerator
from rag_experiments.tracking.memory import MemoryStore
from rag_experiments.tracking.run_store import MemoryRunStore
from tests.llm_fixtures import fake_llm  # noqa: F401 - fixture
from tests.sweep_helpers import tiny_job


def test_default_cap_follows_max_tokens_and_an_explicit_one_enters_the_identity():
    gen = OpenAICompatibleGenerator(base_url="http://127.0.0.1:9/v1", model="m", max_tokens=64)
    assert gen.max_answer_chars == 64 * 16 and "max_answer_chars" not in gen.identity  # default run unchanged
    capped = OpenAICompatibleGenerator(base_url="http://127.0.0.1:9/v1", model="m", max_answer_chars=100)
    assert capped.max_answer_chars == 100 and '"max_answer_chars": 100' in capped.identity


def test_huge_answers_are_cut_and_counted(fake_llm, tmp_path, caplog):  # noqa: F811
    """In-process through ``run_job`` into the in-memory run store (what is checked is the
    generation step's cut; the stored table's round trip through MLflow is ``test_run_writer``'s)."""
    job = tiny_job(
        tmp_path,
        "generator=openai",
        f"generator.base_url={fake_llm.base_url}",
        "generator.model=huge",
        "generator.max_tokens=64",
        "generator.max_retries=0",
        "generation_subset=null",
        "judge=heuristic",  # judges the cut answers
        "judge_card.enabled=false",  # the card (200 synthetic pairs) is no part of what is checked
        n_items=3,
    )
    store = MemoryRunStore(MemoryStore(), "test")
    with caplog.at_level("WARNING"):  # the CLI prints the warning on stderr (logging's last resort)
        run_job(job, store)
    assert "3 answers cut at generator.max_answer_chars=1024" in caplog.text, caplog.text[-2000:]
    (run,) = store.store.runs.values()
    assert run.status == "FINISHED" and run.metrics["n_answer_truncated"] == 3
    table = store.per_query(store.resume_decision(job.chash, run.tags["code_fingerprint"]).done)
    assert table["answer"].str.len().max() == 1024 and table["answer_truncated"].all()
