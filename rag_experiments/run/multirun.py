"""The multirun side of a sweep: check every job first, share one parent run, close it.

``MultirunParent`` is the Hydra callback (``hydra.callbacks`` in ``conf/config.yaml``). It hands
the jobs the sweep context through ``hydra.sweep.dir/.sweep.json`` (so joblib or Ray workers
read it too) and sets the parent's final status from its configs' final states.
"""

from __future__ import annotations

import atexit
import itertools
import json
import signal
import sys
import time
import uuid
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rag_experiments.core.cache import stable_hash
from rag_experiments.core.formatting import fmt_num, text_blocks
from rag_experiments.core.run_names import constant_overrides, run_name, swept_keys, varying_keys
from rag_experiments.core.sanitize import shell_line
from rag_experiments.evalset.corpus import CorpusError
from rag_experiments.evalset.load import EvalSetError
from rag_experiments.evaluation.headline import table_metrics
from rag_experiments.run.assemble import container as _container
from rag_experiments.run.assemble import input_error as _input_error
from rag_experiments.run.assemble import instantiate, print_problems, racing_enabled, run_name_from
from rag_experiments.run.assemble import problems_of as _problems_of
from rag_experiments.run.config_schema import ConfigError, check
from rag_experiments.tracking import writer as tracking
from rag_experiments.tracking.bounds import best_effort, bound_tracking_calls
from rag_experiments.tracking.errors import infrastructure_exits_2
from rag_experiments.tracking.mlflow_adapter_session import release_interrupted_connections
from rag_experiments.tracking.parents import close_sweep_early, end_sweep
from rag_experiments.tracking.prompt_registry import registered_prompt_problems
from rag_experiments.tracking.reuse import REUSED_FROM
from rag_experiments.tracking.runs import sweep_config_runs


def split_sweep(overrides) -> list[list[str]]:
    """The jobs of a basic sweep: the cartesian product of the overrides' values in order, as
    Hydra's ``BasicSweeper.split_arguments`` forms them, through the public ``Override`` API (no
    private Hydra import). Range/interval sweeps are refused as the basic sweeper refuses them."""
    choices: dict[str, list[str]] = {}
    for o in overrides:
        key = o.get_key_element()
        if o.is_sweep_override() and not o.is_discrete_sweep():
            raise ValueError(f"the basic sweeper does not support sweep type {o.value_type.name} ({key})")
        vals = o.sweep_string_iterator() if o.is_sweep_override() else [o.get_value_element_as_str()]
        choices[key] = [f"{key}={v}" for v in vals]
    return [list(job) for job in itertools.product(*choices.values())]


def _sweep_args(config: DictConfig) -> list[str]:
    """The sweep's overrides: the sweeper's ``params`` (named experiments) then the command line's."""
    params = config.hydra.sweeper.get("params") or {}
    return [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)


