"""Config → checked inputs → ``Stages``, ``PipelineData``, ``RunSettings`` (docs/architecture.md).

The one place a composed Hydra config becomes the typed run: ``input_problems`` checks the config
(``config_schema``) and loads the data, ``build`` instantiates every stage once, ``run_settings``
reads the plain values and ``job_settings`` the rest of a sweep job's keys (tracking, traces,
racing, the judge card, naming, with ``hydra_context``'s runtime values). Nothing after assembly
receives the Hydra config (``scripts/config_reach.py``, ``tests/test_layers.py``). Bad input is a list of problems naming the file/line or config key; the
CLIs print them and exit 2 before any MLflow run exists.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rag_experiments.core.build import build as build_node
from rag_experiments.core.build import target_object
from rag_experiments.core.cache import CachedEmbedder, StageCache
from rag_experiments.core.conf_groups import STAGE_GROUPS
from rag_experiments.core.run_names import experiment_for_corpus, run_name
from rag_experiments.core.slots import SLOTS
from rag_experiments.evalset.corpus import Corpus, CorpusError
from rag_experiments.evalset.load import EvalSet, EvalSetError, sample_dir
from rag_experiments.evaluation.defaults import RANK_DEPTH, TOKEN_BUDGETS
from rag_experiments.evaluation.labels import load_thresholds
from rag_experiments.judge.validity import CardSettings, judge_with_repeats
from rag_experiments.judge.verifier import VerifierError
from rag_experiments.run.config_schema import ConfigError, check
from rag_experiments.run.endpoint_checks import apply_budget
from rag_experiments.run.types import JobSettings, PipelineData, RaceSettings, RunSettings, Stages
from rag_experiments.stages.api_embedding import EmbeddingEndpointError
from rag_experiments.stages.embedding import set_model_reuse
from rag_experiments.stages.history import missing_standalone
from rag_experiments.stages.prompts import PromptRegistryError
from rag_experiments.tracking.trace_settings import DEFAULT_SAMPLE, TraceSettings, trace_path

if not OmegaConf.has_resolver("sample_dir"):  # ${sample_dir:} in conf/: wherever a config is composed
    OmegaConf.register_new_resolver("sample_dir", lambda: str(sample_dir()))


def _corpus_experiment(*, _root_: DictConfig) -> str:
    """``${corpus_experiment:}``, the default ``experiment_name``: named after the corpus
    (``run_names.experiment_for_corpus``). Read from the root so an unset ``corpus.path`` (a sweep
    over corpora, composed before its jobs) gives the fallback name instead of an error."""
    path = OmegaConf.select(_root_, "corpus.path", default=None, throw_on_missing=False)
    name = OmegaConf.select(_root_, "corpus.name", default=None, throw_on_missing=False)
    return experiment_for_corpus(path, name, str(sample_dir() / "docs"))


if not OmegaConf.has_resolver("corpus_experiment"):
    OmegaConf.register_new_resolver("corpus_experiment", _corpus_experiment)

#: user-input errors: reported as problems (exit 2), anything else is a bug and raises
INPUT_ERRORS = (
    ConfigError, EvalSetError, CorpusError, FileNotFoundError, VerifierError, PromptRegistryError,
    EmbeddingEndpointError,
)  # fmt: skip
MAX_PROBLEM_LINES = 50  # a broken 10,000-line eval set must not flood the terminal


def container(node) -> Any:
    """The resolved plain-Python value of a config node (None stays None)."""
    return OmegaConf.to_container(node, resolve=True) if node is not None else None


def instantiate(node, **kwargs: Any) -> Any:
    """The object a config node describes, its values resolved exactly once (``core.build``: an
    escaped ``\\${…}`` stays literal text, as in the logged config.yaml)."""
    return build_node(container(node), **kwargs)


def priced(node: DictConfig) -> DictConfig:
    """The stage config without its ``pricing`` table, which feeds cost_usd only (evaluation.cost)."""
    if "pricing" not in node:
        return node
    return OmegaConf.masked_copy(node, [k for k in node if k != "pricing"])


@dataclass(frozen=True)
class Loaded:
    """A config's loaded data and built stages: everything a run needs besides MLflow."""

    corpus: Corpus
    evalset: EvalSet
    stages: Stages

    @property
    def data(self) -> PipelineData:
        return PipelineData.of(self.corpus, self.evalset)


