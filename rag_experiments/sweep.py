"""The main job: compose → build stages → run the eval set → log to MLflow.

    python -m rag_experiments.sweep                                   # default config
    python -m rag_experiments.sweep -m chunking=fixed,markdown retriever.k=3,5,10
    python -m rag_experiments.sweep +experiment=ablate_chunking       # a named ablation

Each resolved config is one MLflow run; under ``-m`` the runs are children of one parent run
(the multirun side, ``rag_experiments.multirun``, hands the jobs the sweep context in
``hydra.sweep.dir/.sweep.json``). Every config value is checked by ``config_schema`` and the data
loaded before any run exists: bad input exits 2 and creates nothing. A config whose
``config_hash`` already FINISHED is skipped unless ``force=true``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # offline by default: never reach a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from rag_experiments.config_schema import unknown_group_options  # noqa: E402
from rag_experiments.evalset import sample_dir  # noqa: E402
from rag_experiments.identity import code_fingerprint, is_place_key, model_identities  # noqa: E402

log = logging.getLogger("rag_experiments")
GROUPS = ("corpus", "evalset", "chunking", "embedding", "retriever", "generator", "prompt", "judge")

if not OmegaConf.has_resolver("sample_dir"):
    OmegaConf.register_new_resolver("sample_dir", lambda: str(sample_dir()))


def _container(node) -> Any:
    return OmegaConf.to_container(node, resolve=True) if node is not None else None


def _priced(node: DictConfig) -> DictConfig:
    """The stage config without its ``pricing`` table, which feeds cost_usd only (evaluation.cost)."""
    if "pricing" not in node:
        return node
    return OmegaConf.masked_copy(node, [k for k in node if k != "pricing"])


def build_stages(cfg: DictConfig, cache) -> dict[str, Any]:
    """Instantiate every stage from its config group (a user plugs in a class + a YAML file)."""
    from rag_experiments.cache import CachedEmbedder
    from rag_experiments.stages.embedding import set_model_reuse

    corpus = instantiate(cfg.corpus)
    evalset = instantiate(cfg.evalset, corpus=corpus)
    chunker = instantiate(cfg.chunking)
    # cache_enabled=false means no reuse at all: models reloaded, static models re-distilled
    set_model_reuse(cache.enabled)
    extra = {} if cache.enabled or "cache_dir" not in cfg.embedding else {"cache_dir": None}
    embedder = CachedEmbedder(instantiate(cfg.embedding, **extra), cache)
    retriever = instantiate(cfg.retriever, embedder=embedder)
    generator = prompt = judge = None
    if cfg.generator.get("_target_"):
        generator = instantiate(_priced(cfg.generator))
        prompt = instantiate(cfg.prompt)
        judge = instantiate(_priced(cfg.judge))
    return dict(
        corpus=corpus,
        evalset=evalset,
        chunker=chunker,
        embedder=embedder,
        retriever=retriever,
        generator=generator,
        prompt=prompt,
        judge=judge,
    )


def _fmt(v: float) -> str:
    return "   n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:6.3f}"


def summary_table(agg: dict[str, float], k: int, ks: list[int]) -> str:
    """Retrieval and generation metrics side by side, never blended, with 95 % CIs and counts.

    Which keys, in which order and under which heading: ``evaluation.registry.metric_keys``."""
    from rag_experiments.evaluation.registry import metric_keys, spec, wrap

    titles = {"retrieval": "retrieval", "generation": "generation", "label": "failure labels"}
    keys = [key for key in metric_keys(ks, k, generation=True) if key in agg]
    lines = [f"{'metric':<31} {'mean':>6}  95% CI            n"]
    side = None
    for key in keys:
        s = spec(key)
        if s.side != side:
            side = s.side
            lines.append(f"-- {titles.get(side, side)}")
        n = agg.get(wrap(key, "n_scored"), float("nan"))
        lo, hi = agg.get(wrap(key, "ci_low")), agg.get(wrap(key, "ci_high"))
        lines.append(f"{key:<31} {_fmt(agg[key])}  [{_fmt(lo)}, {_fmt(hi)}]  {int(n) if n == n else ''}")
    lines.append(
        f"queries {int(agg['n_queries'])} (unanswerable {int(agg.get('n_unanswerable', 0))}), "
        f"errors {int(agg['n_errors'])}, unparseable verdicts {int(agg['n_unparseable_verdicts'])}"
    )
    return "\n".join(lines)


def _input_error(e: BaseException | None, kinds: tuple) -> BaseException | None:
    """The user-input error behind ``e`` (Hydra wraps it in an InstantiationException)."""
    while e is not None:
        if isinstance(e, kinds):
            return e
        e = e.__cause__ or e.__context__
    return None


def run_name_from(overrides: list[str]) -> str:
    """``chunking=fixed,retriever.k=5`` from the job's overrides, without paths and bookkeeping."""
    keep = [o for o in overrides if not is_place_key(o)]
    return ",".join(keep) or "default"


