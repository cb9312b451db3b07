"""Everything the report reads from the run store: the target's runs, their per-query tables, the experiment.

The reader (``tracking.run_reader.RunReader``) is passed in; what comes back (:class:`ReportInput`) is
plain data the model is built from without touching the store again.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from rag_experiments.analysis.attribution import (
    RunData,
    _level,  # the level definition factor_effects uses, so labels match its tables
    infer_factors,
)
from rag_experiments.run.multirun import swept_override_keys
from rag_experiments.tracking.run_reader import RunReader
from rag_experiments.tracking.runs import RunInputError


@dataclass
class Target:
    """What the report is about: the runs, and where to log the report."""

    label: str  # sweep_id, or the run's name
    runs: list[RunData]
    log_run_id: str  # the parent run (sweep) or the run itself
    parent: RunData | None
    sweep_id: str | None
    unfinished: list[RunData] = field(default_factory=list)  # sweep configs with no FINISHED run

    def unfinished_note(self) -> str | None:
        """One line naming the sweep's configs that did not finish (FAILED, KILLED, RUNNING) and
        the ones that never logged a run (the parent's ``configs_finished`` tag counts them)."""
        named = [f"{r.run_name or r.run_id[:8]} ({r.status})" for r in self.unfinished]
        _, _, total = ((self.parent.tags.get("configs_finished") if self.parent else None) or "").partition("/")
        logged = len(self.runs) + len(self.unfinished)
        never = int(total) - logged if total.isdigit() and int(total) > logged else 0
        if not named and not never:
            return None
        parts = ([f"did not finish: {', '.join(named)}"] if named else []) + (
            [f"{never} never logged a run"] if never else []
        )
        return (
            f"{len(named) + never} config(s) of the sweep are not compared here ({'; '.join(parts)}); "
            f"the report covers the {len(self.runs)} that finished"
        )


def _unfinished(reader: RunReader, sweep_id: str, experiment: str | None) -> list[RunData]:
    """The sweep's configs whose latest run did not finish (``RunReader.sweep_config_runs``)."""
    return [r for r in reader.sweep_config_runs(sweep_id, experiment) if r.status != "FINISHED"]


def resolve_target(reader: RunReader, target: str, experiment: str | None = None) -> Target:
    """A sweep_id, a sweep's parent run (id or name), or a single run (id or name)."""
    children = reader.sweep_children(target, experiment)
    if children:
        pid = children[0].parent_id
        parent = reader.get(pid) if pid else None  # a deleted parent only loses the sweep-level tags
        return Target(target, children, pid or children[0].run_id, parent, target, _unfinished(reader, target, experiment))
    run = reader.resolve(target, experiment)
    tags = run.tags
    sweep_id = tags.get("sweep_id")
    if tags.get("is_parent") == "true" and sweep_id:
        kids = [r for r in reader.sweep_children(sweep_id, experiment) if r.parent_id == run.run_id]
        if not kids:
            raise RunInputError(f"sweep parent {run.label} has no child runs")
        return Target(sweep_id, kids, run.run_id, run, sweep_id, _unfinished(reader, sweep_id, experiment))
    if tags.get("is_parent") == "true":
        raise RunInputError(f"run {run.label} is a sweep parent without a sweep_id tag")
    return Target(run.run_name or run.run_id, [run], run.run_id, None, None)


@dataclass
class Config:
    """One run of the report, with its short label and per-query table (``run`` and ``data``
    are the same record, ``data`` the name attribution code knows it by)."""

    run: RunData
    data: RunData
    label: str

    @property
    def metrics(self) -> dict[str, float]:
        return dict(self.run.metrics)

    @property
    def params(self) -> dict[str, str]:
        return dict(self.run.params)

    @property
    def tags(self) -> dict[str, str]:
        return dict(self.run.tags)

    @property
    def table(self) -> pd.DataFrame:
        assert self.data.table is not None
        return self.data.table


def load_configs(reader: RunReader, runs: Sequence[RunData]) -> tuple[list[Config], list[str]]:
    """Each run with its per-query table, labelled by its factor levels; and the factors."""
    data = [reader.with_table(r) for r in runs]
    factors = infer_factors(data)
    configs = []
    for d in data:
        if factors:
            label = ", ".join(f"{f}={_level(d, f)}" for f in factors)
        else:
            label = d.run_name or d.run_id[:8]
        configs.append(Config(d, d, label))
    seen = Counter(c.label for c in configs)
    for c in configs:  # replicate runs (same levels) stay distinguishable
        if seen[c.label] > 1:
            c.label = f"{c.label} ({c.run.run_id[:6]})"
    return configs, factors


def level(c: Config, factor: str) -> str | None:
    """The config's level of ``factor``, as the attribution labels it."""
    return _level(c.data, factor)


@dataclass
class ReportInput:
    """The loaded runs of a report and the context it names (experiment, sweep parent)."""

    target: Target
    configs: list[Config]
    factors: list[str]
    experiment_name: str  # "?" when the experiment is gone
    stopped: list[Config] = field(default_factory=list)  # stopped early by racing (docs/racing.md)
    swept: list[str] = field(default_factory=list)  # every key the sweep varied: never "held fixed"

    @property
    def is_sweep(self) -> bool:
        return self.target.sweep_id is not None


def load_input(reader: RunReader, target: Target) -> ReportInput:
    from rag_experiments.analysis.racing import split_stopped

    configs, factors = load_configs(reader, target.runs)
    exp_name = reader.experiment_name(configs[0].run.experiment_id)
    swept = list(dict.fromkeys([*factors, *sweep_override_keys(target.parent)]))
    kept, stopped = split_stopped(configs)  # partial runs never enter the comparisons
    if stopped and kept:
        factors = infer_factors([c.data for c in kept])
    return ReportInput(
        target, kept or configs, factors, exp_name or "?", stopped if kept else [], swept
    )


def sweep_override_keys(parent: RunData | None) -> list[str]:
    """The keys the sweep's command line swept (``prompt=a,b``, ``retriever.k=range(1,4)``: the
    parent's ``sweep_overrides`` tag): a key swept whose other levels were stopped by racing or never
    finished is still not held fixed. [] without a parent, or when the tag does not parse."""
    try:
        args = json.loads((parent.tags.get("sweep_overrides") if parent else None) or "[]")
        return swept_override_keys(args)
    except Exception:  # noqa: BLE001 - an old or hand-edited tag only loses this safeguard
        return []