def build(cfg: DictConfig, cache: StageCache) -> Loaded:
    """Instantiate every stage from its config group (a user plugs in a class + a YAML file)."""
    corpus = instantiate(cfg.corpus)
    evalset = instantiate(cfg.evalset, corpus=corpus)
    # cache_enabled=false means no reuse at all: models reloaded, static models re-distilled
    set_model_reuse(cache.enabled)
    # budget.max_calls / max_usd and the chat prices, counted by the endpoint client
    apply_budget({k: container(cfg.get(k)) for k in ("budget", *(s.group for s in SLOTS if s.priced))})
    extra = {} if cache.enabled or "cache_dir" not in cfg.embedding else {"cache_dir": None}
    embedder = CachedEmbedder(instantiate(cfg.embedding, **extra), cache)
    generator = prompt = judge = None
    repeats: tuple = ()
    app = build_app(cfg.get("app"), evalset)
    if cfg.generator.get("_target_") and app is None:
        generator = instantiate(priced(cfg.generator))
        prompt = instantiate(cfg.prompt)
    if (generator is not None or app is not None) and cfg.judge.get("_target_"):
        judge, repeats = judge_with_repeats(container(cfg.judge))  # judge=none: judge-free metrics only
    stages = Stages(
        chunker=instantiate(cfg.chunking),
        query_transform=build_query_transform(cfg.get("query"), generator),
        reranker=build_reranker(cfg.get("rerank"), cache),
        chunking_cfg=container(cfg.chunking),
        embedder=embedder,
        retriever=instantiate(cfg.retriever, embedder=embedder),
        generator=generator,
        prompt=prompt,
        judge=judge,
        judge_repeats=tuple(repeats),
        app=app,
        history=build_history(cfg.get("history"), generator, evalset),
        extra=other_slots(cfg),
    )
    return Loaded(corpus, evalset, stages)


def build_history(node: DictConfig | None, generator, evalset):
    """The history step of ``conf/history/<option>.yaml`` (None for history=last_turn: no
    ``_target_``); ``rewrite`` calls its own ``llm`` node or the run's generator, like the query
    transform. ``oracle`` on an eval set whose items lack ``standalone_query`` is bad input."""
    if node is None or not node.get("_target_"):
        return None
    needs_llm = "llm" in inspect.signature(target_object(str(node["_target_"]))).parameters
    rest = OmegaConf.masked_copy(node, [k for k in node if k != "llm"])  # window, oracle: a sweep's llm, unused
    stage = build_query_transform(node, generator) if needs_llm else instantiate(rest)
    if stage is not None and stage.kind == "oracle" and (missing := missing_standalone(evalset.items)):
        raise EvalSetError([f"{evalset.path}: history=oracle needs a standalone_query on every item; "
                            f"{len(missing)} of {len(evalset.items)} have none", *missing])  # fmt: skip
    return stage


def other_slots(cfg: DictConfig) -> dict[str, Any]:
    """The stage of every slot declared in ``core.slots`` that ``Stages`` has no field for, from its
    config group (None when its option has no ``_target_``: ``<group>=none``). A slot added by the
    recipe is built here with no edit (docs/architecture.md, "Add a stage slot")."""
    own = {f.name for f in fields(Stages)}
    return {
        s.name: instantiate(priced(node)) if (node := cfg.get(s.group)) is not None and node.get("_target_") else None
        for s in SLOTS
        if s.name not in own
    }


def build_app(node: DictConfig | None, evalset):
    """The application of ``conf/app/<option>.yaml`` (None for app=none), asked the eval set's
    first question once: an app that does not import, is unreachable, or answers in another shape
    than (answer, contexts) is bad input (exit 2 naming ``app.*``), not a run of errors."""
    if node is None or not node.get("_target_"):
        return None
    app = instantiate(node)
    if evalset.items:
        probe = app.ask(evalset.items[0].query)
        if probe.error and ("AppShapeError" in probe.error or probe.exited or getattr(app, "url", None)):
            where = "app.url" if getattr(app, "url", None) else "app.target"
            raise FileNotFoundError(f"{where}: the first question failed: {probe.error}")
    return app


def build_reranker(node: DictConfig | None, cache: StageCache):
    """The reranker of ``conf/rerank/<option>.yaml`` (None for rerank=none: no ``_target_``). A
    nested ``embedding`` node (rerank=dense) is built like the run's embedder, in the vector cache."""
    if node is None or not node.get("_target_"):
        return None
    if node.get("embedding") is None:
        return instantiate(node)
    extra = {} if cache.enabled or "cache_dir" not in node.embedding else {"cache_dir": None}
    embedder = CachedEmbedder(instantiate(node.embedding, **extra), cache)
    rest = OmegaConf.masked_copy(node, [k for k in node if k != "embedding"])
    return instantiate(rest, embedding=embedder)