MAX_PROBLEM_LINES = 50  # a broken 10,000-line eval set must not flood the terminal


def print_problems(lines: list[str], header: str = "") -> None:
    """Input problems on stderr: at most MAX_PROBLEM_LINES lines of at most 500 characters."""
    if header:
        print(header, file=sys.stderr)
    for line in lines[:MAX_PROBLEM_LINES]:
        print(line if len(line) <= 500 else line[:500] + " …", file=sys.stderr)
    if len(lines) > MAX_PROBLEM_LINES:
        print(f"… and {len(lines) - MAX_PROBLEM_LINES} more problem(s)", file=sys.stderr)


def _problems_of(e: BaseException) -> list[str]:
    return list(getattr(e, "problems", None) or str(e).splitlines() or [type(e).__name__])


def input_problems(cfg: DictConfig, cache=None) -> tuple[list[str], dict | None]:
    """(problems, stages): the config checked against ``config_schema``, then the data loaded.

    Problems are user input (config values, corpus, eval set, model paths); anything else raises.
    """
    from rag_experiments.cache import StageCache
    from rag_experiments.config_schema import ConfigError, check
    from rag_experiments.datasets.corpus import CorpusError
    from rag_experiments.evalset import EvalSetError
    from rag_experiments.evaluation.metrics import check_metrics_config
    from rag_experiments.stages.judging.verifier import VerifierError

    try:
        check(cfg)
        m = cfg.metrics
        depth, budgets = m.get("rank_depth", 100), list(m.get("token_budgets", []))
        check_metrics_config(list(m.ks), int(cfg.retriever.k), depth, budgets)
        cache = cache or StageCache(cfg.cache_dir, enabled=cfg.get("cache_enabled", True))
        return [], build_stages(cfg, cache)
    except Exception as e:  # Hydra wraps a stage's error in an InstantiationException
        cause = _input_error(e, (ConfigError, EvalSetError, CorpusError, FileNotFoundError, VerifierError))
        if cause is None and isinstance(e, ValueError) and str(e).startswith(("metrics.", "retriever.k")):
            return [f"conf/{e}"], None  # check_metrics_config names the key
        if cause is None:
            raise
        return _problems_of(cause), None


def load_inputs(cfg: DictConfig, cache) -> dict[str, Any]:
    """The stages of ``cfg``, or exit 2 with the problems: bad input never creates a run."""
    problems, stages = input_problems(cfg, cache)
    if problems:
        print_problems(problems)
        sys.exit(2)
    return stages


