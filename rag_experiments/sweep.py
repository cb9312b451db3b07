"""The main job: compose → build stages → run the eval set → log to MLflow.

    python -m rag_experiments.sweep                                   # default config
    python -m rag_experiments.sweep -m chunking=fixed,markdown retriever.k=3,5,10
    python -m rag_experiments.sweep +experiment=ablate_chunking       # a named ablation

Each resolved config is one MLflow run; under ``-m`` the runs are children of one parent run.
A config whose ``config_hash`` already FINISHED is skipped unless ``force=true``.
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
import uuid
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # offline by default: never reach a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.experimental.callback import Callback  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from rag_experiments.evalset import sample_dir  # noqa: E402

log = logging.getLogger("rag_experiments")
GROUPS = ("corpus", "evalset", "chunking", "embedding", "retriever", "generator", "prompt", "judge")

if not OmegaConf.has_resolver("sample_dir"):
    OmegaConf.register_new_resolver("sample_dir", lambda: str(sample_dir()))


def _container(node) -> Any:
    return OmegaConf.to_container(node, resolve=True) if node is not None else None


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
        generator = instantiate(cfg.generator)
        prompt = instantiate(cfg.prompt)
        judge = instantiate(cfg.judge)
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
    """Retrieval and generation metrics side by side, never blended, with 95 % CIs and counts."""
    retrieval = [f"hit_at_{k}", f"evidence_recall_at_{k}", "mrr", f"context_precision_at_{k}", f"ndcg_at_{k}"]
    retrieval += [f"hit_at_{x}" for x in ks if x != k]
    generation = ["faithfulness", "answer_relevance", "correctness"]
    rates = ["rate_retrieval_failure", "rate_generation_failure", "rate_ok", "rate_correct_without_evidence"]
    lines = [f"{'metric':<31} {'mean':>6}  95% CI            n"]
    for title, keys in (("retrieval", retrieval), ("generation", generation), ("failure labels", rates)):
        keys = [key for key in keys if key in agg]
        if not keys:
            continue
        lines.append(f"-- {title}")
        for key in keys:
            n = agg.get(f"n_scored/{key}", float("nan"))
            lines.append(
                f"{key:<31} {_fmt(agg[key])}  [{_fmt(agg.get(key + '_ci_low'))}, "
                f"{_fmt(agg.get(key + '_ci_high'))}]  {int(n) if n == n else ''}"
            )
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


# Overrides that say where things are, not what is measured: kept out of run names.
_PLACE_KEYS = (
    "corpus.path",
    "evalset.path",
    "tracking.",
    "hydra.",
    "cache_dir",
    "cache_enabled",
    "progress",
    "experiment_name",
    "force",
    "evalset.limit",
)


def run_name_from(overrides: list[str]) -> str:
    """``chunking=fixed,retriever.k=5`` from the job's overrides, without paths and bookkeeping."""
    keep = [o for o in overrides if not o.lstrip("+~").startswith(_PLACE_KEYS)]
    return ",".join(keep) or "default"


