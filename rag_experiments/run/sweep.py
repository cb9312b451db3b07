"""The main job: compose → build stages → run the eval set → log to MLflow.

    python -m rag_experiments.sweep                                   # default config
    python -m rag_experiments.sweep -m chunking=fixed,markdown retriever.k=3,5,10
    python -m rag_experiments.sweep +experiment=ablate_chunking       # a named ablation

Each resolved config is one MLflow run; under ``-m`` the runs are children of one parent run
(the multirun side, ``rag_experiments.run.multirun``, hands the jobs the sweep context in
``hydra.sweep.dir/.sweep.json``). Every config value is checked by ``config_schema`` and the data
loaded before any run exists: bad input exits 2 and creates nothing. A config whose
``config_hash`` already FINISHED is skipped unless ``force=true``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # offline by default: never reach a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import hydra  # noqa: E402
import pandas as pd  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from rag_experiments.core.cache import StageCache  # noqa: E402
from rag_experiments.core.identity import code_fingerprint, judge_fingerprint  # noqa: E402
from rag_experiments.core.progress import Progress, timing_table  # noqa: E402
from rag_experiments.core.redaction import redact  # noqa: E402
from rag_experiments.core.run_names import run_name  # noqa: E402
from rag_experiments.core.run_record import RunData  # noqa: E402
from rag_experiments.core.sanitize import shell_line, terminal_output  # noqa: E402
from rag_experiments.core.steps import StepFailed  # noqa: E402
from rag_experiments.evaluation.replicates import collapse_replicates  # noqa: E402
from rag_experiments.judge.validity import add_card  # noqa: E402
from rag_experiments.run import racing  # noqa: E402
from rag_experiments.run.assemble import (  # noqa: E402
    Loaded,
    hydra_context,
    job_settings,
    load_inputs,
    print_problems,
)
from rag_experiments.run.assemble import priced as _priced  # noqa: E402, F401 - tests price a stage config
from rag_experiments.run.config_schema import unknown_group_options  # noqa: E402
from rag_experiments.run.multirun import MultirunParent  # noqa: E402, F401 - conf names the callback here
from rag_experiments.run.pilot import print_pilot_mde  # noqa: E402
from rag_experiments.run.pipeline import PipelineResult, run_pipeline  # noqa: E402
from rag_experiments.run.run_summary import closing_notes, first_stage_lines, summary_table  # noqa: E402
from rag_experiments.run.steps import failure_reason as step_failure  # noqa: E402
from rag_experiments.run.steps import step_summary  # noqa: E402
from rag_experiments.run.types import JobSettings  # noqa: E402
from rag_experiments.stages import call_budget  # noqa: E402
from rag_experiments.tracking import writer as tracking  # noqa: E402
from rag_experiments.tracking.bounds import bound_tracking_calls  # noqa: E402
from rag_experiments.tracking.errors import infrastructure_error, infrastructure_exits_2  # noqa: E402
from rag_experiments.tracking.resume import original_run_id  # noqa: E402
from rag_experiments.tracking.run_store import RunStore  # noqa: E402
from rag_experiments.tracking.run_writer import MlflowRunWriter, RunResults, RunWriter, TraceInputs  # noqa: E402

log = logging.getLogger("rag_experiments")



@dataclass(frozen=True)
class Job:
    """One resolved config with its loaded inputs and typed settings: everything a run needs
    besides a run store. No Hydra config past this point (``assemble.job_settings``). Immutable:
    the prompt versions come from the store before the run (:func:`register_prompts`, a new Job);
    the judge card is returned by :func:`execute` beside the results."""

    setup: JobSettings
    inputs: Loaded  # the corpus, eval set and built stages
    cache: StageCache
    chash: str
    run_name: str
    t_start: float
    prompt_version: tuple[str, int] | None = None  # (registry name, version) the run links (docs/tracing.md)
    stage_prompts: tuple[tuple[str, int], ...] = ()  # the query transform's / LLM reranker's prompt versions

    @property
    def prompt_refs(self) -> tuple[tuple[str, int], ...]:
        """Every registered prompt version the run links: the answer prompt's, then its stages'."""
        return tuple(filter(None, (self.prompt_version, *self.stage_prompts)))

    @property
    def k(self) -> int:
        return self.setup.run.k

    @property
    def ks(self) -> list[int]:
        return list(self.setup.run.ks)

    @property
    def sweep(self) -> dict | None:
        return self.setup.sweep

    @property
    def overrides(self) -> list[str]:
        return list(self.setup.overrides)


def describe_job(setup: JobSettings, inputs: Loaded, cache: StageCache, t_start: float) -> Job:
    """The job's ``config_hash`` and run name (in a sweep, the name shows only the overrides that vary)."""
    chash = tracking.config_hash(
        setup.full, inputs.corpus.digest, inputs.evalset.digest, inputs.stages.identities()
    )
    name = run_name(list(setup.overrides), setup.sweep.get("varying") if setup.sweep else None)
    return Job(setup, inputs, cache, chash, name, t_start)


