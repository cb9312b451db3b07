"""Failure labels, paired statistics and factor effects (DESIGN §3, §6).

Everything here is a plain function over pandas objects: no MLflow, no I/O except reading the
threshold YAML. Per-query tables are DataFrames with an ``id`` column (the eval item id, the
pairing key) and one float column per per-query metric, named like the aggregate MLflow key.

Statistics (all seeded, so the same two runs always give the same verdict):

* pairing: only eval ids with a non-NaN value in both runs are paired; ``n_pairs`` is reported;
* the delta is always ``mean(B) - mean(A)`` (candidate minus baseline);
* CI of the mean delta: paired bootstrap (resampling queries), **percentile** method
  (``scipy.stats.bootstrap``; BCa is unstable on the many-ties 0/1 differences we have);
* test: exact McNemar (``scipy.stats.binomtest`` on the discordant pairs) when both columns are
  binary (all non-NaN values in {0, 1}); otherwise a paired sign-flip permutation test of the mean
  difference (``scipy.stats.permutation_test``, ``permutation_type="samples"`` on the differences,
  exact when 2**n <= n_resamples).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

# ---------------------------------------------------------------------------------------------
# Failure labels
# ---------------------------------------------------------------------------------------------

FAILURE_LABELS = (
    "ok",
    "retrieval_failure",
    "generation_failure",
    "correct_without_evidence",
    "retrieved",
    "error",
)

# package data, found the way an installed wheel is found (importlib.resources), never via the cwd
_DEFAULT_THRESHOLDS_FILE = Path(
    str(resources.files("rag_experiments") / "conf" / "attribution" / "default.yaml")
)


@dataclass(frozen=True)
class Thresholds:
    correct: float = 0.5
    faithful: float = 0.5


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """Read ``conf/attribution/default.yaml`` (or ``path``); missing keys keep the defaults."""
    import yaml

    p = Path(path) if path is not None else _DEFAULT_THRESHOLDS_FILE
    if not p.exists():
        return Thresholds()
    data = yaml.safe_load(p.read_text()) or {}
    return _as_thresholds(data)


def _as_thresholds(t: Any) -> Thresholds:
    if t is None:
        return Thresholds()
    if isinstance(t, Thresholds):
        return t
    if isinstance(t, Mapping):
        return Thresholds(float(t.get("correct", 0.5)), float(t.get("faithful", 0.5)))
    return Thresholds(float(t.correct), float(t.faithful))


def _is_nan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def failure_label(
    answerable: bool,
    hit: bool,
    correctness: float | None,
    faithfulness: float | None,
    generated: bool,
    error: str | None,
    thresholds: Thresholds | Mapping[str, float] | None = None,
) -> str:
    """Label one query by where the pipeline failed it. The first matching row wins:

    ============================================================  ==========================
    case                                                          label
    ============================================================  ==========================
    ``error`` set (non-empty)                                     ``error``
    not generated (retrieval-only run), answerable and not hit    ``retrieval_failure``
    not generated, otherwise                                      ``retrieved``
    unanswerable item, correctness >= correct (it declined)       ``ok``
    unanswerable item, otherwise                                  ``generation_failure``
    answerable, hit, correct and (faithful or faithfulness NaN)   ``ok``
    answerable, hit, not correct or not faithful                  ``generation_failure``
    answerable, not hit, correct                                  ``correct_without_evidence``
    answerable, not hit, not correct                              ``retrieval_failure``
    ============================================================  ==========================

    ``hit`` means a relevant chunk was in the context given to the generator (hit@retriever.k).
    correct = ``correctness >= thresholds.correct``; faithful = ``faithfulness >=
    thresholds.faithful``. A NaN correctness counts as not correct (nothing silently passes); a
    NaN faithfulness (no scorable claims) does not count against the answer.
    """
    th = _as_thresholds(thresholds)
    if error:
        return "error"
    if not generated:
        return "retrieval_failure" if answerable and not hit else "retrieved"
    correct = not _is_nan(correctness) and float(correctness) >= th.correct
    if not answerable:
        return "ok" if correct else "generation_failure"
    faithful = _is_nan(faithfulness) or float(faithfulness) >= th.faithful
    if hit:
        return "ok" if correct and faithful else "generation_failure"
    return "correct_without_evidence" if correct else "retrieval_failure"


# ---------------------------------------------------------------------------------------------
# Paired statistics
# ---------------------------------------------------------------------------------------------


@dataclass
class PairedResult:
    metric: str
    mean_a: float
    mean_b: float
    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    test: str
    n_pairs: int
    binary: bool
    p_holm: float | None = None

    def significant(self, alpha: float = 0.05) -> bool:
        p = self.p_holm if self.p_holm is not None else self.p_value
        return bool(p < alpha)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _table_series(x: pd.Series | pd.DataFrame, metric: str | None = None) -> pd.Series:
    if isinstance(x, pd.DataFrame):
        s = x.set_index("id")[metric] if "id" in x.columns else x[metric]
    else:
        s = x
    s = pd.to_numeric(s, errors="coerce").astype(float)
    s.index = s.index.astype(str)
    return s


def pair(a: pd.Series, b: pd.Series) -> tuple[np.ndarray, np.ndarray, pd.Index]:
    """Align two per-query series on their id index; keep ids non-NaN in both."""
    joined = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").dropna()
    return joined["a"].to_numpy(float), joined["b"].to_numpy(float), joined.index


def is_binary(*arrays: np.ndarray) -> bool:
    vals = np.concatenate([np.asarray(x, float).ravel() for x in arrays])
    vals = vals[~np.isnan(vals)]
    return vals.size > 0 and bool(np.isin(vals, (0.0, 1.0)).all())


_BATCH = 1000  # resamples per vectorised batch: bounds memory at 1000 × n floats


def _mean_stat(x, axis=-1):
    return np.mean(x, axis=axis)


def bootstrap_mean_ci(
    x: np.ndarray,
    confidence: float = 0.95,
    seed: int = 0,
    n_resamples: int = 9999,
    alternative: str = "two-sided",
) -> tuple[float, float]:
    """Percentile bootstrap CI of mean(x), seeded. Degenerate samples give a zero-width CI."""
    x = np.asarray(x, float)
    if x.size == 0:
        return float("nan"), float("nan")
    if x.size == 1 or np.all(x == x[0]):
        v = float(x[0])
        return (v if alternative != "less" else -np.inf, v if alternative != "greater" else np.inf)
    res = stats.bootstrap(
        (x,),
        _mean_stat,
        n_resamples=n_resamples,
        batch=_BATCH,
        vectorized=True,
        confidence_level=confidence,
        alternative=alternative,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def mcnemar_exact(a: np.ndarray, b: np.ndarray) -> float:
    """Exact McNemar p-value: two-sided binomial test of the discordant pairs against 1/2."""
    n10 = int(np.sum((a == 1) & (b == 0)))
    n01 = int(np.sum((a == 0) & (b == 1)))
    if n10 + n01 == 0:
        return 1.0
    return float(stats.binomtest(n01, n10 + n01, 0.5).pvalue)


def sign_flip_p(d: np.ndarray, seed: int = 0, n_resamples: int = 9999) -> float:
    """Two-sided paired sign-flip permutation p-value of mean(d) == 0."""
    d = np.asarray(d, float)
    if d.size == 0:
        return float("nan")
    if np.all(d == 0):
        return 1.0
    res = stats.permutation_test(
        (d,),
        _mean_stat,
        permutation_type="samples",
        vectorized=True,
        n_resamples=n_resamples,
        batch=_BATCH,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    )
    return float(min(1.0, res.pvalue))


def paired_delta(
    a: pd.Series,
    b: pd.Series,
    metric: str = "",
    seed: int = 0,
    n_resamples: int = 9999,
    confidence: float = 0.95,
) -> PairedResult:
    """Paired comparison of per-query values ``a`` (run A) and ``b`` (run B), indexed by eval id.

    delta = mean(b) - mean(a) over the ids non-NaN in both; CI = percentile paired bootstrap of the
    mean delta; p = exact McNemar when both are binary, else a sign-flip permutation test.
    """
    xa, xb, _ = pair(_table_series(a), _table_series(b))
    n = int(xa.size)
    if n == 0:
        nan = float("nan")
        return PairedResult(metric, nan, nan, nan, nan, nan, nan, "none (no pairs)", 0, False)
    d = xb - xa
    binary = is_binary(xa, xb)
    lo, hi = bootstrap_mean_ci(d, confidence=confidence, seed=seed, n_resamples=n_resamples)
    if binary:
        p, test = mcnemar_exact(xa, xb), "mcnemar-exact"
    else:
        p, test = sign_flip_p(d, seed=seed, n_resamples=n_resamples), "sign-flip"
    return PairedResult(
        metric=metric,
        mean_a=float(xa.mean()),
        mean_b=float(xb.mean()),
        delta=float(d.mean()),
        ci_low=lo,
        ci_high=hi,
        p_value=p,
        test=test,
        n_pairs=n,
        binary=binary,
    )


def holm(pvalues: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm step-down adjusted p-values, in the input order.

    Sorted ascending p_(1) <= ... <= p_(m): adj_(i) = max_{j<=i} min(1, (m - j + 1) * p_(j)).
    NaN p-values are left NaN and do not count towards m.
    """
    p = np.asarray(pvalues, float)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = ok.size
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return out