def build_query_transform(node: DictConfig | None, generator):
    """The transform of ``conf/query/<option>.yaml`` (None for query=none: no ``_target_``), calling
    its own ``llm`` node (any generator option's, ``+generator@query.llm=local``) or the run's
    generator (``config_schema`` refuses neither)."""
    if node is None or not node.get("_target_"):
        return None
    llm = instantiate(priced(node.llm)) if node.get("llm") is not None else generator
    rest = OmegaConf.masked_copy(node, [k for k in node if k != "llm"])
    return instantiate(rest, llm=llm)


def run_settings(cfg: DictConfig) -> RunSettings:
    """The plain settings of the run (``RunSettings`` names the config key of each)."""
    m = cfg.metrics
    return RunSettings(
        k=int(cfg.retriever.k),
        ks=tuple(m.ks),
        min_coverage=m.min_coverage,
        rank_depth=m.get("rank_depth", RANK_DEPTH),
        token_budgets=tuple(m.get("token_budgets", TOKEN_BUDGETS)),
        n_resamples=m.bootstrap_resamples,
        seed=cfg.seed,
        generation_subset=cfg.get("generation_subset"),
        replicates=int(cfg.get("replicates", 1)),
        thresholds=load_thresholds() if "attribution" not in cfg else container(cfg.attribution),
        pricing={s.column: container(_model_node(cfg, s).get("pricing")) for s in SLOTS if s.priced},
        progress=cfg.get("progress", True),
    )


@dataclass(frozen=True)
class HydraContext:
    """What Hydra's runtime knows about a job beyond its config (``hydra_context``): the job's
    command-line overrides, the group choices, the multirun's context and folder, the job number.
    The defaults are a single run's."""

    overrides: tuple[str, ...] = ()
    choices: dict[str, str] = field(default_factory=dict)
    sweep: dict | None = None
    sweep_dir: str | None = None
    job_num: int = 0


def hydra_context() -> HydraContext:
    """The running Hydra job's :class:`HydraContext` (inside ``@hydra.main`` only)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from rag_experiments.tracking.parents import read_sweep_context

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    sweep_dir = str(hc.sweep.dir) if multirun else None
    return HydraContext(
        overrides=tuple(hc.overrides.task),
        choices={g: str(v) for g, v in hc.runtime.choices.items() if g in STAGE_GROUPS},
        sweep=read_sweep_context(sweep_dir) if multirun else None,
        sweep_dir=sweep_dir,
        job_num=int(hc.job.get("num", 0) or 0),
    )


def racing_enabled(cfg: DictConfig) -> bool:
    """``racing.enabled`` of a config (only the ``racing`` node is resolved)."""
    from rag_experiments.run.racing import enabled_in

    return enabled_in(container(cfg.get("racing")))


def race_settings(cfg: DictConfig, sweep: dict | None) -> RaceSettings | None:
    """The racing settings of a config that races (``racing.settings``), else None."""
    from rag_experiments.run.racing import settings

    if not racing_enabled(cfg):
        return None
    generates, judged = bool(cfg.generator.get("_target_")), bool(cfg.judge.get("_target_"))
    return settings(container(cfg.get("racing")), int(cfg.retriever.k), int(cfg.seed), sweep, generates, judged)


def job_settings(cfg: DictConfig, ctx: HydraContext | None = None) -> JobSettings:
    """A sweep job's typed settings (``run.types.JobSettings``), read from its config once; ``ctx``:
    the Hydra runtime's values (None: a single run with no overrides, as in a test)."""
    ctx = ctx or HydraContext()
    tr = cfg.tracking
    cap = tr.get("trace_sample", DEFAULT_SAMPLE)
    racing = container(cfg.get("racing"))
    return JobSettings(
        run=run_settings(cfg),
        full=container(cfg),
        config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
        experiment_name=str(cfg.experiment_name),
        tracking_uri=tr.get("uri"),
        artifact_root=tr.get("artifact_root"),
        timeout_s=tr.get("timeout_s"),
        force=bool(cfg.get("force", False)),
        cache_dir=str(cfg.cache_dir),
        cache_enabled=bool(cfg.get("cache_enabled", True)),
        progress=bool(cfg.get("progress", True)),
        choices=dict(ctx.choices),
        overrides=tuple(ctx.overrides),
        sweep=ctx.sweep,
        sweep_dir=ctx.sweep_dir,
        job_num=ctx.job_num,
        traces=TraceSettings(
            enabled=bool(tr.get("traces", True)),
            sample=None if cap is None else int(cap),
            seed=int(cfg.get("seed", 0)),
            k=int(cfg.retriever.k),
            path=trace_path(),
        ),
        card=CardSettings.of(container(cfg.get("judge_card"))),
        racing=race_settings(cfg, ctx.sweep),
        racing_primary=(racing or {}).get("primary") if isinstance(racing, dict) else None,
    )