def run_tags(job: Job) -> dict[str, str]:
    tags = {
        "config_hash": job.chash,
        "code_fingerprint": code_fingerprint(),
        "corpus_digest": job.inputs.corpus.digest,
        "evalset_digest": job.inputs.evalset.digest,
        "overrides": json.dumps(job.overrides),
        "command": shell_line(sys.argv),  # copy-pasted, it reruns exactly this
        "runner": tracking.runner_id(),
        **tracking.git_info(),
        **{f"version.{p}": v for p, v in tracking.package_versions().items()},
    }
    gen, judge = job.inputs.stages.generator, job.inputs.stages.judge
    if gen is not None:
        tags["generator_model"] = getattr(gen, "model", "")
        tags["judge_model"] = str(getattr(judge, "model", None))
        tags["judge_identity"] = judge_fingerprint(judge) or ""  # compare/gate/select: one judge
        tags["judge_repeats"] = str(1 + len(job.inputs.stages.judge_repeats))
        if getattr(judge, "model", None) and judge.model == getattr(gen, "model", None):
            log.warning(
                "the judge model equals the generator model (%s): expect self-preference bias", gen.model
            )
            tags["judge_is_generator"] = "true"
    return tags


def run_params(job: Job) -> dict[str, str]:
    """The flattened resolved config plus the group choices (``chunking`` = ``fixed``)."""
    params = {
        k: v for k, v in tracking.flatten(job.setup.full).items() if not k.startswith(("tracking.", "hydra."))
    }
    params.update(job.setup.choices)  # the group choices (assemble.hydra_context: STAGE_GROUPS only)
    return params


def _log(writer: RunWriter, run_id: str, job: Job, res: PipelineResult, model_id: str | None = None) -> None:
    evalset = job.inputs.evalset
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
        "config.yaml": job.setup.config_yaml,  # the resolved config's text, made at assembly
        "cache_keys.json": json.dumps(res.cache_keys, indent=2),
    }
    if job.inputs.stages.prompt is not None:
        artifacts["prompt_template.txt"] = job.inputs.stages.prompt.text
    timing = res.timings  # logging_s is measured below; the printed table has it, the tag says 0
    timing.update(logging_s=0.0, total_s=time.perf_counter() - job.t_start)
    extra = {
        "n_chunks": str(res.n_chunks),
        "model_calls": json.dumps(res.calls),
        "timings": json.dumps({k: round(v, 3) for k, v in timing.items()}),
        **{f"cache_key.{k}": v for k, v in res.cache_keys.items()},
        **res.tags,
    }
    t_log, bar = time.perf_counter(), Progress("mlflow logging", None, job.setup.progress)
    results = RunResults(res.aggregates, res.per_query, evalset_df, evalset.path, evalset.digest, artifacts, extra)
    writer.log_results(run_id, results, model_id=model_id)
    bar.close()
    timing["logging_s"] = time.perf_counter() - t_log
    timing["total_s"] = time.perf_counter() - job.t_start


def failure_reason(res: PipelineResult) -> str:
    """Why a completed pipeline is a FAILED run ("" when it is not): a step failed on every item it
    was asked to do (``run.steps.failure_reason``: a dead generator, judge, reranker or transform)."""
    return step_failure(res.records)


def trace_inputs(job: Job) -> TraceInputs:
    """What the run's traces are built from: its trace settings, eval items, documents, stages."""
    inputs, gen = job.inputs, job.inputs.stages.generator
    return TraceInputs(
        job.setup.traces,
        inputs.evalset.items,
        inputs.corpus.docs,
        inputs.evalset.digest,
        prompt=inputs.stages.prompt,
        generator_model=getattr(gen, "model", None) if gen is not None else None,
        judge=inputs.stages.judge,
        prompt_version=job.prompt_version,
    )


