"""The default baseline of a sweep: one rule, so ``compare --sweep`` and ``report`` agree on it.

A comparison against a baseline reads every effect as "level vs baseline": with another baseline
the sign of the same effect can flip. Both CLIs therefore take ``--baseline`` as an option and,
without it, call :func:`sweep_baseline`, which applies :func:`choose_baseline` (docs/metrics.md,
"The default baseline"):

1. the config closest to the **default config** (``conf/config.yaml`` with no overrides, read by
   ``run.defaults.default_levels`` and passed in: Hydra stays in ``run/``): the most
   swept factors at their default value; all of them → "the default config";
2. among equally close configs, the best mean on the primary metric
   (``evaluation.headline.primary_metric``: a metric every swept factor can move) in its own
   direction; a tie there goes to the first config in run order, and the reason says so.

Never "the best on a metric the sweep cannot change": the primary metric is chosen from the swept
factors' side first.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rag_experiments.analysis.attribution import _level  # the level the attribution's rows name
from rag_experiments.core.run_record import RunData
from rag_experiments.evaluation.headline import primary_metric
from rag_experiments.evaluation.registry import higher_is_better

__all__ = [
    "BaselineChoice",
    "choose_baseline",
    "context_k",
    "levels_label",
    "sweep_baseline",
]


@dataclass(frozen=True)
class BaselineChoice:
    """The chosen config (its index in the runs given), its label, why it was chosen, and the
    primary metric the choice was read on."""

    index: int
    label: str
    why: str
    primary: str

    def line(self) -> str:
        """``baseline: prompt=concise, retriever.k=5 (the default config)``: what the CLIs print."""
        return f"baseline: {self.label} ({self.why})"


def context_k(params: Sequence[Mapping[str, str]]) -> int:
    """The context k (``retriever.k``) most runs share; ties go to the larger k; 5 when unlogged."""
    ks = Counter(int(float(p.get("retriever.k", 5))) for p in params)
    return max(ks, key=lambda k: (ks[k], k))


def _label(levels: Mapping[str, str | None]) -> str:
    return ", ".join(f"{f}={v}" for f, v in levels.items())


def levels_label(run: RunData, factors: Sequence[str]) -> str:
    """``prompt=concise, retriever.k=5``: a run named by its levels, as the report labels configs."""
    return _label({f: _level(run, f) for f in factors}) or run.name


def choose_baseline(
    levels: Sequence[Mapping[str, str | None]],
    defaults: Mapping[str, str],
    scores: Sequence[float | None],
    primary: str,
) -> BaselineChoice:
    """The default baseline among configs described by their ``levels`` (factor → level, one
    mapping per config, same factors), given the default config's values (``defaults``) and each
    config's mean on ``primary`` (``scores``; None or NaN: not logged).

    distance(c) = #{factors f : levels[c][f] ≠ defaults[f]} (a factor without a default counts as
    different). Candidates: the configs at the smallest distance. The baseline is the candidate
    with the best score in ``primary``'s registered direction (higher, unless the registry says
    lower is better); equal scores keep run order. A config without a score ranks last.
    """
    if not levels:
        raise ValueError("choose_baseline needs at least one config")
    factors = list(levels[0])
    dist = [sum(lv.get(f) != defaults.get(f) for f in factors) for lv in levels]
    near = min(dist)
    cand = [i for i, d in enumerate(dist) if d == near]
    try:
        sign = -1.0 if higher_is_better(primary) is False else 1.0
    except KeyError:
        sign = 1.0

    def score(i: int) -> float:
        s = scores[i]
        return -math.inf if s is None or math.isnan(s) else sign * s

    best = max(cand, key=lambda i: (score(i), -i))  # equal scores: the first in run order
    label = _label(levels[best])
    if near == 0 and factors:
        return BaselineChoice(best, label, "the default config", primary)
    tied = sum(score(i) == score(best) for i in cand) - 1
    on = f"the best {primary}" + (f" (tied with {tied} other config(s): first in run order)" if tied else "")
    at_default = [f"{f}={defaults[f]}" for f in factors if levels[best].get(f) == defaults.get(f)]
    if near == len(factors):
        why = f"no config is at a default level; {on}"
    else:
        why = f"closest to the default config ({', '.join(at_default)}); {on} of the {len(cand)} such configs"
    return BaselineChoice(best, label, why, primary)


def sweep_baseline(
    runs: Sequence[RunData],
    factors: Sequence[str],
    primary: str | None = None,
    defaults: Mapping[str, str] | None = None,
) -> BaselineChoice:
    """:func:`choose_baseline` over a sweep's runs: levels as the attribution names them, the primary metric of the swept factors at the context k
    unless given, scores = the mean of the primary metric over each run's per-query table,
    defaults composed from ``conf/config.yaml`` unless given (tests pass their own)."""
    cols = [set(r.table.columns) for r in runs if r.table is not None]
    common = sorted(set.intersection(*cols)) if cols else []
    primary = primary or primary_metric(factors, common, k=context_k([r.params for r in runs]))
    levels = [{f: _level(r, f) for f in factors} for r in runs]
    defaults = {} if defaults is None else defaults
    scores = []
    for r in runs:
        s = r.series(primary).dropna()
        scores.append(float(s.mean()) if len(s) else None)
    return choose_baseline(levels, defaults, scores, primary)
