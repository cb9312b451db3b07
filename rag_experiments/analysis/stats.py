"""Paired statistics over per-query tables (see ``docs/metrics.md``, "Comparing runs").

Plain functions over pandas objects; no MLflow, no I/O. Per-query tables are DataFrames with an
``id`` column (the eval item id, the pairing key) and one float column per per-query metric, named
like the aggregate MLflow key. All seeded, so the same two runs always give the same verdict:

* pairing: only eval ids with a non-NaN value in both runs are paired; ``n_pairs`` is reported;
* the delta is always ``mean(B) - mean(A)`` (candidate minus baseline);
* CI of the mean delta: paired percentile bootstrap over queries, the project's one bootstrap
  (``evaluation.aggregate.mean_ci``);
* test: exact McNemar (``scipy.stats.binomtest`` on the discordant pairs) when both columns are
  binary (all non-NaN values in {0, 1}); otherwise a paired sign-flip permutation test of the mean
  difference (``scipy.stats.permutation_test``, ``permutation_type="samples"`` on the differences,
  exact when 2**n <= n_resamples).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from rag_experiments.evaluation.aggregate import mean_ci
from rag_experiments.evaluation.labels import FAILURE_LABELS
from rag_experiments.run_record import as_series

__all__ = [
    "PairedResult",
    "as_series",
    "flips",
    "holm",
    "is_binary",
    "mcnemar_exact",
    "pair",
    "paired_delta",
    "sign_flip_p",
    "transition_matrix",
]


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


def pair(a: pd.Series, b: pd.Series) -> tuple[np.ndarray, np.ndarray, pd.Index]:
    """Align two per-query series on their id index; keep ids non-NaN in both."""
    joined = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner").dropna()
    return joined["a"].to_numpy(float), joined["b"].to_numpy(float), joined.index


def is_binary(*arrays: np.ndarray) -> bool:
    vals = np.concatenate([np.asarray(x, float).ravel() for x in arrays])
    vals = vals[~np.isnan(vals)]
    return vals.size > 0 and bool(np.isin(vals, (0.0, 1.0)).all())


_BATCH = 1000  # permutations per vectorised batch: bounds memory at 1000 × n floats


def _mean_stat(x, axis=-1):
    return np.mean(x, axis=axis)


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
    xa, xb, _ = pair(as_series(a), as_series(b))
    n = int(xa.size)
    if n == 0:
        nan = float("nan")
        return PairedResult(metric, nan, nan, nan, nan, nan, nan, "none (no pairs)", 0, False)
    d = xb - xa
    binary = is_binary(xa, xb)
    _, lo, hi, _ = mean_ci(d, n_resamples=n_resamples, seed=seed, confidence=confidence)
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


# --------------------------------------------------------------------------- flips and label transitions


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
