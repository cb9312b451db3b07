"""Main effects and two-way interactions of a full-factorial sweep (docs/metrics.md, "Interactions").

Pure functions over :class:`~rag_experiments.analysis.attribution.RunData`; no MLflow. One-factor-
at-a-time comparisons (``attribution.factor_effects``) cannot say whether one factor's effect
depends on another; a full-factorial grid (every combination of the varied factors' levels has a
run) can. Per metric, the per-query table of every run is stacked into one long table (one row per
query × config) and fitted by least squares

    y_qc = α_q + Σ_f β_f[level_f(c)] + Σ_{f<g} γ_fg[level_f(c), level_g(c)] + ε_qc

with a **fixed effect α_q per query** (the query as its own baseline: every config sees the same
queries) and sum-to-zero (deviation) coding of the factors, so a main effect is averaged over the
other factors' levels. The query effects are absorbed (each query's mean subtracted from its rows:
the same coefficients as query dummies, Frisch–Waugh–Lovell), and standard errors are
**cluster-robust by query**, which allows any correlation between one query's values across
configs: V = c·B·M·B with B = (X̃ᵀX̃)⁺, M = Σ_q (X̃_qᵀe_q)(X̃_qᵀe_q)ᵀ and c = G/(G−1)·(N−1)/(N−p),
G queries with ≥ 2 values, N their rows, p the factor columns (the query effects are nested in the
clusters, so they do not count in p; counting them, as statsmodels' OLS with dummies does, halved the
false-positive rate: 0.02 at α = 0.05, docs/metrics.md). This is the fixed-effects equivalent of a
mixed model with a random query intercept: with a balanced grid the effect estimates are identical,
and the fit cannot fail to converge or collapse to a zero variance on 0/1 metrics, which MixedLM does.

Each term (a factor, or a pair of factors) is tested jointly by a Wald statistic W = bᵀV_t⁺b over
its coefficients b, **on the directions its covariance V_t actually has** (eigenvalues above a
tolerance; df r = their number), referred to F(r, G − 1) (W/r; the small-cluster reference of
Cameron & Miller 2015). Degenerate data never produce an effect: when the metric does not vary
within any query (identical configs, a constant metric) or V_t has no direction left, W = 0 and
p = 1; only an estimate off every direction of V_t (the same non-zero shift on every query, no noise
at all, every query agreeing) is an exact effect, W = ∞ with p = 2·2^−G, the smallest p a
sign-flip test of G queries can give. p-values are Holm-adjusted over every term and metric tested.
An interaction with p_holm < α gets a plain-language line giving the first factor's best level and
spread at each level of the second.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from rag_experiments.analysis.attribution import RunData, _level
from rag_experiments.analysis.stats import holm

__all__ = ["InteractionResult", "interaction_effects", "is_full_factorial", "long_table"]


def is_full_factorial(runs: Sequence[RunData], factors: Sequence[str]) -> bool:
    """True when at least two factors vary, each with ≥ 2 levels, and every combination of their
    levels has a run (replicates allowed)."""
    if len(factors) < 2:
        return False
    levels = [sorted({_level(r, f) for r in runs} - {None}) for f in factors]
    if any(len(lv) < 2 for lv in levels):
        return False
    seen = {tuple(_level(r, f) for f in factors) for r in runs}
    return all(combo in seen for combo in itertools.product(*levels))


def long_table(runs: Sequence[RunData], factors: Sequence[str], metric: str) -> pd.DataFrame:
    """One row per (query, run) with a value of ``metric``: columns query, run, f0 … f{n−1}, y."""
    parts = []
    for r in runs:
        s = r.series(metric).dropna()
        if s.empty:
            continue
        part = pd.DataFrame({"query": s.index.astype(str), "run": r.run_id, "y": s.to_numpy(float)})
        for i, f in enumerate(factors):
            part[f"f{i}"] = str(_level(r, f))
        parts.append(part)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


@dataclass
class InteractionResult:
    """``terms``: one row per (metric, term) — metric, term, kind (main / interaction), df,
    chi2, p_value, p_holm, n_obs, n_queries. ``lines``: plain-language sentences."""

    factors: list[str]
    terms: pd.DataFrame
    lines: list[str] = field(default_factory=list)
    method: str = (
        "OLS with a fixed effect per query and sum-to-zero factor coding, cluster-robust (by query) "
        "Wald statistic per term on the directions its covariance has, F(df, queries − 1), "
        "Holm across every term and metric; no variation within any query: p = 1"
    )


def _sum_coded(codes: np.ndarray, n_levels: int) -> np.ndarray:
    """Deviation (sum-to-zero) coding, patsy's ``Sum``: a column per level but the last, 1 at that
    level, −1 at the last level, 0 elsewhere."""
    x = (codes[:, None] == np.arange(n_levels - 1)[None, :]).astype(float)
    x[codes == n_levels - 1] = -1.0
    return x


def _design(df: pd.DataFrame, n_factors: int) -> tuple[np.ndarray, list[tuple[str, list[int]]]]:
    """The factor columns (main effects, then every pair's products) and each term's columns,
    named like the statsmodels formula terms (``C(f0, Sum)``, ``C(f0, Sum):C(f1, Sum)``)."""
    blocks = []
    for i in range(n_factors):
        levels = sorted(df[f"f{i}"].unique())
        codes = pd.Categorical(df[f"f{i}"], categories=levels).codes
        blocks.append((f"C(f{i}, Sum)", _sum_coded(np.asarray(codes), len(levels))))
    for (na, xa), (nb, xb) in itertools.combinations(list(blocks), 2):
        blocks.append((f"{na}:{nb}", (xa[:, :, None] * xb[:, None, :]).reshape(len(df), -1)))
    terms, start = [], 0
    for name, x in blocks:
        terms.append((name, list(range(start, start + x.shape[1]))))
        start += x.shape[1]
    return np.column_stack([x for _, x in blocks]), terms


def _within(x: np.ndarray, g: np.ndarray, n_groups: int) -> np.ndarray:
    """Each row minus its group's mean (the query fixed effect absorbed)."""
    sums = np.zeros((n_groups, x.shape[1]))
    np.add.at(sums, g, x)
    counts = np.bincount(g, minlength=n_groups)[:, None]
    return x - (sums / np.maximum(counts, 1))[g]


def wald_terms(df: pd.DataFrame, n_factors: int) -> list[tuple[str, int, float, float]]:
    """(term, df, W, p) of every main and two-way term from one fixed-effects fit with
    cluster-robust covariance (module docstring); df = the rank actually tested (0: nothing to
    test, W = 0, p = 1)."""
    g_all = pd.factorize(df["query"])[0]
    keep = np.bincount(g_all)[g_all] >= 2  # a query seen once has no within-query information
    d = df[keep]
    x, terms = _design(d, n_factors)
    g, _ = pd.factorize(d["query"])
    n_groups = int(g.max()) + 1 if len(g) else 0
    y = d["y"].to_numpy(float)[:, None]
    xt, yt = _within(x, g, n_groups), _within(y, g, n_groups)[:, 0]
    none = [(name, 0, 0.0, 1.0) for name, _ in terms]
    scale_y = float(np.max(np.abs(y))) if y.size else 0.0
    s = float(np.sqrt(np.mean(yt**2))) if yt.size else 0.0
    # no variation inside any query (identical configs, a constant metric): nothing to test
    if n_groups < 2 or s <= 1e-10 * max(scale_y, 1e-300):
        return none
    bread = np.linalg.pinv(xt.T @ xt)
    beta = bread @ (xt.T @ yt)
    e = yt - xt @ beta
    scores = np.zeros((n_groups, xt.shape[1]))
    np.add.at(scores, g, xt * e[:, None])
    n, p = xt.shape
    c = n_groups / (n_groups - 1) * (n - 1) / max(n - p, 1)
    cov = c * bread @ (scores.T @ scores) @ bread
    out = []
    for name, cols in terms:
        b, v = beta[cols], cov[np.ix_(cols, cols)]
        lam, q = np.linalg.eigh((v + v.T) / 2)
        z = q.T @ b
        # directions with (numerically) no variance: V is ~s²/G, anything 1e-14 below that is zero
        ok = lam > max(1e-9 * max(lam.max(), 0.0), (1e-7 * s) ** 2 / n_groups)
        if np.any(np.abs(z[~ok]) > 1e-6 * s):
            # an estimate where the data show no noise at all: every query agrees. The strongest
            # evidence G exchangeable queries can give is the sign-flip bound 2·2^−G, not p = 0.
            out.append((name, int(ok.sum()) or len(cols), math.inf, min(1.0, 2.0 ** (1 - n_groups))))
            continue
        r = int(ok.sum())
        if r == 0:
            out.append((name, 0, 0.0, 1.0))
            continue
        w = float(np.sum(z[ok] ** 2 / lam[ok]))
        out.append((name, r, w, float(stats.f.sf(w / r, r, n_groups - 1))))
    return out


def _in_term(name: str, term: str) -> bool:
    """Whether design column ``name`` (e.g. ``C(f0, Sum)[S.a]:C(f1, Sum)[S.3]``) belongs to ``term``."""
    parts = [p.split("[")[0] for p in name.split(":")]
    return parts == term.split(":")


def _term_label(term: str, factors: Sequence[str]) -> tuple[str, str]:
    idx = [int(p.split(",")[0][3:]) for p in term.split(":")]
    return " × ".join(factors[i] for i in idx), ("main" if len(idx) == 1 else "interaction")


def interaction_effects(
    runs: Sequence[RunData], factors: Sequence[str], metrics: Sequence[str], alpha: float = 0.05
) -> InteractionResult:
    """Main effects and two-way interactions per metric (module docstring); ``factors`` must form
    a full factorial over ``runs`` (``is_full_factorial``)."""
    rows = []
    tables = {}
    for m in metrics:
        df = long_table(runs, factors, m)
        if df.empty or df["y"].nunique() < 2:
            continue
        tables[m] = df
        for term, dof, chi2, p in wald_terms(df, len(factors)):
            label, kind = _term_label(term, factors)
            rows.append(
                {"metric": m, "term": label, "kind": kind, "df": dof, "chi2": chi2, "p_value": p,
                 "n_obs": len(df), "n_queries": df["query"].nunique(), "formula_term": term}
            )
    terms = pd.DataFrame(rows)
    if terms.empty:
        return InteractionResult(list(factors), terms)
    terms["p_holm"] = holm(terms["p_value"].to_numpy(float))
    lines = [
        describe(tables[r.metric], factors, r.formula_term, r.metric, r.p_holm, alpha, len(terms))
        for r in terms.itertuples()
        if r.kind == "interaction"
    ]
    return InteractionResult(list(factors), terms.drop(columns="formula_term"), [x for x in lines if x])


def describe(
    df: pd.DataFrame, factors: Sequence[str], term: str, metric: str, p_holm: float, alpha: float, family: int = 1
) -> str:
    """The plain-language line of one interaction term: for a significant one, the first factor's
    best level (on the metric's direction in the registry; higher when unregistered) and its
    spread, |best − worst| level mean, at each level of the second. A spread that rounds to 0 is
    written "no difference" (never "+0.000 over" a level, least of all the best one itself)."""
    i, j = (int(p.split(",")[0][3:]) for p in term.split(":"))
    a, b = factors[i], factors[j]
    if not (p_holm < alpha):
        return f"{metric}: no evidence that the {a} effect depends on {b} (p_holm {_p(p_holm)}, Holm over {family})."
    hib = _higher_is_better(metric)
    means = df.groupby([f"f{j}", f"f{i}"])["y"].mean()
    parts = []
    for lb in sorted(means.index.get_level_values(0).unique(), key=_sort_key):
        row = means.loc[lb]
        top, low = (row.idxmax(), row.idxmin()) if hib else (row.idxmin(), row.idxmax())
        spread = abs(row[top] - row[low])
        if round(spread, 3) == 0 or top == low:
            parts.append(f"at {b}={lb} no difference between {a} levels (all {row.mean():.3f})")
        else:
            parts.append(f"at {b}={lb} best {a} is {top} ({'+' if hib else '−'}{spread:.3f} over {low})")
    return f"{metric}: the {a} effect depends on {b} (p_holm {_p(p_holm)}, Holm over {family}): " + "; ".join(parts) + "."


def _higher_is_better(metric: str) -> bool:
    from rag_experiments.evaluation.registry import higher_is_better

    try:
        return higher_is_better(metric) is not False
    except KeyError:
        return True


def _p(p: float) -> str:
    return "n/a" if p is None or math.isnan(p) else (f"{p:.2g}" if p >= 1e-4 else "<1e-4")


def _sort_key(v: str) -> tuple[int, float, str]:
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


INTERACTION_HEADERS = ["metric", "term", "kind", "df", "Wald W", "p", "p_holm", "n (query × config)"]


def interaction_headers(res: InteractionResult) -> list[str]:
    """:data:`INTERACTION_HEADERS` with the Holm family's size (every term of every metric)."""
    return [f"p_holm (Holm over {len(res.terms)})" if h == "p_holm" else h for h in INTERACTION_HEADERS]


def interaction_rows(res: InteractionResult) -> list[list[str]]:
    """Table rows of :class:`InteractionResult` terms (``*`` marks p_holm < 0.05)."""
    return [
        [r.metric, r.term, r.kind, str(r.df), f"{r.chi2:.2f}", _p(r.p_value),
         _p(r.p_holm) + (" *" if r.p_holm < 0.05 else ""), str(r.n_obs)]
        for r in res.terms.itertuples()
    ]


def sweep_interactions(
    runs: Sequence[RunData], factors: Sequence[str], metrics: Sequence[str], max_metrics: int = 5
) -> InteractionResult | None:
    """``interaction_effects`` on the first ``max_metrics`` metrics when ``runs`` are a full
    factorial over ``factors``; None otherwise (OFAT only)."""
    if not is_full_factorial(runs, factors):
        return None
    return interaction_effects(runs, factors, list(metrics)[:max_metrics])