def _model_node(cfg: DictConfig, s) -> DictConfig:
    """The config of the model priced slot ``s`` calls (its ``pricing`` table prices it): its own
    ``<group>.llm`` node; else its own node when it is the answer or the judge, or carries a price;
    else the run's generator, which a retrieval-side step without a model of its own calls (the
    query transform). An empty node when the slot is off (``<group>=none``: no price)."""
    node = cfg.get(s.group)
    if node is None or not node.get("_target_"):
        return OmegaConf.create({})
    if node.get("llm") is not None:
        return node.llm
    return node if s.phase != "before_answer" or "pricing" in node else cfg.generator


def input_error(e: BaseException | None, kinds: tuple = INPUT_ERRORS) -> BaseException | None:
    """The user-input error behind ``e`` (Hydra wraps it in an InstantiationException)."""
    while e is not None:
        if isinstance(e, kinds):
            return e
        e = e.__cause__ or e.__context__
    return None


def problems_of(e: BaseException) -> list[str]:
    return list(getattr(e, "problems", None) or str(e).splitlines() or [type(e).__name__])


def print_problems(lines: list[str], header: str = "") -> None:
    """Input problems on stderr: at most MAX_PROBLEM_LINES lines of at most 500 characters."""
    if header:
        print(header, file=sys.stderr)
    for line in lines[:MAX_PROBLEM_LINES]:
        print(line if len(line) <= 500 else line[:500] + " …", file=sys.stderr)
    if len(lines) > MAX_PROBLEM_LINES:
        print(f"… and {len(lines) - MAX_PROBLEM_LINES} more problem(s)", file=sys.stderr)


def input_problems(cfg: DictConfig, cache: StageCache | None = None) -> tuple[list[str], Loaded | None]:
    """(problems, loaded): the config checked against ``config_schema``, then the data loaded.

    Problems are user input (config values, corpus, eval set, model paths); anything else raises.
    """
    try:
        check(cfg)
        cache = cache or StageCache(cfg.cache_dir, enabled=cfg.get("cache_enabled", True))
        return [], build(cfg, cache)
    except Exception as e:  # Hydra wraps a stage's error in an InstantiationException
        cause = input_error(e)
        if cause is None:
            raise
        return problems_of(cause), None


def load_inputs(cfg: DictConfig, cache: StageCache) -> Loaded:
    """The loaded inputs of ``cfg``, or exit 2 with the problems: bad input never creates a run."""
    problems, loaded = input_problems(cfg, cache)
    if problems:
        print_problems(problems)
        sys.exit(2)
    return loaded


@dataclass(frozen=True)
class ComposedJob:
    """A sweep's job composed but not launched (``dry_run=true``, ``run.dry_run``): its overrides
    and its config, checked and assembled here, so nothing after assembly reads the config."""

    overrides: tuple[str, ...]
    node: DictConfig  # the job's composed config (its hydra node is left out below)

    def _plain(self) -> DictConfig:
        return OmegaConf.masked_copy(self.node, [k for k in self.node if k != "hydra"])

    def problems(self) -> list[str]:
        """The config check's problems (``config_schema``), [] when it is valid."""
        try:
            check(self._plain())
        except ConfigError as e:
            return list(e.problems)
        return []

    def cache_place(self) -> tuple[str, bool]:
        """(``cache_dir``, ``cache_enabled``)."""
        return str(self.node.cache_dir), bool(self.node.get("cache_enabled", True))

    def assemble(self, cache: StageCache) -> tuple[list[str], Loaded | None, JobSettings | None]:
        """(problems, loaded inputs, typed settings): ``input_problems`` then ``job_settings``."""
        cfg = self._plain()
        problems, loaded = input_problems(cfg, cache)
        return problems, loaded, None if problems else job_settings(cfg, HydraContext(overrides=self.overrides))


def run_name_from(overrides: list[str]) -> str:
    """A single run's name from its overrides (``run_names.run_name``; a sweep names only what varies)."""
    return run_name(overrides)
