"""Paired statistics over per-query tables (see ``docs/metrics.md``, "Comparing runs").

Plain functions over pandas objects; no MLflow, no I/O. Per-query tables are DataFrames with an
``id`` column (the eval item id, the pairing key) and one float column per per-query metric, named
like the aggregate MLflow key. All seeded, so the same two runs always give the same verdict:

* pairing: only eval ids with a non-NaN value in both runs are paired; ``n_pairs`` is reported;
* the delta is always ``mean(B) - mean(A)`` (candidate minus baseline);
* CI of the mean delta: paired percentile bootstrap over queries, the project's one bootstrap
  (``evaluation.aggregate.mean_ci``);
* test: chosen by the metric's **declared** value type (:func:`value_kind`, the registry's
  ``value_type``), never by the values observed (:data:`KIND_TESTS`): exact McNemar
  (``scipy.stats.binomtest`` on the discordant pairs) for a binary metric; otherwise a paired
  sign-flip permutation test of the mean difference (``scipy.stats.permutation_test``,
  ``permutation_type="samples"`` on the differences, exact when 2**n <= n_resamples).
  Identical values on every paired item: p = 1, CI [0, 0], whatever the test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from rag_experiments.core.run_record import as_series
from rag_experiments.evaluation.labels import FAILURE_LABELS
from rag_experiments.evaluation.registry import spec as _spec

__all__ = [
    "KIND_TESTS",
    "PairedResult",
    "as_series",
    "first_stage_deltas",
    "flips",
    "holm",
    "is_binary",
    "mcnemar_exact",
    "pair",
    "paired_delta",
    "paired_deltas",
    "sign_flip_p",
    "table_key",
    "transition_matrix",
    "value_kind",
]

#: The one rule per declared value type (``evaluation.metric_spec.ValueType``): (the two-sided
#: paired test of compare/report/select's "worse", the non-inferiority test of gate/select's tie).
#: Binary: exact McNemar / Tango's score test. Proportion (in [0, 1], fractional values allowed):
#: sign-flip / the same score test, Tango's restricted ML generalised to fractional values
#: (``gate.restricted_z``; the percentile bootstrap passed 6 % at the margin there, docs/metrics.md
#: "Calibration"). Continuous and counts: sign-flip / the percentile bootstrap.
KIND_TESTS: dict[str, tuple[str, str]] = {
    "binary": ("mcnemar-exact", "score"),
    "proportion": ("sign-flip", "score"),
    "continuous": ("sign-flip", "bootstrap"),
    "count": ("sign-flip", "bootstrap"),
}


def value_kind(metric: str, kind: str | None = None, *columns: np.ndarray) -> str:
    """The declared value type that chooses a metric's tests (:data:`KIND_TESTS`): ``kind`` when
    given, else the registry's ``value_type`` of ``metric``, else ``"continuous"`` (a key the
    registry does not declare gets the tests valid for any values). A binary metric whose
    ``columns`` hold a value outside {0, 1} is a proportion: only averaging R > 1 replicates per
    query makes one, and its score test is the same (McNemar gives way to the sign-flip)."""
    if kind is None:
        try:
            kind = _spec(metric).value_type
        except KeyError:
            kind = "continuous"
    if kind not in KIND_TESTS:
        raise ValueError(f"unknown value type {kind!r}: one of {', '.join(KIND_TESTS)}")
    if kind == "binary" and columns and not is_binary(*columns):
        return "proportion"
    return kind


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
    kind: str | None = None,
) -> PairedResult:
    """Paired comparison of per-query values ``a`` (run A) and ``b`` (run B), indexed by eval id.

    delta = mean(b) - mean(a) over the ids non-NaN in both; CI = percentile paired bootstrap of the
    mean delta; p = the two-sided test of ``metric``'s declared value type (:func:`value_kind`;
    ``kind`` overrides it). (:func:`paired_deltas` for one metric.)
    """
    ta = pd.DataFrame({"m": as_series(a)})
    tb = pd.DataFrame({"m": as_series(b)})
    kinds = {"m": value_kind(metric, kind)}
    (res,) = paired_deltas(
        ta, tb, ["m"], seed=seed, n_resamples=n_resamples, confidence=confidence, kinds=kinds
    )
    res.metric = metric
    return res


def paired_deltas(
    ta: pd.DataFrame,
    tb: pd.DataFrame,
    metrics: Sequence[str],
    seed: int = 0,
    n_resamples: int = 9999,
    confidence: float = 0.95,
    kinds: dict[str, str] | None = None,
) -> list[PairedResult]:
    """:func:`paired_delta` for many metrics at once, vectorised (compare of two 20k-item runs).

    ``ta``/``tb``: per-query tables indexed by eval id (or with an ``id`` column). ``kinds``: a
    metric's value type when it is not the registry's (:func:`value_kind`). Metrics whose
    pairs are the same ids are resampled together. A metric whose deltas take few distinct values
    (hit@k, labels, MRR on short rankings: at most 512) is resampled through its value counts,
    exact in distribution and O(values) per resample: bootstrap means = Multinomial(n, c/n) · u / n,
    sign-flipped sums = sum_j u_j (2 Binomial(c_j, 1/2) - c_j). The others share one index draw
    (``mean_ci``'s draws for that n and seed, as counts: ``counts @ D / n``) and one sign draw.
    Sign-flip p, two-sided as ``scipy.stats.permutation_test``: ``min(1, 2 min(P(T* >= T),
    P(T* <= T)))``, each ``(hits + 1) / (n_resamples + 1)``; exact (every sign pattern, through
    scipy) when ``2**n <= n_resamples``.
    """
    ia = ta.set_index("id") if "id" in ta.columns else ta
    ib = tb.set_index("id") if "id" in tb.columns else tb
    kinds = kinds or {}
    groups: dict[tuple, list[tuple[str, np.ndarray, np.ndarray, str]]] = {}
    out: dict[str, PairedResult] = {}
    for m in metrics:
        xa, xb, ids = pair(as_series(ia[m]), as_series(ib[m]))
        if xa.size == 0:
            nan = float("nan")
            out[m] = PairedResult(m, nan, nan, nan, nan, nan, nan, "none (no pairs)", 0, False)
        else:
            key = (len(ids), pd.util.hash_pandas_object(ids, index=False).to_numpy().tobytes())
            groups.setdefault(key, []).append((m, xa, xb, value_kind(m, kinds.get(m), xa, xb)))
    for members in groups.values():
        out.update(_paired_group(members, seed, n_resamples, confidence))
    return [out[m] for m in metrics]


def first_stage_deltas(
    table: pd.DataFrame, metrics: Sequence[str], seed: int = 0, n_resamples: int = 9999
) -> list[PairedResult]:
    """What a run's reranker added: per metric with a ``first_stage/<metric>`` column, the final
    list's values (B) against the first stage's (A), paired by eval id within the run,
    delta = mean(final) − mean(first stage) (:func:`paired_deltas`), Holm over the metrics tested.
    Replicated rows repeat the retrieval columns, so each id counts once. [] without a reranker."""
    once = table.drop_duplicates("id") if "id" in table.columns else table
    ms = [m for m in metrics if m in once.columns and f"first_stage/{m}" in once.columns]
    if not ms:
        return []
    first = once[["id", *(f"first_stage/{m}" for m in ms)]].rename(
        columns=lambda c: c.removeprefix("first_stage/")
    )
    out = [
        r
        for r in paired_deltas(first, once[["id", *ms]], ms, seed=seed, n_resamples=n_resamples)
        if r.n_pairs
    ]
    for r, p in zip(out, holm([r.p_value for r in out]), strict=True):
        r.p_holm = float(p)
    return out


_FEW = 512  # at most this many distinct deltas: resample the value counts, not the items


def _paired_group(members, seed: int, n_resamples: int, confidence: float) -> dict[str, PairedResult]:
    xa = np.column_stack([a for _, a, _, _ in members])
    xb = np.column_stack([b for _, _, b, _ in members])
    d = xb - xa
    n = d.shape[0]
    binary = [k == "binary" for _, _, _, k in members]  # the declared type (value_kind), not the values
    rng = np.random.default_rng(seed)
    boot, flip = np.empty((max(n_resamples, 0), d.shape[1])), {}
    dense = []  # columns with many distinct deltas: one shared index / sign draw for all of them
    for j in range(d.shape[1]):
        u, c = np.unique(d[:, j], return_counts=True)
        if u.size > _FEW:
            dense.append(j)
            continue
        # the bootstrap mean of n draws from the values u with frequencies c/n (exact in distribution)
        boot[:, j] = rng.multinomial(n, c / n, size=n_resamples) @ u / n if n_resamples > 0 else []
        if not binary[j]:
            flip[j] = _sign_flip_p(d[:, j], u, c, rng, n_resamples)
    if dense:
        boot[:, dense] = _resampled_mean_matrix(d[:, dense], n_resamples, seed)
        flips_dense = [j for j in dense if not binary[j]]
        if flips_dense:
            flip.update(
                zip(flips_dense, _sign_flip_matrix(d[:, flips_dense], seed, n_resamples), strict=True)
            )
    alpha = (1.0 - confidence) / 2.0
    res = {}
    for j, (m, _, _, _) in enumerate(members):
        mean = float(d[:, j].mean())
        if n == 1 or n_resamples <= 0:
            lo = hi = mean
        else:
            lo, hi = np.quantile(boot[:, j], [alpha, 1.0 - alpha])
            lo, hi = float(min(lo, mean)), float(max(hi, mean))
        if not d[:, j].any():  # identical on every paired item: no effect, whatever the test
            lo = hi = 0.0
        if binary[j]:
            p, test = mcnemar_exact(xa[:, j], xb[:, j]), "mcnemar-exact"
        else:
            p, test = float(flip[j]), "sign-flip"
        res[m] = PairedResult(
            m, float(xa[:, j].mean()), float(xb[:, j].mean()), mean, lo, hi, p, test, n, binary[j]
        )
    return res


def _two_sided(stat: np.ndarray, obs: np.ndarray, n_resamples: int) -> np.ndarray:
    """``min(1, 2 min(P(T* >= T), P(T* <= T)))``, each ``(hits + 1) / (n_resamples + 1)``."""
    eps = 1e-12 * np.maximum(1.0, np.abs(obs))  # float ties count as ties
    ge = ((stat >= obs - eps).sum(axis=0) + 1) / (n_resamples + 1)
    le = ((stat <= obs + eps).sum(axis=0) + 1) / (n_resamples + 1)
    return np.minimum(1.0, 2 * np.minimum(ge, le))


def _sign_flip_p(d: np.ndarray, u: np.ndarray, c: np.ndarray, rng, n_resamples: int) -> float:
    """Sign-flip p of mean(d) == 0 from d's distinct values ``u`` (counts ``c``): the flipped sum
    of the c_j items equal to u_j is u_j (2 Binomial(c_j, 1/2) - c_j) (exact in distribution)."""
    n = d.size
    if np.all(d == 0):
        return 1.0
    if 2**n <= n_resamples:
        return sign_flip_p(d, 0, n_resamples)
    keep = u != 0
    u, c = u[keep], c[keep]
    stat = ((2 * rng.binomial(c, 0.5, size=(n_resamples, u.size)) - c) @ u) / n
    return float(_two_sided(stat, np.array(d.mean()), n_resamples))


def _resampled_mean_matrix(d: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """Bootstrap means of every column of ``d`` (n × m): the index draws of
    ``aggregate._resampled_means`` (same seed, same blocks), as counts times ``d``."""
    n = d.shape[0]
    rng = np.random.default_rng(seed)
    block = max(1, min(n_resamples, 4_000_000 // n))
    means = np.empty((max(n_resamples, 0), d.shape[1]))
    offsets = (np.arange(block) * n)[:, None]
    for lo in range(0, n_resamples, block):
        hi = min(lo + block, n_resamples)
        idx = rng.integers(0, n, size=(hi - lo, n))
        if d.shape[1] <= 4:  # a gather per column is cheaper than counting for a few columns
            for j in range(d.shape[1]):
                means[lo:hi, j] = d[idx, j].mean(axis=1)
            continue
        idx += offsets[: hi - lo]
        counts = np.bincount(idx.ravel(), minlength=(hi - lo) * n).reshape(hi - lo, n)
        means[lo:hi] = counts @ d / n
    return means


def _sign_flip_matrix(d: np.ndarray, seed: int, n_resamples: int) -> np.ndarray:
    """Two-sided sign-flip p-values of mean(d[:, j]) == 0 for every column, one shared sign draw."""
    n, m = d.shape
    if 2**n <= n_resamples:  # exact: scipy enumerates every sign pattern
        return np.array([sign_flip_p(d[:, j], seed, n_resamples) for j in range(m)])
    rng = np.random.default_rng(seed)
    block = max(1, min(n_resamples, 4_000_000 // n))
    stats_ = np.empty((n_resamples, m))
    for lo in range(0, n_resamples, block):
        hi = min(lo + block, n_resamples)
        stats_[lo:hi] = (rng.integers(0, 2, size=(hi - lo, n), dtype=np.int8) * 2 - 1) @ d / n
    p = _two_sided(stats_, d.mean(axis=0), n_resamples)
    p[np.all(d == 0, axis=0)] = 1.0
    return p


def holm(pvalues: Sequence[float] | np.ndarray, keys: Sequence[Any] | None = None) -> np.ndarray:
    """Holm step-down adjusted p-values, in the input order.

    Sorted ascending p_(1) <= ... <= p_(m): adj_(i) = max_{j<=i} min(1, (m - j + 1) * p_(j)).
    NaN p-values are left NaN and do not count towards m. ``keys``: one per p-value; tests with
    the same key (duplicate configs: the same per-query values, :func:`table_key`) count once in
    m and get the first one's adjusted p.
    """
    p = np.asarray(pvalues, float)
    out = np.full(p.shape, np.nan)
    if keys is not None:
        first = {k: i for i, k in reversed(list(enumerate(keys)))}
        idx = np.array([first[k] for k in keys], int)
        reps = np.unique(idx)
        out[reps] = holm(p[reps])
        return out[idx]
    ok = np.flatnonzero(~np.isnan(p))
    m = ok.size
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    out[order] = np.maximum.accumulate(scaled)
    return out


def table_key(values: pd.Series) -> bytes:
    """What makes two configs one config on a metric: the same value on every eval id (NaN ids
    left out). Equal keys are counted once in a Holm family (:func:`holm`) and the tie set."""
    x = as_series(values).dropna().sort_index()
    return pd.util.hash_pandas_object(x, index=True).to_numpy().tobytes()


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
