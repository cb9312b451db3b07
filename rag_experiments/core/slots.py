"""The stage slots, declared once, in pipeline order (docs/architecture.md, "Recipes").

A slot is one step of the pipeline that a config chooses an implementation for: its field on
``run.types.Stages``, its Hydra config group (``conf/<group>/``), the Protocol its implementations
follow, the cache namespaces it writes (``core.cache.stage_key``'s first argument) and the modules
whose code decides those entries (``core.identity.STAGE_CODE``). ``STAGE_GROUPS``, ``STAGE_CODE``
and ``Stages.identities`` derive from this list; ``tests/test_run_path.py`` checks that each entry
resolves (the Protocol imports, the group folder exists, ``Stages`` has the field).

Names only, no imports of the stages: this module sits in ``core/``, below them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    name: str  # the field on run.types.Stages
    group: str  # the Hydra config group
    protocol: str  # dotted name of the Protocol its implementations follow
    cache: tuple[str, ...]  # cache namespaces it writes
    code: tuple[str, ...]  # modules whose code decides those entries
    optional: bool = False  # None is a valid choice (generator=none: a retrieval-only run)
    # -- as a step of the run loop (run/steps.py); "" = not a step of its own (the embedder runs
    # inside the retriever's step, the prompt inside the generator's)
    step: str = ""  # its name in timings (``<step>_s``), model calls, progress and the status rule
    errors: str = ""  # the run metric counting the items it failed on (re-run retries them)
    error_column: str = ""  # the per-query column holding its error, when not named like ``errors``
    noun: str = "items"  # what its items are, in messages ("every one of the 8 reranked queries")
    position: int = 0  # its place in the run loop (the query transform runs before the retriever)
    column: str = ""  # its per-query columns' stem: ``latency_<column>_s`` (timed per query), "" none
    priced: bool = False  # its model calls report tokens: ``tokens_in_<column>`` / ``tokens_out_<column>``
    serving: bool = True  # part of answering a user (its latency is serving latency); False: evaluation
    replaces: tuple[str, ...] = ()  # slots that do not run when this one is configured (the app)
    runner: str = ""  # dotted name of its Step class (``run(state, ctx) -> StepRecord``): the run loop
    # builds it when the slot is configured (the answer phases' steps run once per replicate)
    span: str = ""  # its span type in a trace (an MLflow ``SpanType``: LLM, RETRIEVER, …); "" no span
    outputs: tuple[str, ...] = ()  # its per-query output columns: its span's outputs (tracking.traces)
    # the run's phase it belongs to (:data:`PHASES`): steps run phase by phase, by position within one
    phase: str = "before_answer"
    stands_in: tuple[str, ...] = ()  # slots whose step runs on this one's output instead of a model
    # added after runs were recorded: ``<group>: none`` is left out of config_hash, so those runs keep
    # their hash (core.identity.NEUTRAL_DEFAULTS)
    neutral_none: bool = False
    # the option that builds nothing (``<group>: {name: <off>}``): "none", or ``last_turn`` for the
    # history slot, whose default searches the question as every run did before it existed
    off: str = "none"
    # the stage cache's stores its entries go to (``StageCache.get_json_many``'s first argument) when
    # they are not named like ``cache``: a dry run counts their hits as the step's calls spared
    stores: tuple[str, ...] = ()

    @property
    def stored(self) -> tuple[str, ...]:
        """The stage cache's stores of its entries (``stores``, else its ``cache`` namespaces)."""
        return self.stores or self.cache


#: The run's phases, in order: retrieval (the state is ``run.steps.RunState``, once per run), then the
#: answer, what runs after the answer, judging (``run.answer.AnswerState``, once per replicate or
#: racing batch, on the generation subset).
PHASES = ("before_answer", "answer", "after_answer", "judging")

_EMBEDDING = "rag_experiments.stages.embedding"
_JUDGE_CODE = (
    "rag_experiments.judge",
    "rag_experiments.evaluation.declines",  # the claim splitter drops declining sentences
    _EMBEDDING,  # the metric embedder
    "rag_experiments.stages.generation",  # LLM judges call the model through it
)

