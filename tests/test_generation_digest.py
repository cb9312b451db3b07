"""A generating run's per-query table and metrics, pinned by a recorded digest.

The retrieval half is pinned in tests/test_run_path.py; this pins the generation half: the judge
metrics (heuristic judge, real MiniLM), the claim-level diagnostics, the judge-free answer metrics
(token F1, exact match, abstention, citations, grounding overlap) and the failure labels, on 20
sample items (3 unanswerable) answered by a deterministic OpenAI-compatible server on 127.0.0.1.
Its answers are chosen from the prompt's own lines by a hash: declines, cited quotes, an
out-of-range citation, an uncited quote, so every judge-free branch is taken. A refactor of how
metrics are computed must leave every recorded value unchanged (floats within
``tests.recorded.ABS_TOL``, since float32 scores follow the CPU and BLAS); a deliberate change of
a metric re-records them, saying why in the commit.
"""

from __future__ import annotations

import hashlib

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rag_experiments.core.cache import StageCache
from rag_experiments.evalset.corpus import Corpus
from rag_experiments.evalset.load import EvalSet, sample_dir
from rag_experiments.judge.validity import build_judge
from rag_experiments.run.pipeline import run_pipeline
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages.chunking import MarkdownChunker
from rag_experiments.stages.generation import OpenAICompatibleGenerator
from rag_experiments.stages.retrieval import BM25Retriever
from tests.llm_fixtures import ChatServer
from tests.recorded import check
from tests.sweep_helpers import REPO

# The expected table and aggregates: tests/fixtures/generation_digest.json (tests/recorded.py),
# recorded on 3824cda, where the earlier digests of rounded floats (3c9a404a…, c21c4c93…) also passed;
# re-recorded for issue 37 (weak key facts left out of correctness, the claim filter and the hedge
# rule, n_nonclaims / n_weak_key_facts) after the step loop passed the 3824cda recording unchanged;
# re-recorded for issue 45 (key facts count only when asserted): the only change is two new count
# columns, n_negated_key_facts and n_contradicted_key_facts, 0 on all 20 rows and in the aggregates;
# every other value was compared with the run before the change and is unchanged.
#: Columns left out of the digest: wall times, and cache / HTTP bookkeeping that differs run to run.
_VOLATILE = ("latency", "generation_cached", "search_queries")


def answer_for(prompt: str) -> str:
    """A deterministic answer built from the prompt's own lines (sha256 of the prompt picks it)."""
    h = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
    lines = [ln for ln in prompt.splitlines() if len(ln.split()) > 4]
    words = " ".join(lines[h // 7 % len(lines)].split()[:14]) if lines else "nothing"
    return (
        "I don't know.",
        f"{words} [1]",
        f"Answer: {words} [2] [9]",
        words,
        f"{words} [1][3]",
        "The context does not say.",
        f"Answer: {words}",
    )[h % 7]


def _prompt_of(body: dict) -> str:
    return "\n".join(m.get("content", "") for m in body["messages"])


@pytest.fixture(scope="module")
def server():
    chat = ChatServer(
        lambda body: answer_for(_prompt_of(body)), usage=lambda body: (len(_prompt_of(body).split()), 9)
    )
    yield chat.url
    chat.close()


def _recorded(res) -> tuple[list[dict], dict]:
    """Every row and column of the table but the volatile ones, and the aggregates but latency."""
    df = res.per_query.drop(columns=[c for c in res.per_query if c.startswith(_VOLATILE)])
    return df.to_dict(orient="records"), {k: v for k, v in res.aggregates.items() if "latency" not in k}


def test_generating_sample_run_unchanged(server, tmp_path) -> None:
    d = sample_dir()
    corpus = Corpus(str(d / "docs"))
    items = EvalSet(str(d / "evalset.jsonl"), corpus).items[30:50]
    assert sum(not it.answerable for it in items) == 3
    prompt = instantiate(OmegaConf.load(REPO / "rag_experiments" / "conf" / "prompt" / "cite.yaml"))
    stages = Stages(
        chunker=MarkdownChunker(),
        chunking_cfg={"_target_": "rag_experiments.stages.chunking.MarkdownChunker"},
        retriever=BM25Retriever(k=5),
        generator=OpenAICompatibleGenerator(base_url=server, model="digest"),
        prompt=prompt,
        judge=build_judge("heuristic"),
    )
    settings = RunSettings(k=5, ks=(1, 5), n_resamples=50, progress=False)
    res = run_pipeline(stages, PipelineData(corpus.docs, corpus.digest, items), settings, StageCache(tmp_path))
    df = res.per_query
    # every judge-free branch is taken: declines, citations in and out of range, uncited answers
    assert df["declined"].sum() >= 2 and (~df["declined"].astype(bool)).sum() >= 10
    assert df["n_citations_out_of_range"].sum() >= 1 and df["rate_uncited_answer"].eq(1.0).any()
    assert df["rate_false_answer"].notna().sum() == 3 and df["claim_recall"].notna().any()
    check("generation_digest", *_recorded(res))
