"""Main effects and two-way interactions of a full-factorial sweep (docs/metrics.md, "Interactions").

Pure functions over :class:`~rag_experiments.analysis.attribution.RunData`; no MLflow. One-factor-
at-a-time comparisons (``attribution.factor_effects``) cannot say whether one factor's effect
depends on another; a full-factorial grid (every combination of the varied factors' levels has a
run) can. Per metric, the per-query table of every run is stacked into one long table (one row per
query × config) and fitted by least squares

    y_qc = α_q + Σ_f β_f[level_f(c)] + Σ_{f<g} γ_fg[level_f(c), level_g(c)] + ε_qc

with a **fixed effect α_q per query** (the query as its own baseline: every config sees the same
queries) and sum-to-zero (deviation) coding of the factors, so a main effect is averaged over the
other factors' levels. Standard errors are **cluster-robust by query** (statsmodels OLS,
``cov_type="cluster"``), which allows any correlation between one query's values across configs.
This is the fixed-effects equivalent of a mixed model with a random query intercept (statsmodels
MixedLM): with a balanced grid the effect estimates are identical, and the fixed-effects fit cannot
fail to converge or collapse to a zero variance on 0/1 metrics, which MixedLM does. Each term
(a factor, or a pair of factors) is tested jointly (Wald χ² over its coefficients); p-values are
Holm-adjusted over every term and metric tested. An interaction with p_holm < α gets a plain-language
line giving the first factor's best level and spread at each level of the second.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

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
        "Wald χ² per term, Holm across every term and metric"
    )


def _fit_terms(df: pd.DataFrame, n_factors: int) -> list[tuple[str, int, float, float]]:
    """(term, df, chi2, p) of every main and two-way term, from one fit."""
    import statsmodels.formula.api as smf

    fs = [f"C(f{i}, Sum)" for i in range(n_factors)]
    rhs = fs + [f"{a}:{b}" for a, b in itertools.combinations(fs, 2)]
    model = smf.ols("y ~ C(query) + " + " + ".join(rhs), data=df)
    groups = pd.factorize(df["query"])[0]
    res = model.fit(cov_type="cluster", cov_kwds={"groups": groups})
    names = res.model.exog_names
    out = []
    for term in rhs:
        cols = [i for i, n in enumerate(names) if _in_term(n, term)]
        if not cols:
            continue
        r = np.zeros((len(cols), len(names)))
        for j, c in enumerate(cols):
            r[j, c] = 1.0
        w = res.wald_test(r, scalar=True, use_f=False)
        out.append((term, len(cols), float(w.statistic), float(w.pvalue)))
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
        for term, dof, chi2, p in _fit_terms(df, len(factors)):
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
        describe(tables[r.metric], factors, r.formula_term, r.metric, r.p_holm, alpha)
        for r in terms.itertuples()
        if r.kind == "interaction"
    ]
    return InteractionResult(list(factors), terms.drop(columns="formula_term"), [x for x in lines if x])


def describe(df: pd.DataFrame, factors: Sequence[str], term: str, metric: str, p_holm: float, alpha: float) -> str:
    """The plain-language line of one interaction term: for a significant one, the first factor's
    best level and its spread (best − worst level mean) at each level of the second."""
    i, j = (int(p.split(",")[0][3:]) for p in term.split(":"))
    a, b = factors[i], factors[j]
    if not (p_holm < alpha):
        return f"{metric}: no evidence that the {a} effect depends on {b} (p_holm {_p(p_holm)})."
    means = df.groupby([f"f{j}", f"f{i}"])["y"].mean()
    parts = []
    for lb in sorted(means.index.get_level_values(0).unique(), key=_sort_key):
        row = means.loc[lb]
        parts.append(f"at {b}={lb} best {a} is {row.idxmax()} (+{row.max() - row.min():.3f} over {row.idxmin()})")
    return f"{metric}: the {a} effect depends on {b} (p_holm {_p(p_holm)}): " + "; ".join(parts) + "."


def _p(p: float) -> str:
    return "n/a" if p is None or math.isnan(p) else (f"{p:.2g}" if p >= 1e-4 else "<1e-4")


def _sort_key(v: str) -> tuple[int, float, str]:
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


INTERACTION_HEADERS = ["metric", "term", "kind", "df", "χ²", "p", "p_holm", "n (query × config)"]


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
