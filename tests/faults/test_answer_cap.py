"""An endpoint that ignores ``max_tokens`` (2 MB answers): answers are cut at
``generator.max_answer_chars`` (default ``max_tokens * 16``) and the cuts are counted."""

from __future__ import annotations

import pandas as pd
from mlflow.tracking import MlflowClient

from rag_experiments.stages.generation import OpenAICompatibleGenerator
from tests.llm_fixtures import fake_llm  # noqa: F401 - fixture
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


def test_default_cap_follows_max_tokens_and_an_explicit_one_enters_the_identity():
    gen = OpenAICompatibleGenerator(base_url="http://127.0.0.1:9/v1", model="m", max_tokens=64)
    assert gen.max_answer_chars == 64 * 16 and "max_answer_chars" not in gen.identity  # default run unchanged
    capped = OpenAICompatibleGenerator(base_url="http://127.0.0.1:9/v1", model="m", max_answer_chars=100)
    assert capped.max_answer_chars == 100 and '"max_answer_chars": 100' in capped.identity


def test_huge_answers_are_cut_and_counted(fake_llm, tmp_path):  # noqa: F811
    docs, ev = make_tiny(tmp_path, n_items=3)
    p = run_sweep(
        tmp_path,
        "generator=openai",
        f"generator.base_url={fake_llm.base_url}",
        "generator.model=huge",
        "generator.max_tokens=64",
        "generator.max_retries=0",
        "generation_subset=null",
        "retriever=bm25",
        "judge=heuristic",
        *sweep_args(tmp_path, docs, ev),
    )
    assert "3 answers cut at generator.max_answer_chars=1024" in p.stdout + p.stderr, p.stderr[-2000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    assert run.data.metrics["n_answer_truncated"] == 3
    table = pd.read_parquet(client.download_artifacts(run.info.run_id, "per_query.parquet", str(tmp_path)))
    assert table["answer"].str.len().max() == 1024 and table["answer_truncated"].all()