def execute(writer: RunWriter, run_id: str, job: Job, parent_id: str | None) -> tuple[PipelineResult, dict | None]:
    """Run the pipeline into ``run_id`` and set its final status, last; re-raises after marking it.
    Returns the pipeline's result and the judge's validity card (None: none, docs/judges.md).

    FINISHED only when some query succeeded: a run with an error on every item is FAILED (tag
    ``failure_reason``) so that a re-run retries it.
    """
    try:
        from rag_experiments.run.racing import race_for  # racing=true: docs/racing.md

        inputs = job.inputs
        version = writer.begin_version(run_id, job.chash, inputs.stages.identities(), job.prompt_refs)
        res = run_pipeline(inputs.stages, inputs.data, job.setup.run, job.cache, race_for(job, run_id))
        card = add_card(  # docs/judges.md
            job.setup.card, inputs.stages, inputs.corpus.docs, job.cache, res, job.setup.progress
        )
        model_id = writer.link_version(run_id, job.chash, version, job.prompt_refs)  # "Agent versions"
        _log(writer, run_id, job, res, model_id)
        # one trace per eval item (docs/tracing.md); replicates collapsed (evaluation.replicates);
        # its time is a row of the per-stage table
        per_item = collapse_replicates(res.per_query)
        res.timings["traces_s"] = writer.log_traces(run_id, per_item, trace_inputs(job), model_id)
        if inputs.stages.generates:  # the judge in the Judges tab, where MLflow accepts it (docs/tracing.md)
            writer.register_judges(inputs.stages.judge)
        res.timings["total_s"] = time.perf_counter() - job.t_start
        writer.set_tags(run_id, {"timings": json.dumps({k: round(v, 3) for k, v in res.timings.items()})})
        if why := failure_reason(res):
            writer.set_tags(run_id, {"failure_reason": why})
            writer.end(run_id, "FAILED")
            print(f"[failed] {job.run_name}: {why}; marked FAILED so a re-run retries it", file=sys.stderr)
        else:
            writer.end(run_id, "FINISHED")
        return res, card
    except StepFailed as e:  # a step that cannot go on: FAILED with its reason, no traceback
        why = redact(e.reason)
        writer.set_tags(run_id, {"failure_reason": why})
        writer.end(run_id, "FAILED")
        print(f"[failed] {job.run_name}: {why}; marked FAILED so a re-run retries it", file=sys.stderr)
        raise
    except BaseException as e:
        status = writer.abort(run_id, e, parent_id)
        if status == "FAILED" and infrastructure_error(e) is None:
            print(redact(traceback.format_exc()), file=sys.stderr, end="")
        raise


def start_run(writer: RunWriter, job: Job) -> tuple[str, str | None]:
    """(child run id, parent run id or None): the run is created only now, inputs all valid.
    In a multirun the store elects the parent (cross-host, ``tracking.parents.start_sweep_child``)."""
    return writer.start(job.run_name, run_tags(job), run_params(job), job.sweep, job.setup.force)


def reuse_in_sweep(store: RunStore, job: Job, done: RunData) -> str | None:
    """Make the FINISHED run ``done`` part of this multirun (``RunStore.reuse_in_sweep``): a child
    of its parent carrying ``done``'s results, so the sweep counts, lists and reports the config.
    None when the parent already holds this config (a resumed sweep)."""
    run_id = store.reuse_in_sweep(done, job.chash, job.sweep, job.setup.force, lambda: start_run(store, job))
    if run_id is not None:
        origin = original_run_id(done.tags, done.run_id)
        print(f"[reuse] {job.run_name}: counted in this sweep as run {run_id} (results of run {origin})")
    return run_id


def register_prompts(store: RunStore, job: Job) -> Job:
    """The job with its prompts' registry versions (by content): the answer prompt's and the query
    transform's / LLM reranker's, which the run and its traces link to (docs/tracing.md)."""
    stages = job.inputs.stages
    version = store.register_prompt(stages.prompt) if stages.prompt is not None else None
    return replace(job, prompt_version=version, stage_prompts=tuple(store.register_stage_prompts(stages)))


def open_store(job: Job, uri: str) -> MlflowRunWriter:
    """The production run store: the MLflow store at ``uri``, in the experiment that holds the
    job's runs (in a sweep, the one the multirun chose: it holds the parent)."""
    s = job.setup
    experiment = (s.sweep or {}).get("experiment_name") or s.experiment_name
    return MlflowRunWriter.open(uri, experiment, s.artifact_root)