def job_sweep_context() -> dict | None:
    """The multirun's context, handed over in ``hydra.sweep.dir/.sweep.json`` (None: single run)."""
    from hydra.types import RunMode

    from rag_experiments.tracking import writer as tracking

    hc = HydraConfig.get()
    return tracking.read_sweep_context(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None


@dataclass
class Job:
    """One resolved config with its loaded inputs: everything a run needs besides MLflow."""

    cfg: DictConfig
    stages: dict[str, Any]
    cache: Any
    full: dict
    chash: str
    run_name: str
    overrides: list[str]
    sweep: dict | None
    t_start: float

    @property
    def k(self) -> int:
        return int(self.cfg.retriever.k)

    @property
    def ks(self) -> list[int]:
        return list(self.cfg.metrics.ks)


def describe_job(cfg: DictConfig, stages: dict[str, Any], cache, t_start: float) -> Job:
    from rag_experiments.tracking import writer as tracking

    full = _container(cfg)
    overrides = list(HydraConfig.get().overrides.task)
    chash = tracking.config_hash(
        full, stages["corpus"].digest, stages["evalset"].digest, model_identities(stages)
    )
    return Job(
        cfg, stages, cache, full, chash, run_name_from(overrides), overrides, job_sweep_context(), t_start
    )


def run_tags(job: Job) -> dict[str, str]:
    from rag_experiments.tracking import writer as tracking

    tags = {
        "config_hash": job.chash,
        "code_fingerprint": code_fingerprint(),
        "corpus_digest": job.stages["corpus"].digest,
        "evalset_digest": job.stages["evalset"].digest,
        "overrides": json.dumps(job.overrides),
        "command": " ".join(sys.argv),
        "runner": tracking.runner_id(),
        **tracking.git_info(),
        **{f"version.{p}": v for p, v in tracking.package_versions().items()},
    }
    gen, judge = job.stages["generator"], job.stages["judge"]
    if gen is not None:
        tags["generator_model"] = getattr(gen, "model", "")
        tags["judge_model"] = str(getattr(judge, "model", None))
        if getattr(judge, "model", None) and judge.model == getattr(gen, "model", None):
            log.warning(
                "the judge model equals the generator model (%s): expect self-preference bias", gen.model
            )
            tags["judge_is_generator"] = "true"
    return tags


def run_params(job: Job) -> dict[str, str]:
    """The flattened resolved config plus the group choices (``chunking`` = ``fixed``)."""
    from rag_experiments.tracking import writer as tracking

    params = {
        k: v for k, v in tracking.flatten(job.full).items() if not k.startswith(("tracking.", "hydra."))
    }
    params.update({g: str(v) for g, v in HydraConfig.get().runtime.choices.items() if g in GROUPS})
    return params


def _pipeline(job: Job):
    from rag_experiments.evaluation.labels import load_thresholds
    from rag_experiments.pipeline import run_pipeline

    cfg, stages = job.cfg, job.stages
    return run_pipeline(
        docs=stages["corpus"].docs,
        corpus_digest=stages["corpus"].digest,
        items=stages["evalset"].items,
        chunker=stages["chunker"],
        chunking_cfg=_container(cfg.chunking),
        retriever=stages["retriever"],
        k=job.k,
        ks=job.ks,
        cache=job.cache,
        generator=stages["generator"],
        prompt=stages["prompt"],
        judge=stages["judge"],
        min_coverage=cfg.metrics.min_coverage,
        thresholds=load_thresholds() if "attribution" not in cfg else _container(cfg.attribution),
        n_resamples=cfg.metrics.bootstrap_resamples,
        seed=cfg.seed,
        progress=cfg.get("progress", True),
        rank_depth=cfg.metrics.get("rank_depth", 100),
        token_budgets=list(cfg.metrics.get("token_budgets", [256, 512, 1024])),
        generation_subset=cfg.get("generation_subset"),
        pricing={
            "generation": _container(cfg.generator.get("pricing")),
            "judge": _container(cfg.judge.get("pricing")),
        },
    )


def _log(client, run_id: str, job: Job, res) -> None:
    import pandas as pd

    from rag_experiments.tracking import writer as tracking

    evalset = job.stages["evalset"]
    evalset_df = pd.DataFrame(
        [
            {
                "id": it.id,
                "query": it.query,
                "tags": ",".join(it.tags),
                "gold_answer": it.gold_answer or "",
                "n_evidence": len(it.gold_spans),
            }
            for it in evalset.items
        ]
    )
    artifacts = {
        "config.yaml": OmegaConf.to_yaml(job.cfg, resolve=True),
        "cache_keys.json": json.dumps(res.cache_keys, indent=2),
    }
    if job.stages["prompt"] is not None:
        artifacts["prompt_template.txt"] = job.stages["prompt"].text
    from rag_experiments.progress import Progress

    timing = res.timings  # logging_s is measured below; the printed table has it, the tag says 0
    timing.update(logging_s=0.0, total_s=time.perf_counter() - job.t_start)
    extra = {
        "n_chunks": str(res.n_chunks),
        "model_calls": json.dumps(res.calls),
        "timings": json.dumps({k: round(v, 3) for k, v in timing.items()}),
        **{f"cache_key.{k}": v for k, v in res.cache_keys.items()},
        **res.tags,
    }
    t_log, bar = time.perf_counter(), Progress("mlflow logging", None, job.cfg.get("progress", True))
    tracking.log_results(
        client,
        run_id,
        res.aggregates,
        res.per_query,
        evalset_df,
        evalset.path,
        evalset.digest,
        artifacts,
        extra,
    )
    bar.close()
    timing["logging_s"] = time.perf_counter() - t_log
    timing["total_s"] = time.perf_counter() - job.t_start


def every_item_failed(aggregates: dict[str, float]) -> bool:
    """True when every query errored (dead endpoint): such a run must be retried, not skipped."""
    n, errors = aggregates.get("n_queries", 0), aggregates.get("n_errors", 0)
    return n > 0 and errors >= n


def execute(client, exp_id: str, run_id: str, job: Job, parent_id: str | None):
    """Run the pipeline into ``run_id`` and set its final status; re-raises after marking it.

    FINISHED only when some query succeeded: a run with an error on every item is FAILED (tag
    ``failure_reason``) so that a re-run retries it.
    """
    from rag_experiments.tracking import writer as tracking

    try:
        res = _pipeline(job)
        _log(client, run_id, job, res)
        from rag_experiments.tracking.traces import log_traces  # one trace per eval item (docs/tracing.md)

        st = job.stages
        log_traces(client, run_id, exp_id, res.per_query, st["evalset"], st["corpus"], job.cfg, st)
        if every_item_failed(res.aggregates):
            why = (
                f"every one of the {int(res.aggregates['n_queries'])} queries errored (see per_query 'error')"
            )
            client.set_tag(run_id, "failure_reason", why)
            client.set_terminated(run_id, "FAILED")
            print(f"[failed] {job.run_name}: {why}; marked FAILED so a re-run retries it", file=sys.stderr)
        else:
            client.set_terminated(run_id, "FINISHED")
        return res
    except BaseException as e:
        status = "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED"
        client.set_tag(run_id, "error", f"{type(e).__name__}: {e}"[:5000])
        client.set_terminated(run_id, status)
        if parent_id:  # the multirun stops here too: its parent must not stay RUNNING
            interrupted = (str(e) or "KeyboardInterrupt") if status == "KILLED" else ""
            tracking.close_parent(client, exp_id, parent_id, complete=False, interrupted=interrupted)
        if status == "FAILED":
            traceback.print_exc()
        raise


def start_run(client, exp_id: str, job: Job) -> tuple[str, str | None]:
    """(child run id, parent run id or None): the run is created only now, inputs all valid."""
    from rag_experiments.tracking import writer as tracking

    tags = run_tags(job)
    if not job.sweep:
        return tracking.start_child(client, exp_id, job.run_name, tags, run_params(job)), None
    from rag_experiments.multirun import start_sweep_child  # the store elects the parent (cross-host)

    def child(parent_id: str, sweep_id: str) -> str:
        tags.update({"mlflow.parentRunId": parent_id, "sweep_id": sweep_id})
        return tracking.start_child(client, exp_id, job.run_name, tags, run_params(job))

    return start_sweep_child(client, exp_id, job.sweep, bool(job.cfg.force), child)


def run_job(cfg: DictConfig) -> float:
    """One resolved config → one MLflow run. Returns the context hit rate (Hydra's objective).

    The skip check and the run hold a lock on the config_hash, so identical sweeps started
    together run each config once; RUNNING runs of that config left by a dead process are
    marked KILLED first.
    """
    import mlflow

    from rag_experiments.cache import StageCache
    from rag_experiments.tracking import writer as tracking

    t_start = time.perf_counter()
    cache = StageCache(cfg.cache_dir, enabled=cfg.get("cache_enabled", True))
    job = describe_job(cfg, load_inputs(cfg, cache), cache, t_start)
    uri = tracking.resolve_uri(cfg.tracking.uri)
    client = tracking.open_store(uri)
    mlflow.set_tracking_uri(uri)
    exp_id = tracking.get_experiment_id(client, cfg.experiment_name, cfg.tracking.artifact_root)
    with tracking.config_lock(uri, exp_id, job.chash):
        for rid in tracking.heal_stale_runs(client, exp_id, job.chash):
            print(f"[healed] run {rid} of config_hash {job.chash} was left RUNNING by a dead process: KILLED")
        run_name, chash, k = job.run_name, job.chash, job.k
        fingerprint = code_fingerprint()
        done, why = (None, "") if cfg.force else tracking.resume_decision(client, exp_id, chash, fingerprint)
        if done is not None:
            print(f"[skip] {run_name}: {why}")
            return float(done.data.metrics.get(f"hit_at_{k}", float("nan")))
        if why:
            print(f"[rerun] {run_name}: {why}")
        run_id, parent_id = start_run(client, exp_id, job)
        res = execute(client, exp_id, run_id, job, parent_id)
    print(f"\n== {run_name}  (run {run_id}, {res.n_chunks} chunks, {time.perf_counter() - t_start:.1f}s)")
    print(summary_table(res.aggregates, k, job.ks))
    n_items = len(job.stages["evalset"].items)
    if job.stages["generator"] is not None and res.n_generated < n_items:
        print(
            f"generation metrics and label rates: stratified subset of n={res.n_generated} of "
            f"{n_items} items (generation_subset={cfg.get('generation_subset')}; "
            "generation_subset=null for all); retrieval metrics: all items"
        )
    from rag_experiments.progress import timing_table

    print(timing_table(res.timings))
    print(f"model calls {res.calls or '{}'}; cache {dict(sorted(cache.stats.items()))}")
    if not job.sweep:
        print(f"\nOpen the MLflow UI:\n  {tracking.ui_command(uri, cfg.tracking.artifact_root, exp_id)}")
    if every_item_failed(res.aggregates) and not job.sweep:
        sys.exit(1)
    return float(res.aggregates.get(f"hit_at_{k}", float("nan")))


def _terminate(signum, frame):  # SIGTERM (timeout, CI cancel) → KILLED run, never left RUNNING
    raise KeyboardInterrupt(f"signal {signum}")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):  # a multirun installed its own
        signal.signal(signal.SIGTERM, _terminate)
    for noisy in ("mlflow", "httpx", "httpx2", "openai"):  # one line per HTTP call drowns the summary
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return run_job(cfg)


def __getattr__(name: str):
    # conf/config.yaml names the callback rag_experiments.sweep.MultirunParent; imported lazily
    # because rag_experiments.multirun imports this module.
    if name == "MultirunParent":
        from rag_experiments.multirun import MultirunParent

        return MultirunParent
    raise AttributeError(name)


if __name__ == "__main__":
    if bad := unknown_group_options(sys.argv[1:]):
        print_problems(bad)
        sys.exit(2)
    main()
