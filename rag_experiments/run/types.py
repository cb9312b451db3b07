"""What one run is made of (docs/architecture.md, "The run path"): typed, built once, read by name.

``Stages`` holds the built stage objects, typed by their Protocols; ``PipelineData`` the documents
and eval items; ``RunSettings`` the plain values (k, ks, metric settings, seed, subset …).
``run_pipeline(stages, data, settings, cache)`` takes these three plus the stage cache;
``assemble.build`` makes them from a Hydra config. No Hydra or MLflow here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rag_experiments.core.identity import model_identities
from rag_experiments.core.slots import SLOTS
from rag_experiments.core.types import Document, EvalItem
from rag_experiments.evaluation.defaults import (
    BOOTSTRAP_RESAMPLES,
    MIN_COVERAGE,
    RANK_DEPTH,
    TOKEN_BUDGETS,
)
from rag_experiments.judge.claims import Judge
from rag_experiments.stages.chunking import Chunker
from rag_experiments.stages.embedding import Embedder
from rag_experiments.stages.generation import Generator
from rag_experiments.stages.prompts import PromptTemplate
from rag_experiments.stages.query import QueryTransform
from rag_experiments.stages.rerank import Reranker
from rag_experiments.stages.retrieval import Retriever


@dataclass(frozen=True)
class Stages:
    """The built stages of one config. ``generator`` None: a retrieval-only run (no prompt, judge).

    ``chunking_cfg`` is the chunker's resolved config: it keys the chunk cache. ``embedder`` is the
    (cached) embedder the retriever was built with; it is built for every retriever, so its
    identity is part of ``config_hash`` even for BM25 (as before the typed path).
    """

    chunker: Chunker
    retriever: Retriever
    chunking_cfg: dict[str, Any] = field(default_factory=dict)
    embedder: Embedder | None = None
    query_transform: QueryTransform | None = None  # query=none: the retriever searches the question
    reranker: Reranker | None = None  # rerank=none: the retriever's list goes to the generator
    generator: Generator | None = None
    prompt: PromptTemplate | None = None
    judge: Judge | None = None
    judge_repeats: tuple[Judge, ...] = ()  # judge.repeats: the judges of repeats 2..N (docs/judges.md)

    @property
    def generates(self) -> bool:
        return self.generator is not None

    def identities(self) -> dict[str, str]:
        """``identity`` of every stage that has one (model bytes + settings), for ``config_hash``."""
        return model_identities({s.name: getattr(self, s.name) for s in SLOTS})


@dataclass(frozen=True)
class PipelineData:
    """The documents and the eval items a run scores; ``corpus_digest`` keys the chunk cache."""

    docs: list[Document]
    corpus_digest: str
    items: list[EvalItem]

    @classmethod
    def of(cls, corpus, evalset) -> PipelineData:
        """From a loaded ``evalset.corpus.Corpus`` and ``evalset.EvalSet``."""
        return cls(corpus.docs, corpus.digest, evalset.items)


@dataclass(frozen=True)
class RunSettings:
    """The run's plain settings (config keys in brackets).

    ``k`` (retriever.k): chunks given to the generator; ``ks`` (metrics.ks): every retrieval metric
    is scored at each k and at ``k``; ``min_coverage``, ``rank_depth``, ``token_budgets``,
    ``n_resamples`` (metrics.*): docs/metrics.md; ``seed``: bootstrap seed; ``generation_subset``:
    items generated and judged (None: all; ``evalset.subset.stratified_subset``); ``thresholds``
    (attribution): failure-label thresholds (None: the defaults); ``replicates``: generations per
    item, seeds ``seed + r`` (``stages.replicates``, docs/metrics.md); ``pricing``:
    ``{"generation": {...}, "judge": {...}}`` price tables for ``cost_usd``; ``progress``: progress
    lines for slow stages.
    """

    k: int
    ks: tuple[int, ...]
    min_coverage: float = MIN_COVERAGE
    rank_depth: int = RANK_DEPTH
    token_budgets: tuple[int, ...] = TOKEN_BUDGETS
    n_resamples: int = BOOTSTRAP_RESAMPLES
    seed: int = 0
    generation_subset: int | None = None
    thresholds: dict | None = None
    replicates: int = 1
    pricing: dict | None = None
    progress: bool = True

    @property
    def all_ks(self) -> list[int]:
        """Every k a metric is scored at: ``ks`` and ``k``, sorted."""
        return sorted(set(self.ks) | {self.k})

    @property
    def depth(self) -> int:
        """How deep each query is ranked: MRR and the token budgets read past max(ks)."""
        return max(*self.all_ks, self.rank_depth)
