"""What one run is made of (docs/architecture.md, "The run path"): typed, built once, read by name.

``Stages`` holds the built stage objects, typed by their Protocols; ``PipelineData`` the documents
and eval items; ``RunSettings`` the plain values (k, ks, metric settings, seed, subset …).
``run_pipeline(stages, data, settings, cache)`` takes these three plus the stage cache;
``assemble.build`` makes them from a Hydra config. ``JobSettings`` is the rest of a sweep job's
config, typed (tracking, traces, racing, the judge card, naming): assembly builds it once and
nothing after it reads the Hydra config. No Hydra or MLflow here.
"""

from __future__ import annotations

from collections.abc import Mapping
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
from rag_experiments.judge.validity import CardSettings
from rag_experiments.stages.app import App
from rag_experiments.stages.chunking import Chunker
from rag_experiments.stages.embedding import Embedder
from rag_experiments.stages.generation import Generator
from rag_experiments.stages.history import HistoryQuery
from rag_experiments.stages.prompts import PromptTemplate
from rag_experiments.stages.query import QueryTransform
from rag_experiments.stages.rerank import Reranker
from rag_experiments.stages.retrieval import Retriever
from rag_experiments.tracking.trace_settings import TraceSettings


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
    app: App | None = None  # app=python|http: your application answers (docs/app.md)
    history: HistoryQuery | None = None  # history=last_turn: each turn searches its last question
    # the stage of every other slot declared in core.slots (read as ``stages.<name>``): a new slot
    # needs no field here (run.assemble builds it from its group)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        extra = self.__dict__.get("extra") or {}
        if name in extra:
            return extra[name]
        raise AttributeError(name)

    @property
    def generates(self) -> bool:
        return self.generator is not None or self.app is not None

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


@dataclass(frozen=True)
class RaceSettings:
    """A racing config's settings (``racing.*``, docs/racing.md); ``primary`` is resolved (null →
    the sweep's headline metric) and ``higher_is_better`` read from the registry at assembly."""

    batch_size: int
    alpha: float
    primary: str
    higher_is_better: bool
    seed: int
    wait_timeout_s: float


@dataclass(frozen=True)
class JobSettings:
    """A sweep job's config past assembly (``assemble.job_settings``): nothing below reads Hydra.

    ``run``: the pipeline's :class:`RunSettings`; ``full``: the resolved config as plain data (the
    run's params and ``config_hash``); ``config_yaml``: the same, as the logged ``config.yaml``;
    ``choices``: the Hydra group choices (``chunking`` = ``fixed``); ``overrides``: the job's
    command-line overrides; ``sweep``: the multirun context (``.sweep.json``; None for a single
    run), ``sweep_dir`` its folder and ``job_num`` Hydra's job number; ``tracking_uri``,
    ``artifact_root``, ``timeout_s`` (tracking.*), ``experiment_name``, ``force``, ``cache_dir``,
    ``cache_enabled``, ``progress``: the keys of those names; ``traces``: the trace settings;
    ``card``: the judge card's (None: no ``judge_card`` block); ``racing``: None unless
    ``racing.enabled``; ``racing_primary``: the raw ``racing.primary`` (the pilot line's metric).
    """

    run: RunSettings
    full: dict[str, Any]
    config_yaml: str
    experiment_name: str
    tracking_uri: str | None = None
    artifact_root: str | None = None
    timeout_s: float | None = None
    force: bool = False
    cache_dir: str = ".cache"
    cache_enabled: bool = True
    progress: bool = True
    choices: dict[str, str] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    sweep: dict[str, Any] | None = None
    sweep_dir: str | None = None
    job_num: int = 0
    traces: TraceSettings = field(default_factory=TraceSettings)
    card: CardSettings | None = None
    racing: RaceSettings | None = None
    racing_primary: str | None = None