def run_job(cfg: DictConfig) -> float:
    """One resolved config → one MLflow run. Returns the context hit rate (Hydra's objective)."""
    from mlflow.tracking import MlflowClient

    from rag_experiments.analysis.attribution import load_thresholds
    from rag_experiments.cache import StageCache
    from rag_experiments.datasets.corpus import CorpusError
    from rag_experiments.evalset import EvalSetError
    from rag_experiments.pipeline import run_pipeline
    from rag_experiments.progress import Progress, timing_table
    from rag_experiments.tracking import writer as tracking

    t_start = time.perf_counter()
    cache = StageCache(cfg.cache_dir, enabled=cfg.get("cache_enabled", True))
    try:
        stages = build_stages(cfg, cache)
    except Exception as e:  # bad input: clear message, exit 2, no MLflow run
        cause = _input_error(e, (EvalSetError, CorpusError, FileNotFoundError))
        if cause is None:
            raise
        print(str(cause), file=sys.stderr)
        sys.exit(2)
    corpus, evalset = stages["corpus"], stages["evalset"]
    full = _container(cfg)
    choices = {g: str(v) for g, v in HydraConfig.get().runtime.choices.items() if g in GROUPS}
    overrides = list(HydraConfig.get().overrides.task)
    chash = tracking.config_hash(full, corpus.digest, evalset.digest)
    k = int(cfg.retriever.k)
    ks = list(cfg.metrics.ks)

    uri = tracking.resolve_uri(cfg.tracking.uri)
    client = MlflowClient(tracking_uri=uri)
    import mlflow

    mlflow.set_tracking_uri(uri)
    exp_id = tracking.get_experiment_id(client, cfg.experiment_name, cfg.tracking.artifact_root)
    run_name = run_name_from(overrides)
    done = None if cfg.force else tracking.find_finished(client, exp_id, chash)
    if done is not None:
        print(
            f"[skip] {run_name}: config_hash {chash} already FINISHED as run {done.info.run_id} (force=true re-runs)"
        )
        return float(done.data.metrics.get(f"hit_at_{k}", float("nan")))

    tags = {
        "config_hash": chash,
        "corpus_digest": corpus.digest,
        "evalset_digest": evalset.digest,
        "overrides": json.dumps(overrides),
        "command": " ".join(sys.argv),
        **tracking.git_info(),
        **{f"version.{p}": v for p, v in tracking.package_versions().items()},
    }
    sweep = tracking.sweep_context()
    if sweep:
        parent_id, sweep_id = tracking.get_or_create_parent(client, exp_id, sweep, bool(cfg.force))
        tags.update({"mlflow.parentRunId": parent_id, "sweep_id": sweep_id})
    gen, judge = stages["generator"], stages["judge"]
    if gen is not None:
        tags["generator_model"] = getattr(gen, "model", "")
        tags["judge_model"] = str(getattr(judge, "model", None))
        if getattr(judge, "model", None) and judge.model == getattr(gen, "model", None):
            log.warning(
                "the judge model equals the generator model (%s): expect self-preference bias", gen.model
            )
            tags["judge_is_generator"] = "true"
    params = tracking.flatten(full)
    params = {k_: v for k_, v in params.items() if not k_.startswith(("tracking.", "hydra."))}
    params.update(choices)
    run_id = tracking.start_child(client, exp_id, run_name, tags, params)
    try:
        res = run_pipeline(
            docs=corpus.docs,
            corpus_digest=corpus.digest,
            items=evalset.items,
            chunker=stages["chunker"],
            chunking_cfg=_container(cfg.chunking),
            retriever=stages["retriever"],
            k=k,
            ks=ks,
            cache=cache,
            generator=gen,
            prompt=stages["prompt"],
            judge=judge,
            min_coverage=cfg.metrics.min_coverage,
            thresholds=load_thresholds() if "attribution" not in cfg else _container(cfg.attribution),
            n_resamples=cfg.metrics.bootstrap_resamples,
            seed=cfg.seed,
            progress=cfg.get("progress", True),
            generation_subset=cfg.get("generation_subset"),
        )
        import pandas as pd

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
            "config.yaml": OmegaConf.to_yaml(cfg, resolve=True),
            "cache_keys.json": json.dumps(res.cache_keys, indent=2),
        }
        if stages["prompt"] is not None:
            artifacts["prompt_template.txt"] = stages["prompt"].text
        timing = {**res.timings, "logging_s": 0.0, "total_s": time.perf_counter() - t_start}
        extra = {
            "n_chunks": str(res.n_chunks),
            "model_calls": json.dumps(res.calls),
            "timings": json.dumps({k_: round(v, 3) for k_, v in timing.items()}),
            **{f"cache_key.{k_}": v for k_, v in res.cache_keys.items()},
        }
        t_log, bar = time.perf_counter(), Progress("mlflow logging", None, cfg.get("progress", True))
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
        timing["total_s"] = time.perf_counter() - t_start
        client.set_terminated(run_id, "FINISHED")
    except BaseException as e:
        status = "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED"
        client.set_tag(run_id, "error", f"{type(e).__name__}: {e}"[:5000])
        client.set_terminated(run_id, status)
        if sweep:  # the multirun stops here too: its parent must not stay RUNNING
            client.set_terminated(tags["mlflow.parentRunId"], status)
        if status == "FAILED":
            traceback.print_exc()
        raise
    print(f"\n== {run_name}  (run {run_id}, {res.n_chunks} chunks, {time.perf_counter() - t_start:.1f}s)")
    print(summary_table(res.aggregates, k, ks))
    if gen is not None and res.n_generated < len(evalset.items):
        print(
            f"generation metrics and label rates: stratified subset of n={res.n_generated} of "
            f"{len(evalset.items)} items (generation_subset={cfg.get('generation_subset')}; "
            "generation_subset=null for all); retrieval metrics: all items"
        )
    print(timing_table(timing))
    print(f"model calls {res.calls or '{}'}; cache {dict(sorted(cache.stats.items()))}")
    if not sweep:
        print(f"\nOpen the MLflow UI:\n  {tracking.ui_command(uri, cfg.tracking.artifact_root)}")
    return float(res.aggregates.get(f"hit_at_{k}", float("nan")))