SLOTS: tuple[Slot, ...] = (
    Slot("chunker", "chunking", "rag_experiments.stages.chunking.Chunker", ("chunks",),
         ("rag_experiments.stages.chunking",), step="chunking", position=1, noun="documents",
         runner="rag_experiments.run.retrieval.ChunkStep"),
    Slot("embedder", "embedding", "rag_experiments.stages.embedding.Embedder", ("vectors",),
         (_EMBEDDING, "rag_experiments.stages.vector_store")),
    Slot("retriever", "retriever", "rag_experiments.stages.retrieval.Retriever", ("rankings",),
         ("rag_experiments.stages.retrieval", _EMBEDDING, "rag_experiments.stages.vector_store"),
         step="retrieval", position=3, noun="queries", column="retrieval",
         runner="rag_experiments.run.retrieval.RetrieveStep", span="RETRIEVER", outputs=("retrieved",)),
    # your application as a black box (docs/app.md): it retrieves and answers, so the built-in
    # retrieval stages and the generator do not run; its answers are judged, its contexts scored
    Slot("app", "app", "rag_experiments.stages.app.App", ("app",),
         ("rag_experiments.stages.app", "rag_experiments.evalset.contexts", "rag_experiments.run.app_step"),
         optional=True, neutral_none=True, step="app", errors="n_app_errors", noun="questions asked to the app", position=1,
         column="app", runner="rag_experiments.run.app_step.AppStep",
         replaces=("chunker", "query_transform", "retriever", "reranker"), stands_in=("generator",)),
    # what the retriever searches: a rewritten query, a hypothetical answer (HyDE) or variants fused by
    # RRF, from a chat model (docs/stages.md); query=none: the question. After the retriever in this
    # list (the first three are the retrieval core), before it in the run.
    Slot("query_transform", "query", "rag_experiments.stages.query.QueryTransform", ("query",),
         ("rag_experiments.stages.query", "rag_experiments.stages.generation"), optional=True, neutral_none=True,
         step="query", position=2, errors="n_query_errors", noun="transformed questions",
         column="query", priced=True, runner="rag_experiments.run.query_stage.QueryStep", span="LLM",
         outputs=("search_queries",)),
    # re-scores the first stage's candidates (docs/stages.md); rerank=none: no reranker
    Slot("reranker", "rerank", "rag_experiments.stages.rerank.Reranker", ("rerank",),
         ("rag_experiments.stages.rerank", _EMBEDDING), optional=True, neutral_none=True,
         step="rerank", position=4, errors="n_rerank_errors", noun="reranked queries",
         column="rerank", runner="rag_experiments.run.retrieval.RerankStep", span="RERANKER",
         outputs=("retrieved",)),
    Slot("generator", "generator", "rag_experiments.stages.generation.Generator", ("generation",),
         ("rag_experiments.stages.generation",), optional=True,
         step="generation", position=5, errors="n_errors", error_column="error", noun="generated queries",
         column="generation", priced=True, span="CHAT_MODEL", outputs=("answer",), phase="answer",
         runner="rag_experiments.run.answer.GenerateStep", stores=("generations",)),
    # the prompt's text enters the generation key (the rendered messages), not a cache of its own
    Slot("prompt", "prompt", "rag_experiments.stages.prompts.PromptTemplate", (), (), optional=True),
    Slot("judge", "judge", "rag_experiments.judge.claims.Judge", ("claims", "verdict", "folded", "relevance", "facts"),
         _JUDGE_CODE, optional=True, step="judging", position=6, errors="n_judge_errors", noun="judged answers",
         column="judge", priced=True, serving=False, span="EVALUATOR",
         outputs=("verdicts", "faithfulness", "answer_relevance"), phase="judging",
         runner="rag_experiments.run.answer.JudgeStep", stores=("claims", "verdicts", "folded", "relevance", "facts")),
    # a conversation's turn → what it searches (docs/conversations.md): the last question
    # (history=last_turn, builds nothing), a window of turns, a model's standalone rewrite or the
    # human one (oracle); before the query transform, which transforms what it sets
    Slot("history", "history", "rag_experiments.stages.history.HistoryQuery", ("history",),
         ("rag_experiments.stages.history", "rag_experiments.stages.query", "rag_experiments.stages.generation"),
         optional=True, neutral_none=True, off="last_turn", step="history", position=1, errors="n_history_errors",
         noun="conversation turns", column="history", priced=True, runner="rag_experiments.run.history_step.HistoryStep",
         span="LLM", outputs=("history_query",)),
)
#: The inputs a config chooses before any stage: the corpus and the eval set.
INPUT_GROUPS = ("corpus", "evalset")


def steps() -> tuple[Slot, ...]:
    """The slots that run as a step of their own, in run order: phase by phase (:data:`PHASES`), by
    position within one (the query transform before the retriever it feeds)."""
    return tuple(sorted((s for s in SLOTS if s.step), key=lambda s: (PHASES.index(s.phase), s.position)))


def configured(s: Slot, stages: object) -> bool:
    """Whether slot ``s`` runs in a run of ``stages`` (``run.types.Stages``): its stage is built, or
    a built slot stands in for it (the app's replies are the generator step's answers)."""
    if getattr(stages, s.name, None) is not None:
        return True
    return any(s.name in o.stands_in and getattr(stages, o.name, None) is not None for o in SLOTS)


def slot(name: str) -> Slot:
    """The slot named ``name`` (a ``Stages`` field); unknown → KeyError."""
    for s in SLOTS:
        if s.name == name:
            return s
    raise KeyError(name)