# ---------------------------------------------------------------------------------------------
# Flips and label transitions
# ---------------------------------------------------------------------------------------------


def _indexed(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    out["id"] = out["id"].astype(str)
    return out.set_index("id")


def flips(
    df_a: pd.DataFrame,
    df_b: pd.DataFrame,
    metric: str = "failure_label",
    metric_b: str | None = None,
    threshold: float = 0.5,
) -> pd.DataFrame:
    """Queries whose outcome changed from run A to run B.

    For ``failure_label``: every id whose label differs (``change`` = ``"ok→generation_failure"``).
    For a numeric metric the value is binarised (``>= threshold``; exact for 0/1 metrics such as
    hit@k) and ``change`` is ``"hit→miss"`` or ``"miss→hit"``. ``metric_b`` names run B's column
    when it differs (e.g. each run's own context hit@k). Columns: id, query, tags, a, b, change.
    """
    metric_b = metric_b or metric
    a, b = _indexed(df_a), _indexed(df_b)
    cols = ["id", "query", "tags", "a", "b", "change"]
    if metric not in a.columns or metric_b not in b.columns:
        return pd.DataFrame(columns=cols)
    ids = a.index.intersection(b.index, sort=False)
    va, vb = a.loc[ids, metric], b.loc[ids, metric_b]
    if metric == "failure_label":
        mask = va.notna() & vb.notna() & (va.astype(str) != vb.astype(str))
        change = va.astype(str) + "→" + vb.astype(str)
    else:
        va, vb = pd.to_numeric(va, errors="coerce"), pd.to_numeric(vb, errors="coerce")
        ha, hb = va >= threshold, vb >= threshold
        mask = va.notna() & vb.notna() & (ha != hb)
        change = pd.Series(np.where(ha, "hit→miss", "miss→hit"), index=ids)
    sel = ids[mask.to_numpy()]
    query = a.loc[sel, "query"] if "query" in a.columns else pd.Series("", index=sel)
    tags = a.loc[sel, "tags"] if "tags" in a.columns else pd.Series([[]] * len(sel), index=sel)
    out = pd.DataFrame(
        {
            "id": sel,
            "query": query.to_numpy(),
            "tags": [list(t) if t is not None and not isinstance(t, str) else t for t in tags],
            "a": va.loc[sel].to_numpy(),
            "b": vb.loc[sel].to_numpy(),
            "change": change.loc[sel].to_numpy(),
        },
        columns=cols,
    )
    return out.sort_values(["change", "id"], kind="stable").reset_index(drop=True)


def transition_matrix(df_a: pd.DataFrame, df_b: pd.DataFrame) -> pd.DataFrame:
    """Counts of failure_label in A (rows) × failure_label in B (columns), paired by id."""
    a, b = _indexed(df_a), _indexed(df_b)
    if "failure_label" not in a.columns or "failure_label" not in b.columns:
        return pd.DataFrame()
    ids = a.index.intersection(b.index, sort=False)
    la = a.loc[ids, "failure_label"].fillna("missing").astype(str)
    lb = b.loc[ids, "failure_label"].fillna("missing").astype(str)
    seen = set(la) | set(lb)
    labels = [x for x in FAILURE_LABELS if x in seen] + sorted(seen - set(FAILURE_LABELS))
    m = pd.crosstab(la.rename("A \\ B"), lb.rename("B"))
    return m.reindex(index=labels, columns=labels, fill_value=0).astype(int)


# ---------------------------------------------------------------------------------------------
# Config diff and sweep factors
# ---------------------------------------------------------------------------------------------

#: Params that never change results (paths, tracking, bookkeeping) and are ignored by diffs.
BOOKKEEPING_PREFIXES = ("hydra.", "tracking.", "paths.", "cache.")
BOOKKEEPING_KEYS = frozenset(
    {"cache_dir", "cache_enabled", "force", "progress", "experiment_name", "tracking", "hydra", "paths"}
)
#: Hydra config groups (DESIGN §8); a dot-free param with one of these names is a group choice.
KNOWN_GROUPS = (
    "corpus",
    "evalset",
    "chunking",
    "embedding",
    "retriever",
    "generator",
    "prompt",
    "judge",
    "metrics",
    "attribution",
)


def is_bookkeeping(key: str) -> bool:
    return key in BOOKKEEPING_KEYS or key.startswith(BOOKKEEPING_PREFIXES)


def group_choice_keys(params: Mapping[str, str]) -> set[str]:
    """Dot-free params that name a config group (known group, or has ``key.*`` siblings)."""
    keys = set(params)
    return {
        k
        for k in keys
        if "." not in k
        and not is_bookkeeping(k)
        and (k in KNOWN_GROUPS or any(o.startswith(k + ".") for o in keys))
    }


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


@dataclass
class RunData:
    """What attribution needs from one run; built from MLflow by ``runs.run_data``."""

    run_id: str
    name: str
    params: dict[str, str]
    tags: dict[str, str] = field(default_factory=dict)
    table: pd.DataFrame | None = None

    def series(self, metric: str) -> pd.Series:
        if self.table is None or metric not in self.table.columns:
            return pd.Series(dtype=float)
        return _table_series(self.table, metric)


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
    levels = {f: sorted({_level(r, f) for r in runs} - {None}, key=_sort_key) for f in factors}
    base_lv = {f: _level(baseline, f) for f in factors}
    effects: list[dict[str, Any]] = []
    skipped: list[str] = []
    for f in factors:
        for lv in levels[f]:
            if lv == base_lv[f]:
                continue
            want = dict(base_lv, **{f: lv})
            match = [r for r in runs if all(_level(r, g) == want[g] for g in factors)]
            if not match:
                skipped.append(f"{f}={lv} (no run with the baseline's other factors)")
                continue
            other = match[0]
            for m in metrics:
                res = paired_delta(baseline.series(m), other.series(m), m, seed=seed, n_resamples=n_resamples)
                effects.append(
                    {"factor": f, "level": lv, "baseline_level": base_lv[f], "run_id": other.run_id}
                    | {"metric": m}
                    | _row(res)
                )
    marginals: list[dict[str, Any]] = []
    for f in factors:
        for m in metrics:
            per_level = {lv: _marginal_series([r for r in runs if _level(r, f) == lv], m) for lv in levels[f]}
            base_series = per_level.get(base_lv[f])
            for lv, s in per_level.items():
                vals = s.dropna().to_numpy()
                lo, hi = bootstrap_mean_ci(vals, seed=seed, n_resamples=n_resamples)
                row = {
                    "factor": f,
                    "level": lv,
                    "is_baseline_level": lv == base_lv[f],
                    "n_runs": sum(_level(r, f) == lv for r in runs),
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
                if lv != base_lv[f] and base_series is not None and len(factors) > 1:
                    res = paired_delta(base_series, s, m, seed=seed, n_resamples=n_resamples)
                    row["delta_vs_baseline_level"], row["p_value"] = res.delta, res.p_value
                marginals.append(row)
    eff = pd.DataFrame(effects)
    mar = pd.DataFrame(marginals)
    p_all = np.concatenate(
        [
            eff["p_value"].to_numpy(float) if len(eff) else np.empty(0),
            mar["p_value"].to_numpy(float) if len(mar) else np.empty(0),
        ]
    )
    adj = holm(p_all)
    if len(eff):
        eff["p_holm"] = adj[: len(eff)]
    if len(mar):
        mar["p_holm"] = adj[len(eff) :]
    noise = noise_floor(runs, baseline, metrics, seed=seed, n_resamples=n_resamples, n_splits=n_splits)
    return SweepAttribution(levels, baseline, eff, mar, noise, skipped)


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


# ---------------------------------------------------------------------------------------------
# Gate: non-inferiority
# ---------------------------------------------------------------------------------------------


def default_margin(n: int) -> float:
    """Default non-inferiority margin: ``max(0.01, 1 / sqrt(n))`` for n paired queries.

    1/√n is (≈) the 95 % CI half-width of a proportion near 0.5 measured on n queries (1.96·0.5/√n):
    the resolution of the eval set itself. A drop smaller than that is not a claim the eval set can
    support, a larger one is. It shrinks with n — 0.10 at 100 queries, 0.05 at 400, 0.014 at 5,000
    — with a floor of one point. It is data-independent on purpose: a margin derived from the
    observed paired SD would grow with the candidate's own churn.
    """
    if n <= 0:
        return float("nan")
    return max(0.01, 1.0 / math.sqrt(n))


@dataclass
class GateResult:
    metric: str
    baseline: float
    candidate: float
    delta: float
    lower: float  # one-sided (1 - alpha) lower confidence bound of mean(candidate - baseline)
    margin: float
    mde: float
    n_pairs: int
    alpha: float
    passed: bool

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"


def non_inferiority(
    a: pd.Series,
    b: pd.Series,
    margin: float | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    n_resamples: int = 9999,
    metric: str = "",
) -> GateResult:
    """Is candidate ``b`` no worse than baseline ``a`` by more than ``margin``?

    lower = the one-sided (1 − alpha) lower bound of mean(b − a) from a seeded percentile paired
    bootstrap; PASS iff lower >= −margin. ``margin=None`` uses ``default_margin(n_pairs)``.
    """
    xa, xb, _ = pair(_table_series(a), _table_series(b))
    n = int(xa.size)
    m = default_margin(n) if margin is None else float(margin)
    if n == 0:
        nan = float("nan")
        return GateResult(metric, nan, nan, nan, nan, m, nan, 0, alpha, False)
    d = xb - xa
    lower, _ = bootstrap_mean_ci(
        d, confidence=1 - alpha, seed=seed, n_resamples=n_resamples, alternative="greater"
    )
    return GateResult(
        metric=metric,
        baseline=float(xa.mean()),
        candidate=float(xb.mean()),
        delta=float(d.mean()),
        lower=lower,
        margin=m,
        mde=min_detectable_effect(xa, xb, alpha=alpha),
        n_pairs=n,
        alpha=alpha,
        passed=bool(lower >= -m - 1e-12),
    )


def min_detectable_effect(
    a: pd.Series | np.ndarray, b: pd.Series | np.ndarray, alpha: float = 0.05, power: float = 0.8
) -> float:
    """Smallest true mean shift the one-sided test detects with ``power``: normal approximation
    ``(z_{1−α} + z_{power}) · sd(b − a) / √n`` from the observed paired SD."""
    if isinstance(a, pd.Series) and isinstance(b, pd.Series):
        xa, xb, _ = pair(_table_series(a), _table_series(b))
    else:
        xa, xb = np.asarray(a, float), np.asarray(b, float)
        keep = ~(np.isnan(xa) | np.isnan(xb))
        xa, xb = xa[keep], xb[keep]
    n = xa.size
    if n < 2:
        return float("nan")
    sd = float(np.std(xb - xa, ddof=1))
    return float((stats.norm.ppf(1 - alpha) + stats.norm.ppf(power)) * sd / math.sqrt(n))


#: Per-query columns named like the stable MLflow metric keys (DESIGN §3); other numeric
#: columns (latencies, counts) are compared only when asked for by name.
METRIC_KEY_PATTERN = re.compile(
    r"(hit|evidence_recall|context_precision|ndcg)_at_\d+|mrr|faithfulness|answer_relevance|correctness|rate_\w+"
)


def metric_columns(*tables: pd.DataFrame, known_only: bool = True) -> list[str]:
    """Numeric per-query metric columns common to all tables, in a stable, readable order."""
    skip = {"id", "query", "tags", "failure_label", "error"}
    common: Iterable[str] = [
        c for c in tables[0].columns if c not in skip and all(c in t.columns for t in tables[1:])
    ]
    num = [c for c in common if all(pd.api.types.is_numeric_dtype(t[c]) for t in tables)]
    if known_only:
        num = [c for c in num if METRIC_KEY_PATTERN.fullmatch(c)]
    order = ("hit_at_", "evidence_recall_at_", "context_precision_at_", "ndcg_at_", "mrr")

    def key(c: str) -> tuple[int, int, str]:
        for i, p in enumerate(order):
            if c.startswith(p):
                tail = c[len(p) :]
                return (i, int(tail) if tail.isdigit() else 0, c)
        return (len(order) + c.startswith("rate_"), 0, c)

    return sorted(num, key=key)
