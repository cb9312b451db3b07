"""The multirun side of a sweep: check every job first, share one parent run, close it.

``MultirunParent`` is the Hydra callback (``hydra.callbacks`` in ``conf/config.yaml``). It hands
the jobs the sweep context through ``hydra.sweep.dir/.sweep.json`` (so joblib or Ray workers
read it too) and sets the parent's final status from its configs' final states.
"""

from __future__ import annotations

import atexit
import json
import signal
import sys
import uuid
from typing import Any

from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rag_experiments.sweep import _container, _input_error, _problems_of, print_problems, run_name_from


def multirun_job_configs(config: DictConfig) -> list[tuple[list[str], DictConfig]] | None:
    """(overrides, composed config) of every job the basic sweeper will launch, before any runs.

    None for other sweepers (Optuna, Ax …), whose jobs depend on earlier results.
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not str(config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    loader = GlobalHydra.instance().config_loader()
    params = config.hydra.sweeper.get("params") or {}
    args = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(args)
    jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
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
            from rag_experiments.config_schema import ConfigError, check

            check(job_cfg)
        except ConfigError as e:
            problems += [f"job {name}: {p}" for p in e.problems]
            continue
        data_key = json.dumps(
            _container(OmegaConf.masked_copy(job_cfg, ["corpus", "evalset"])), sort_keys=True
        )
        if data_key in seen_data:
            continue
        seen_data.add(data_key)  # loads are cached per process: the jobs reuse them
        from rag_experiments.datasets.corpus import CorpusError
        from rag_experiments.evalset import EvalSetError

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
        from mlflow.tracking import MlflowClient

        from rag_experiments.tracking import writer as tracking

        client = MlflowClient(tracking_uri=self.uri)
        exp_id, parent = tracking.find_parent(client, self.experiment_name, self.invocation)
        if parent is not None and client.get_run(parent.info.run_id).info.status == "RUNNING":
            status = tracking.close_parent(
                client, exp_id, parent.info.run_id, complete=False, interrupted=self.interrupted
            )
            print(f"sweep ended early: parent run {parent.info.run_id} marked {status}", file=sys.stderr)


class MultirunParent(Callback):
    """Validates every job's config first, hands the jobs the sweep context
    (``hydra.sweep.dir/.sweep.json``), and closes the shared parent run when the sweep ends."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        # Before Hydra writes its outputs: a key pasted into api_key_env must not reach them.
        problems, _ = _config_problems(config)
        if problems:
            print_problems(problems)
            sys.exit(2)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from rag_experiments.cache import stable_hash
        from rag_experiments.tracking import writer as tracking

        problems = validate_multirun(config)
        if problems:
            print_problems(problems, "no run was created: fix these inputs first")
            sys.exit(2)
        overrides = list(config.hydra.overrides.task)
        params = config.hydra.sweeper.get("params") or {}
        params = OmegaConf.to_container(params) if OmegaConf.is_config(params) else dict(params)
        sweep = {
            "sweep_hash": stable_hash("sweep", config.experiment_name, sorted(overrides), params)[:16],
            "invocation": uuid.uuid4().hex,
            "overrides": overrides,
            "command": "python -m rag_experiments.sweep " + " ".join(sys.argv[1:]),
        }
        tracking.write_sweep_context(config.hydra.sweep.dir, sweep)
        uri = tracking.resolve_uri(config.tracking.uri)
        self._guard = _SweepGuard(uri, config.experiment_name, sweep["invocation"])
        atexit.register(self._guard.on_exit)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._guard.on_signal)
        # Create the store and experiment here, once: parallel workers (joblib) that each
        # initialise a fresh sqlite schema race on its migrations.

        client = tracking.open_store(uri)
        tracking.get_experiment_id(client, config.experiment_name, config.tracking.artifact_root)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from mlflow.tracking import MlflowClient

        from rag_experiments.tracking import writer as tracking

        sweep = tracking.read_sweep_context(config.hydra.sweep.dir)
        guard = getattr(self, "_guard", None)
        if not sweep:
            return
        uri = tracking.resolve_uri(config.tracking.uri)
        client = MlflowClient(tracking_uri=uri)
        exp_id, parent = tracking.find_parent(client, config.experiment_name, sweep["invocation"])
        if parent is not None:
            status = tracking.close_parent(client, exp_id, parent.info.run_id, complete=True)
            _print_sweep(client, exp_id, client.get_run(parent.info.run_id), status)
        if guard is not None:
            guard.ended = True
        print(f"\nOpen the MLflow UI:\n  {tracking.ui_command(uri, config.tracking.artifact_root, exp_id)}")


def _config_problems(config: DictConfig) -> tuple[list[str], None]:
    from rag_experiments.config_schema import ConfigError, check

    try:
        check(OmegaConf.masked_copy(config, [k for k in config if k != "hydra"]))
    except ConfigError as e:
        return e.problems, None
    return [], None


def _print_sweep(client, exp_id: str, parent, status: str) -> None:
    from rag_experiments.tracking.runs import sweep_children

    children = sweep_children(client, parent.data.tags["sweep_id"])
    print(
        f"\nsweep {parent.data.tags.get('sweep_id')}: parent run {parent.info.run_id} {status}, "
        f"configs finished {parent.data.tags.get('configs_finished', '?')}"
    )
    keys = ["hit_at_5", "mrr", "ndcg_at_10", "faithfulness", "correctness", "rate_ok"]
    keys = [k for k in keys if any(k in c.data.metrics for c in children)]
    print(f"  {'run':<55} " + " ".join(f"{k:>12}" for k in keys))
    for c in sorted(children, key=lambda c: c.info.run_name or ""):
        vals = " ".join(f"{c.data.metrics.get(k, float('nan')):>12.3f}" for k in keys)
        print(f"  {(c.info.run_name or '')[:55]:<55} {vals}  {c.info.status}")