def run_job(job: Job, store: RunStore) -> float:
    """One assembled job → one run in ``store``. Returns the context hit rate (Hydra's objective).

    The skip check and the run hold a lock on the config_hash, so identical sweeps started
    together run each config once; RUNNING runs of that config left by a dead process are
    marked KILLED first.
    """
    s, t_start, cache = job.setup, job.t_start, job.cache
    print_pilot_mde(store, job)  # the primary metric's MDE, from a pilot run
    job = register_prompts(store, job)  # templates in the Prompt Registry, by content
    with store.config_lock(job.chash):
        for rid in store.heal_stale_runs(job.chash):
            print(f"[healed] run {rid} of config_hash {job.chash} was left RUNNING by a dead process: KILLED")
        run_name, chash, k = job.run_name, job.chash, job.k
        fingerprint = code_fingerprint()
        done, why = (None, "") if s.force else store.resume_decision(chash, fingerprint)
        if done is not None:
            print(f"[skip] {run_name}: {why}")
            if job.prompt_version:  # e.g. v3 holds v1's text: the v1 run is v3's result too
                store.link_reused_run(done.run_id, job.prompt_version)
            if job.sweep:  # a sweep is the set of its configs: the finished one joins this sweep
                reuse_in_sweep(store, job, done)
            if s.racing is not None and job.sweep:  # its values race the configs this invocation runs
                racing.republish(job, done.run_id, done.tags, store.per_query(done))
            return float(done.metrics.get(f"hit_at_{k}", float("nan")))
        if why:
            print(f"[rerun] {run_name}: {why}")
        if stopped := call_budget.stop_reason():  # an earlier config of this sweep spent the budget
            print(f"[budget] {run_name}: not started: {stopped}; raise it and run the same command", file=sys.stderr)
            return float("nan")
        run_id, parent_id = start_run(store, job)
        try:
            res, card = execute(store, run_id, job, parent_id)
        except StepFailed:  # said and marked in execute: a sweep goes on, a single run exits 1
            if job.sweep:
                return float("nan")
            sys.exit(1)
    print(f"\n== {run_name}  (run {run_id}, {res.n_chunks} chunks, {time.perf_counter() - t_start:.1f}s)")
    print(summary_table(res.aggregates, k, job.ks))
    for line in first_stage_lines(res.per_query, res.aggregates, k, job.ks):  # rerank: what it added
        print(line)
    if card is not None:
        print(card["line"])
    if job.inputs.stages.generates:  # once per run: synthetic card and no human labels yet
        for note in closing_notes(res.aggregates, res.tags, run_id):  # judge claims, then answers
            print(f"note: {note}")
    n_items = len(job.inputs.evalset.items)
    if job.inputs.stages.generates and res.n_generated < n_items:
        what = "stopped by racing after" if res.tags.get("racing.status") == "stopped" else "stratified subset of"
        print(
            f"generation metrics and label rates: {what} n={res.n_generated} of "
            f"{n_items} items (generation_subset={s.run.generation_subset}; "
            "generation_subset=null for all); retrieval metrics: all items"
        )
    print(timing_table(res.timings))
    print(f"model calls {res.calls or '{}'}; cache {dict(sorted(cache.stats.items()))}")
    if not job.sweep and (ui := store.ui_line()):
        print(f"\nOpen the MLflow UI:\n  {ui}")
    if n_failed := int(res.aggregates.get("n_judge_errors", 0)):
        print(f"[warn] {run_name}: {n_failed} judge calls failed on transport errors", file=sys.stderr)
    for line in step_summary(res.records):  # partial failures: what the same command will redo
        print(f"[warn] {run_name}: {line}", file=sys.stderr)
    if failure_reason(res) and not job.sweep:
        sys.exit(1)
    return float(res.aggregates.get(f"hit_at_{k}", float("nan")))


_SIGNAL: list[int] = []  # the signal that stopped this process, once one has


def _terminate(signum, frame):  # SIGTERM (timeout, CI cancel) → KILLED run, never left RUNNING
    if _SIGNAL:  # a second signal must not break the cleanup of the first (the run left RUNNING)
        print(f"[interrupted] {signal.Signals(signum).name} again: still marking the run KILLED", file=sys.stderr)
        return
    _SIGNAL.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