def swept_override_keys(args: list[str]) -> list[str]:
    """The keys a sweep's command-line overrides sweep (``prompt=concise,cite`` → ``prompt``), read
    with Hydra's own override parser (the report keeps them out of "Held fixed")."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return swept_keys(OverridesParser.create().parse_overrides([str(a) for a in args]))


def sweep_naming(config: DictConfig) -> dict[str, list[str]]:
    """``varying``: the override keys whose value differs between the jobs (they name the runs,
    ``run_names``); ``constants``: the overrides every job shares (the parent's description)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = _sweep_args(config)
    parsed = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader()).parse_overrides(args)
    if str(config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        jobs = split_sweep(parsed)
        varying = varying_keys(jobs)
        return {"varying": varying, "constants": constant_overrides(jobs[0] if jobs else [], varying)}
    varying = swept_keys(parsed)  # Optuna, Ax …: the jobs are not known up front
    fixed = [a for a, o in zip(args, parsed, strict=True) if not o.is_sweep_override()]
    return {"varying": varying, "constants": constant_overrides(fixed, varying)}


def multirun_job_configs(config: DictConfig) -> list[tuple[list[str], DictConfig]] | None:
    """(overrides, composed config) of every job the basic sweeper will launch, before any runs.

    None for other sweepers (Optuna, Ax …), whose jobs depend on earlier results.
    """
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not str(config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    loader = GlobalHydra.instance().config_loader()
    args = _sweep_args(config)
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(args)
    jobs = split_sweep(parsed)
    return [(list(job), loader.load_sweep_config(config, list(job))) for job in jobs]


def validate_multirun(config: DictConfig) -> list[str]:
    """Every job's config and data checked up front: one bad job stops the sweep before any run."""
    jobs = multirun_job_configs(config)
    problems: list[str] = []
    seen_data: set[str] = set()
    for overrides, job_cfg in jobs or []:
        job_cfg = OmegaConf.masked_copy(job_cfg, [k for k in job_cfg if k != "hydra"])
        name = run_name_from(overrides)
        try:
            check(job_cfg)
        except ConfigError as e:
            problems += [f"job {name}: {p}" for p in e.problems]
            continue
        prompt_ref = (_container(job_cfg.generator), _container(job_cfg.get("prompt")))  # prompt=registry
        problems += [f"job {name}: {p}" for p in registered_prompt_problems(*prompt_ref)]
        data_key = json.dumps(
            _container(OmegaConf.masked_copy(job_cfg, ["corpus", "evalset"])), sort_keys=True
        )
        if data_key in seen_data:
            continue
        seen_data.add(data_key)  # loads are cached per process: the jobs reuse them

        try:
            instantiate(job_cfg.evalset, corpus=instantiate(job_cfg.corpus))
        except Exception as e:  # noqa: BLE001 - only input errors are reported, others re-raised
            cause = _input_error(e, (EvalSetError, CorpusError, FileNotFoundError))
            if cause is None:
                raise
            problems += [f"job {name}: {p}" for p in _problems_of(cause)]
    return problems


class _SweepGuard:
    """Closes the parent run when a multirun ends early (signal between jobs, a job's exit 2).

    Registered with atexit by the callback; the sweep's normal end sets ``ended``.
    """

    def __init__(self, uri: str, experiment_name: str, invocation: str):
        self.uri, self.experiment_name, self.invocation = uri, experiment_name, invocation
        self.ended = False
        self.interrupted = ""

    def on_signal(self, signum, frame):
        if self.interrupted:  # a second signal must not break the cleanup of the first
            return
        self.interrupted = signal.Signals(signum).name
        raise KeyboardInterrupt(f"signal {signum}")

    def on_exit(self) -> None:
        if self.ended:
            return
        if self.interrupted:  # the signal may have hit inside a store transaction
            with best_effort("release the interrupted store connection"):
                release_interrupted_connections(self.uri)
        with best_effort("close the sweep's parent run"):
            self._close_parent()

    def _close_parent(self) -> None:
        closed = close_sweep_early(self.uri, self.experiment_name, self.invocation, self.interrupted)
        if closed is not None:
            print(f"sweep ended early: parent run {closed[0]} marked {closed[1]}", file=sys.stderr)


class MultirunParent(Callback):
    """Validates every job's config first, hands the jobs the sweep context
    (``hydra.sweep.dir/.sweep.json``), and closes the shared parent run when the sweep ends."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Before Hydra writes its outputs: a key pasted into api_key_env must not reach them.
        from rag_experiments.run.racing import job_problems

        problems = _config_problems(config)[0] + job_problems(racing_enabled(config), None)  # racing needs -m
        if problems:
            print_problems(problems)
            sys.exit(2)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from rag_experiments.run.racing import job_problems

        jobs = multirun_job_configs(config) or []
        n_jobs = len(jobs)  # K, for racing's α/(K − 1)
        bound_tracking_calls(config.tracking.get("timeout_s"))  # prompt=registry reads the store
        with infrastructure_exits_2():
            problems = validate_multirun(config) + job_problems(racing_enabled(config), {"n_jobs": n_jobs})
        if problems:
            print_problems(problems, "no run was created: fix these inputs first")
            sys.exit(2)
        _warn_inert(jobs)
        overrides = list(config.hydra.overrides.task)
        params = config.hydra.sweeper.get("params") or {}
        params = OmegaConf.to_container(params) if OmegaConf.is_config(params) else dict(params)
        invocation = uuid.uuid4().hex
        sweep = {
            "sweep_hash": stable_hash("sweep", config.experiment_name, sorted(overrides), params)[:16],
            "invocation": invocation,
            # fixed here, once: parents created by jobs on different hosts carry the same sweep_id
            "sweep_id": time.strftime("%Y%m%d-%H%M%S-") + invocation[:6],
            "overrides": overrides,
            "command": "python -m rag_experiments.sweep " + shell_line(sys.argv[1:]),
            "n_jobs": n_jobs,
            # the parent's experiment, for every job: a sweep over corpus.path names no single corpus
            "experiment_name": str(config.experiment_name),
            **sweep_naming(config),  # run names show only what varies (run_names)
        }
        tracking.write_sweep_context(config.hydra.sweep.dir, sweep)
        bound_tracking_calls(config.tracking.get("timeout_s"))
        with infrastructure_exits_2():  # after the budget: a PostgreSQL store's connect timeout
            uri = tracking.resolve_uri(config.tracking.uri)
        self._guard = _SweepGuard(uri, config.experiment_name, sweep["invocation"])
        atexit.register(self._guard.on_exit)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._guard.on_signal)
        # Create the store and experiment here, once: parallel workers (joblib) that each
        # initialise a fresh sqlite schema race on its migrations.
        with infrastructure_exits_2():
            client = tracking.open_store(uri)
            tracking.get_experiment_id(client, config.experiment_name, config.tracking.artifact_root)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        with infrastructure_exits_2():  # the store went away during the sweep: URI named, exit 2
            self._end(config)

    def _end(self, config: DictConfig) -> None:
        sweep = tracking.read_sweep_context(config.hydra.sweep.dir)
        guard = getattr(self, "_guard", None)
        if not sweep:
            return
        uri = tracking.resolve_uri(config.tracking.uri)
        # every job has ended: this pass sees every parent any host created (tracking.parents)
        client, exp_id, parent, status = end_sweep(uri, config.experiment_name, sweep["invocation"])
        if parent is not None:
            _print_sweep(client, exp_id, parent, status, sweep.get("varying"))
        if guard is not None:
            guard.ended = True
        print(f"\nOpen the MLflow UI:\n  {tracking.ui_command(uri, config.tracking.artifact_root, exp_id)}")
        if status != "FINISHED":  # a sweep with a FAILED config fails as a single failed run does
            print(f"sweep {status}: not every config FINISHED (listed above)", file=sys.stderr)
            sys.exit(1)


def _warn_inert(jobs: list[tuple[list[str], DictConfig]]) -> None:
    """Before the first job: swept factors no computed metric depends on (``run.pilot.inert_factors``)."""
    from rag_experiments.run.pilot import inert_factors, inert_warning

    gen = [bool(c.get("generator") and c.generator.get("_target_")) for _, c in jobs]
    if inert := inert_factors([o for o, _ in jobs], gen):
        print(inert_warning(inert, len(jobs)), file=sys.stderr)


def _config_problems(config: DictConfig) -> tuple[list[str], None]:
    try:
        check(OmegaConf.masked_copy(config, [k for k in config if k != "hydra"]))
    except ConfigError as e:
        return e.problems, None
    return [], None


def _print_sweep(client, exp_id: str, parent, status: str, varying: list[str] | None = None) -> None:
    """One row per config, named by the overrides that vary (``run_names``), with the headline
    metrics of the swept factors as columns (``evaluation.headline.table_metrics``, the rule
    ``compare --sweep`` uses); wide tables continue in column blocks, nothing is cut."""
    children = sweep_config_runs(client, parent.data.tags["sweep_id"])  # every config, any status
    print(
        f"\nsweep {parent.data.tags.get('sweep_id')}: parent run {parent.info.run_id} {status}, "
        f"configs finished {parent.data.tags.get('configs_finished', '?')}"
    )
    if not children:
        return
    if varying is None:  # an older context: the keys of the sweep's overrides that vary
        varying = varying_keys(json.loads(c.data.tags.get("overrides") or "[]") for c in children)
    keys = table_metrics(set().union(*(c.data.metrics for c in children)), varying)
    done = [c for c in children if c.info.status == "FINISHED"]
    same = {  # a metric every config scored the same: listed once, not a column
        k: v.pop()
        for k in keys
        if len(done) > 1 and len(v := {c.data.metrics.get(k) for c in done}) == 1 and None not in v
    }
    keys = [k for k in keys if k not in same]
    rows = []
    for c in children:
        name = run_name(json.loads(c.data.tags.get("overrides") or "[]"), varying) if varying else ""
        name = name or c.info.run_name or c.info.run_id
        status_mark = "" if c.info.status == "FINISHED" else f" ({c.info.status})"
        if c.data.tags.get(REUSED_FROM):  # finished by an earlier run, counted in this sweep
            status_mark += " (reused)"
        rows.append([name + status_mark, *(fmt_num(c.data.metrics.get(k), 3) for k in keys)])
    print(text_blocks(["run", *keys], sorted(rows)))  # every config listed, even when no metric differs
    if same:
        print("constant across the configs: " + ", ".join(f"{k} = {fmt_num(v, 3)}" for k, v in same.items()))