class MultirunParent(Callback):
    """Gives the jobs of one multirun a shared parent run and closes it when the sweep ends."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from rag_experiments.cache import stable_hash

        overrides = list(config.hydra.overrides.task)
        params = config.hydra.sweeper.get("params") or {}
        params = OmegaConf.to_container(params) if OmegaConf.is_config(params) else dict(params)
        sweep = {
            "sweep_hash": stable_hash("sweep", config.experiment_name, sorted(overrides), params)[:16],
            "invocation": uuid.uuid4().hex,
            "overrides": overrides,
            "command": "python -m rag_experiments.sweep " + " ".join(sys.argv[1:]),
        }
        os.environ["RAG_EXPERIMENTS_SWEEP"] = json.dumps(sweep)
        # Create the store and experiment here, once: parallel workers (joblib) that each
        # initialise a fresh sqlite schema race on its migrations.
        from mlflow.tracking import MlflowClient

        from rag_experiments.tracking import writer as tracking

        client = MlflowClient(tracking_uri=tracking.resolve_uri(config.tracking.uri))
        tracking.get_experiment_id(client, config.experiment_name, config.tracking.artifact_root)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from mlflow.tracking import MlflowClient

        from rag_experiments.tracking import writer as tracking

        sweep = tracking.sweep_context()
        if not sweep:
            return
        uri = tracking.resolve_uri(config.tracking.uri)
        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(config.experiment_name)
        parents = (
            []
            if exp is None
            else client.search_runs(
                [exp.experiment_id],
                filter_string=f"tags.sweep_invocation = '{sweep['invocation']}'",
                max_results=1,
            )
        )
        if parents:
            parent = parents[0]
            if parent.info.status == "RUNNING":
                client.set_terminated(parent.info.run_id, "FINISHED")
            children = client.search_runs(
                [exp.experiment_id],
                filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
                max_results=1000,
            )
            print(
                f"\nsweep {parent.data.tags.get('sweep_id')}: parent run {parent.info.run_id}, "
                f"{len(children)} child runs"
            )
            keys = ["hit_at_5", "mrr", "ndcg_at_10", "faithfulness", "correctness", "rate_ok"]
            keys = [k for k in keys if any(k in c.data.metrics for c in children)]
            print(f"  {'run':<55} " + " ".join(f"{k:>12}" for k in keys))
            for c in sorted(children, key=lambda c: c.info.run_name or ""):
                vals = " ".join(f"{c.data.metrics.get(k, float('nan')):>12.3f}" for k in keys)
                print(f"  {(c.info.run_name or '')[:55]:<55} {vals}  {c.info.status}")
        print(f"\nOpen the MLflow UI:\n  {tracking.ui_command(uri, config.tracking.artifact_root)}")
        os.environ.pop("RAG_EXPERIMENTS_SWEEP", None)


def _terminate(signum, frame):  # SIGTERM (timeout, CI cancel) → KILLED run, never left RUNNING
    raise KeyboardInterrupt(f"signal {signum}")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    signal.signal(signal.SIGTERM, _terminate)
    for noisy in ("mlflow", "httpx", "httpx2", "openai"):  # one line per HTTP call drowns the summary
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return run_job(cfg)


if __name__ == "__main__":
    main()