# An absolute path: the job is imported from the ``rag_experiments.sweep`` shim, and Hydra resolves a
# relative path against an imported module as ``pkg://``, which needs ``conf/`` to be a package.
@hydra.main(version_base="1.3", config_path=str(Path(__file__).resolve().parent.parent / "conf"), config_name="config")
def main(cfg: DictConfig) -> float:
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):  # a multirun installed its own
        signal.signal(signal.SIGTERM, _terminate)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _terminate)
    for noisy in ("mlflow", "httpx", "httpx2", "openai"):  # one line per HTTP call drowns the summary
        logging.getLogger(noisy).setLevel(logging.WARNING)
    with terminal_output(), infrastructure_exits_2():  # the store named, exit 2 (tracking/errors.py)
        # The Hydra config stops here: assembly turns it into typed settings and built stages.
        t_start = time.perf_counter()
        cache = StageCache(cfg.cache_dir, enabled=cfg.get("cache_enabled", True))
        bound_tracking_calls(cfg.tracking.get("timeout_s"))  # every MLflow call (prompt=registry too) is bounded
        uri = tracking.resolve_uri(cfg.tracking.uri)  # after: a PostgreSQL connect timeout comes from it
        if cfg.get("dry_run"):  # set in a YAML (the command line's is cli()'s): this job's calls, no run
            from rag_experiments.run.assemble import ComposedJob
            from rag_experiments.run.dry_run import report

            if report([ComposedJob(tuple(hydra_context().overrides), cfg)]):
                sys.exit(2)
            return float("nan")
        inputs = load_inputs(cfg, cache)  # bad input exits 2 here, before any MLflow run exists
        job = describe_job(job_settings(cfg, hydra_context()), inputs, cache, t_start)
        return run_job(job, open_store(job, uri))


def cli() -> None:
    """``python -m rag_experiments.sweep``: unknown options and missing launcher plugins exit 2
    before Hydra composes."""
    from rag_experiments.run.config_keys import unknown_config_keys  # typo'd keys: exit 2, not Hydra's 1
    from rag_experiments.run.launchers import missing_launcher_plugins
    from rag_experiments.run.racing import rewrite_argv

    sys.argv[1:] = rewrite_argv(sys.argv[1:])  # racing=true → racing.enabled=true
    argv = sys.argv[1:]
    bad = unknown_group_options(argv) + missing_launcher_plugins(argv)
    if not bad:  # typo'd keys need the groups and launcher to compose: checked once those are known good
        bad = unknown_config_keys(argv)
    if bad:
        print_problems(bad)
        sys.exit(2)
    if any(a.lstrip("+").lower() == "dry_run=true" for a in argv):  # counted, not run: no Hydra job, no MLflow run
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra
        from hydra.types import RunMode

        from rag_experiments.core.conf_groups import conf_dir
        from rag_experiments.run.assemble import ComposedJob
        from rag_experiments.run.dry_run import report
        from rag_experiments.run.multirun import multirun_job_configs

        multirun = any(a in ("-m", "--multirun") for a in argv)
        overrides = [a for a in argv if a not in ("-m", "--multirun")]
        jobs, bad = None, [f"dry_run=true: takes overrides and -m only (got {a})" for a in overrides if a.startswith("-")]
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            try:  # the jobs as Hydra's basic sweeper would launch them
                cfg = GlobalHydra.instance().config_loader().load_configuration(
                    "config", overrides, run_mode=RunMode.MULTIRUN if multirun else RunMode.RUN, from_shell=True
                )
                jobs = multirun_job_configs(cfg) if multirun else [(overrides, cfg)]
            except Exception as e:  # noqa: BLE001 - a composition error is the command line's
                bad.append(f"conf/config: {str(e).splitlines()[0]}")
        if jobs is None and not bad:
            bad.append("dry_run=true: needs the basic sweeper (its jobs are known before any runs)")
        if bad:
            print_problems(bad)
            sys.exit(2)
        sys.exit(report([ComposedJob(tuple(o), c) for o, c in jobs]))
    try:
        main()
    except KeyboardInterrupt as e:
        # The run (and a sweep's parent) is marked KILLED by now. Do not join the model calls still
        # in flight (a trickling endpoint, a local generation): end the process at once.
        signum = _SIGNAL[0] if _SIGNAL else signal.SIGINT
        print(f"[interrupted] {signal.Signals(signum).name}: run marked KILLED; {e or 'Ctrl-C'}; "
              "in-flight model calls abandoned (the same command resumes)", file=sys.stderr)
        # The atexit cleanups (a multirun's parent run, the store's connections) still run; only
        # the interpreter's join of the worker threads is skipped, and the embedded llama.cpp
        # server is not torn down: its destructor waits for the slots still decoding (a hang seen
        # after SIGTERM during generation=local); the process ends at once and the OS frees it.
        from rag_experiments.stages.generation import shutdown_local_servers

        atexit.unregister(shutdown_local_servers)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + int(signum))


if __name__ == "__main__":
    cli()
