"""The sweep's opening line on power: the minimum detectable effect of its primary metric, from the
latest finished run of the same eval set (the pilot). ``python -m rag_experiments.plan`` is the full
planner (docs/metrics.md, "Replicates, noise and power"). The degenerate cases follow
``evaluation.intervals``: a pilot whose values do not vary is "not plannable from this pilot: no
variance", never an MDE of 0; a pilot of another config is named as such."""

from __future__ import annotations

import logging

from rag_experiments.analysis.power import mde, paired_variance
from rag_experiments.analysis.variance import pilot_components
from rag_experiments.core.slots import SLOTS
from rag_experiments.evalset.subset import stratified_subset
from rag_experiments.evaluation.headline import factor_side
from rag_experiments.evaluation.intervals import not_plannable
from rag_experiments.evaluation.registry import GENERATION_METRICS
from rag_experiments.tracking.run_store import RunStore
from rag_experiments.tracking.runs import RunInputError

log = logging.getLogger(__name__)
MIN_SCORED = 10  # fewer scored queries than this: a per-query SD is not a basis for planning


def pilot_mde_line(
    store: RunStore, evalset_digest: str, metric: str, n: int, replicates: int, config_hash: str | None = None
) -> str | None:
    """One line for the sweep's start: the MDE of ``metric`` at this sweep's ``n`` and
    ``replicates``, from the latest FINISHED run of the same eval set in the store's experiment
    (the pilot). None when there is no such run or it cannot tell (metric missing, < 10 scored
    queries); "not plannable from this pilot: no variance" when its values do not vary. A pilot
    whose ``config_hash`` is not ``config_hash`` is named as another config."""

    pilot = store.latest_finished_of_evalset(evalset_digest)
    if pilot is None:
        return None
    try:
        df = store.per_query(pilot, long=True)
    except RunInputError:
        return None
    if metric not in df.columns:
        return None
    n_p, r_p, vq, vg = pilot_components(df, metric)
    if n_p < MIN_SCORED:
        return None
    same = config_hash is not None and pilot.tags.get("config_hash") == config_hash
    which = f"pilot {pilot.label}, {'this config' if same else 'another config'}, same eval set"
    if why := not_plannable(vq, vg):
        return f"[plan] {metric}: {why} ({which}: every scored query has the same value)"
    pv = paired_variance(vq, vg)
    value = mde(pv.between, n, pv.within, replicates)
    shown = f"{value:.4f}" if value >= 1e-4 else f"{value:.1e}"  # never "0.0000" for a tiny variance
    return (
        f"[plan] {metric}: minimum detectable paired effect {shown} at n={n}, R={replicates} "
        f"(alpha 0.05 two-sided, power 0.8; {which}; "
        f"python -m rag_experiments.plan --pilot {pilot.run_id} for the rest)"
    )


def inert_factors(job_overrides: list[list[str]], generates: list[bool]) -> list[str]:
    """Swept factors no computed metric depends on, from every job's overrides and whether it
    generates: without generation in any job, a generation factor (``evaluation.headline.factor_side``:
    ``retriever.k``, prompt, judge, generator keys) changes nothing logged (retrieval metrics are
    logged at every k), so its values make duplicate configs."""
    if any(generates) or not job_overrides:
        return []
    values: dict[str, set[str]] = {}
    for job in job_overrides:
        for o in job:
            key, _, value = str(o).lstrip("+~").partition("=")
            values.setdefault(key, set()).add(value)
    swept = [k for k, v in values.items() if len(v) > 1]
    answer_groups = {s.group for s in SLOTS if s.phase == "answer"}  # choosing the answer step is not inert
    return [k for k in swept if k not in answer_groups and factor_side(k, True) == "generation"]


def inert_warning(factors: list[str], n_jobs: int) -> str:
    return (
        f"warning: {', '.join(factors)} swept with generator=none: no computed metric depends on "
        f"{'it' if len(factors) == 1 else 'them'} (retrieval metrics are logged at every k; generation "
        f"is off), so the {n_jobs} jobs hold duplicate configs. Drop {' and '.join(factors)} from the "
        "sweep; select, report and gate count identical configs once."
    )


def print_pilot_mde(store: RunStore, job) -> None:
    """At the start (first job of a multirun): the MDE of the primary metric when a run of the same
    eval set exists in the experiment (:func:`pilot_mde_line`); nothing when none does. Reads the
    job's typed settings (``run.types.JobSettings``): ``racing_primary``, ``run.k``,
    ``run.generation_subset``, ``run.replicates``, ``job_num``."""
    s = job.setup
    if s.sweep and s.job_num != 0:
        return
    items = job.inputs.evalset.items
    metric = s.racing_primary or f"hit_at_{s.run.k}"
    gen = metric in GENERATION_METRICS or metric.startswith("rate_")
    n = (
        len(stratified_subset(items, s.run.generation_subset))
        if gen
        else len([it for it in items if it.gold_spans])
    )
    reps = s.run.replicates if gen else 1
    try:
        line = pilot_mde_line(store, job.inputs.evalset.digest, metric, n, reps, job.chash)
    except Exception as e:  # noqa: BLE001 - advice only: never stops a run
        log.debug("pilot MDE lookup failed: %s", e)
        line = None
    if line:
        print(line)
