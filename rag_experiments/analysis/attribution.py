"""Which config change caused a metric change: config diffs, sweep factors, factor effects, noise floor.

Plain functions over pandas objects and :class:`RunData` (``run_record``, built from MLflow by
``tracking.runs.run_data``); no MLflow, no I/O. The paired statistics they use are in
``analysis.stats``; method notes in ``docs/metrics.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from rag_experiments.analysis.stats import PairedResult, holm, paired_delta
from rag_experiments.core.run_record import RunData, group_choice_keys, is_bookkeeping
from rag_experiments.evaluation.aggregate import mean_ci

# ---------------------------------------------------------------------------------------------
# Config diff and sweep factors
# ---------------------------------------------------------------------------------------------

def config_diff(
    params_a: Mapping[str, Any], params_b: Mapping[str, Any], collapse_groups: bool = True
) -> dict[str, tuple[Any, Any]]:
    """Params that differ, as ``{key: (value_a, value_b)}`` (None where a run lacks the key).

    Bookkeeping params (paths, tracking, cache dir, ``force``, ``experiment_name``, ``hydra.*``)
    are ignored. With ``collapse_groups`` a changed group choice (``chunking: fixed → sentence``)
    stands for everything under it: ``chunking._target_``, ``chunking.size`` … are folded into it,
    so the diff names the factor under test rather than its consequences.
    """
    keys = sorted(
        (set(params_a) | set(params_b)) - {k for k in set(params_a) | set(params_b) if is_bookkeeping(k)}
    )
    diff = {
        k: (params_a.get(k), params_b.get(k))
        for k in keys
        if _norm(params_a.get(k)) != _norm(params_b.get(k))
    }
    if collapse_groups:
        groups = group_choice_keys(params_a) | group_choice_keys(params_b)
        changed = {g for g in groups if g in diff}
        diff = {k: v for k, v in diff.items() if not any(k.startswith(g + ".") for g in changed)}
    return diff


def _norm(v: Any) -> Any:
    return None if v is None else str(v)


def _override_keys(tag: str | None) -> dict[str, str]:
    if not tag:
        return {}
    try:
        items = json.loads(tag)
    except (TypeError, ValueError):
        return {}
    out = {}
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, str) or "=" not in item:
            continue
        k, v = item.split("=", 1)
        out[k.lstrip("+~")] = v
    return out


def infer_factors(runs: Sequence[RunData]) -> list[str]:
    """The factors a sweep varied.

    From the ``overrides`` tags when every run has one (override keys whose value varies across
    the runs); otherwise from params: a group choice that varies, or a ``group.key`` param that
    varies among runs sharing the same choice of its group (so ``chunking.size`` changing only
    because ``chunking`` changed is not a separate factor).
    """
    if len(runs) < 2:
        return []
    ovs = [_override_keys(r.tags.get("overrides")) for r in runs]
    if all(ovs):
        keys = sorted(set().union(*ovs))
        levels = {k: {_level(r, k, o) for r, o in zip(runs, ovs, strict=True)} for k in keys}
        return [k for k in keys if len(levels[k]) > 1 and not is_bookkeeping(k)]
    all_keys = sorted(set().union(*(r.params for r in runs)))
    groups = set().union(*(group_choice_keys(r.params) for r in runs))
    factors = []
    for k in all_keys:
        if is_bookkeeping(k) or len({_norm(r.params.get(k)) for r in runs}) < 2:
            continue
        g = k.split(".", 1)[0] if "." in k else None
        if g in groups:
            by_choice: dict[Any, set] = {}
            for r in runs:
                by_choice.setdefault(_norm(r.params.get(g)), set()).add(_norm(r.params.get(k)))
            if not any(len(v) > 1 for v in by_choice.values()):
                continue
        factors.append(k)
    return factors


def _level(run: RunData, key: str, overrides: Mapping[str, str] | None = None) -> str | None:
    if key in run.params:
        return _norm(run.params[key])
    ov = overrides if overrides is not None else _override_keys(run.tags.get("overrides"))
    return ov.get(key)


@dataclass
class SweepAttribution:
    factors: dict[str, list[str]]
    baseline: RunData
    effects: pd.DataFrame  # one row per (factor, level, metric): OFAT paired delta vs baseline
    marginals: pd.DataFrame  # one row per (factor, level, metric): marginal mean over the grid
    noise_floor: pd.DataFrame  # one row per metric: A/A delta interval and how it was obtained
    skipped: list[str] = field(default_factory=list)
    holm_n: int = 0  # the Holm family's size: every OFAT and marginal comparison with a p-value


def _row(res: PairedResult) -> dict[str, Any]:
    d = res.as_dict()
    d.pop("metric")
    return d


def factor_effects(
    runs: Sequence[RunData],
    baseline: RunData,
    metrics: Sequence[str],
    seed: int = 0,
    n_resamples: int = 4999,
    n_splits: int = 2000,
) -> SweepAttribution:
    """Attribute metric changes in a sweep to its factors.

    * **One factor at a time**: for each factor and each level other than the baseline's, the run
      that equals the baseline on every other factor is compared with the baseline (paired delta,
      percentile bootstrap CI, McNemar / sign-flip p). Levels with no such run in the grid are
      listed in ``skipped``.
    * **Marginal mean** of a level: each query's value averaged over the runs at that level (all
      other factors wherever the grid puts them), then the mean over queries — equal to the mean
      of the run means when no values are missing. CI: percentile bootstrap **over queries** (the
      grid's runs are fixed, the eval set is the sample). Each non-baseline level is also tested
      against the baseline's level on these per-query marginals (sign-flip), when the sweep has
      more than one factor (with one, the marginal is the OFAT comparison itself).
    * p-values are Holm-adjusted across **all** comparisons made (OFAT and marginal, every metric).
    * **A/A noise floor** per metric: when two runs share a ``config_hash`` their paired delta CI
      (``method = "replicate runs"``); otherwise a split-half estimate on the baseline's queries
      (``method = "split-half"``: the 2.5–97.5 % range of mean(half 1) − mean(half 2) over
      ``n_splits`` seeded random halvings — unpaired noise of a half-size eval set, so wider than
      a paired re-run of a deterministic config, which would give exactly 0).
    """
    runs = list(runs)
    if baseline.run_id not in {r.run_id for r in runs}:
        runs.append(baseline)
    factors = infer_factors(runs)
    grid = _Grid(
        runs=runs,
        baseline=baseline,
        factors=factors,
        levels={f: sorted({_level(r, f) for r in runs} - {None}, key=_sort_key) for f in factors},
        base_levels={f: _level(baseline, f) for f in factors},
    )
    effects, skipped = _ofat_effects(grid, metrics, seed, n_resamples)
    eff = pd.DataFrame(effects)
    mar = pd.DataFrame(_marginal_rows(grid, metrics, seed, n_resamples))
    p_eff, p_mar = _holm_family(_p_values(eff), _p_values(mar))
    if len(eff):
        eff["p_holm"] = p_eff
    if len(mar):
        mar["p_holm"] = p_mar
    noise = noise_floor(runs, baseline, metrics, seed=seed, n_resamples=n_resamples, n_splits=n_splits)
    family = int(np.isfinite(np.concatenate([_p_values(eff), _p_values(mar)])).sum())
    return SweepAttribution(grid.levels, baseline, eff, mar, noise, skipped, family)


@dataclass
class _Grid:
    """A sweep's runs with their factors, each factor's levels and the baseline's level of each."""

    runs: list[RunData]
    baseline: RunData
    factors: list[str]
    levels: dict[str, list[str]]
    base_levels: dict[str, str | None]


def _ofat_effects(
    grid: _Grid, metrics: Sequence[str], seed: int, n_resamples: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows, skipped): per (factor, non-baseline level, metric) the paired delta of the run equal to
    the baseline on every other factor, ``other − baseline``; levels with no such run are skipped."""
    effects: list[dict[str, Any]] = []
    skipped: list[str] = []
    base_lv = grid.base_levels
    for f in grid.factors:
        for lv in grid.levels[f]:
            if lv == base_lv[f]:
                continue
            want = dict(base_lv, **{f: lv})
            match = [r for r in grid.runs if all(_level(r, g) == want[g] for g in grid.factors)]
            if not match:
                skipped.append(f"{f}={lv} (no run with the baseline's other factors)")
                continue
            other = match[0]
            for m in metrics:
                res = paired_delta(
                    grid.baseline.series(m), other.series(m), m, seed=seed, n_resamples=n_resamples
                )
                effects.append(
                    {"factor": f, "level": lv, "baseline_level": base_lv[f], "run_id": other.run_id}
                    | {"metric": m}
                    | _row(res)
                )
    return effects, skipped


def _marginal_rows(grid: _Grid, metrics: Sequence[str], seed: int, n_resamples: int) -> list[dict[str, Any]]:
    """Per (factor, level, metric): mean over queries of each query's value averaged over the level's
    runs, its bootstrap CI over queries and, with more than one factor, the paired delta and p
    against the baseline's level (NaN otherwise)."""
    marginals: list[dict[str, Any]] = []
    for f in grid.factors:
        base_lv = grid.base_levels[f]
        for m in metrics:
            per_level = {
                lv: _marginal_series([r for r in grid.runs if _level(r, f) == lv], m) for lv in grid.levels[f]
            }
            base_series = per_level.get(base_lv)
            for lv, s in per_level.items():
                vals = s.dropna().to_numpy()
                _, lo, hi, _ = mean_ci(vals, n_resamples=n_resamples, seed=seed)
                row = {
                    "factor": f,
                    "level": lv,
                    "is_baseline_level": lv == base_lv,
                    "n_runs": sum(_level(r, f) == lv for r in grid.runs),
                    "metric": m,
                    "mean": float(vals.mean()) if vals.size else float("nan"),
                    "ci_low": lo,
                    "ci_high": hi,
                    "n_queries": int(vals.size),
                    "delta_vs_baseline_level": float("nan"),
                    "p_value": float("nan"),
                }
                # With one factor a level's marginal *is* its OFAT run: testing it again would
                # only double the Holm family and make every p more conservative.
                if lv != base_lv and base_series is not None and len(grid.factors) > 1:
                    res = paired_delta(base_series, s, m, seed=seed, n_resamples=n_resamples)
                    row["delta_vs_baseline_level"], row["p_value"] = res.delta, res.p_value
                marginals.append(row)
    return marginals


def _p_values(table: pd.DataFrame) -> np.ndarray:
    return table["p_value"].to_numpy(float) if len(table) else np.empty(0)


def _holm_family(p_ofat: np.ndarray, p_marginal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Holm-adjusted p over one family, every OFAT and marginal comparison, split back in two."""
    adj = holm(np.concatenate([p_ofat, p_marginal]))
    return adj[: len(p_ofat)], adj[len(p_ofat) :]


def _sort_key(v: str) -> tuple[int, float, str]:
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def _marginal_series(runs: Sequence[RunData], metric: str) -> pd.Series:
    cols = [r.series(metric) for r in runs]
    cols = [c for c in cols if len(c)]
    if not cols:
        return pd.Series(dtype=float)
    return pd.concat(cols, axis=1).mean(axis=1, skipna=True)


def noise_floor(
    runs: Sequence[RunData],
    baseline: RunData,
    metrics: Sequence[str],
    seed: int = 0,
    n_resamples: int = 4999,
    n_splits: int = 2000,
) -> pd.DataFrame:
    """A/A noise floor per metric; see ``factor_effects`` for the two methods and their labels."""
    by_hash: dict[str, list[RunData]] = {}
    for r in runs:
        h = r.tags.get("config_hash")
        if h:
            by_hash.setdefault(h, []).append(r)
    reps = [g for g in by_hash.values() if len(g) >= 2]
    reps.sort(key=lambda g: baseline.run_id not in {r.run_id for r in g})
    rows = []
    for m in metrics:
        if reps:
            r1, r2 = reps[0][0], reps[0][1]
            res = paired_delta(r1.series(m), r2.series(m), m, seed=seed, n_resamples=n_resamples)
            rows.append(
                {
                    "metric": m,
                    "method": "replicate runs",
                    "detail": f"{r1.name or r1.run_id} vs {r2.name or r2.run_id} (same config_hash)",
                    "delta": res.delta,
                    "low": res.ci_low,
                    "high": res.ci_high,
                    "n": res.n_pairs,
                }
            )
        else:
            lo, hi, n = split_half_interval(
                baseline.series(m).dropna().to_numpy(), seed=seed, n_splits=n_splits
            )
            rows.append(
                {
                    "metric": m,
                    "method": "split-half",
                    "detail": (
                        f"no replicate runs in the sweep: 95 % range of mean(half 1) − mean(half 2) over "
                        f"{n_splits} random halvings of the baseline's queries (unpaired; wider than a re-run)"
                    ),
                    "delta": 0.0,
                    "low": lo,
                    "high": hi,
                    "n": n,
                }
            )
    return pd.DataFrame(rows)


def split_half_interval(x: np.ndarray, seed: int = 0, n_splits: int = 2000) -> tuple[float, float, int]:
    """2.5 / 97.5 percentiles of mean(half 1) − mean(half 2) over seeded random halvings of x."""
    x = np.asarray(x, float)
    n = x.size
    if n < 2:
        return float("nan"), float("nan"), int(n)
    rng = np.random.default_rng(seed)
    perm = np.argsort(rng.random((n_splits, n)), axis=1)
    h = n // 2
    vals = x[perm]
    d = vals[:, :h].mean(axis=1) - vals[:, h : 2 * h].mean(axis=1)
    lo, hi = np.percentile(d, [2.5, 97.5])
    return float(lo), float(hi), int(n)
