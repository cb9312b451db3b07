"""Interactions of a full-factorial sweep (analysis/interactions.py) on synthetic per-query tables."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from rag_experiments.analysis.attribution import RunData
from rag_experiments.analysis.interactions import (
    describe,
    interaction_effects,
    interaction_rows,
    is_full_factorial,
    wald_terms,
)


def _grid(effect, n=200, seed=0):
    """A 2 (chunking) × 3 (k) grid of runs; per-query 0/1 values with mean ``effect(chunk, k)``
    and a shared query difficulty."""
    rng = np.random.default_rng(seed)
    u = rng.random(n)
    runs = []
    for chunk in ("fixed", "markdown"):
        for k in ("1", "3", "5"):
            common = rng.random(n) < 0.5
            draw = np.where(common, u, rng.random(n))
            y = (draw < effect(chunk, int(k))).astype(float)
            table = pd.DataFrame({"id": [f"q{i}" for i in range(n)], "correctness": y})
            runs.append(
                RunData(
                    run_id=f"{chunk}{k}",
                    name=f"chunking={chunk},retriever.k={k}",
                    params={"chunking": chunk, "retriever.k": k},
                    tags={"overrides": json.dumps([f"chunking={chunk}", f"retriever.k={k}"])},
                    table=table,
                )
            )
    return runs


def test_known_interaction_is_detected_with_a_plain_language_line():
    # markdown helps at k=1 (+0.25) and hurts at k=5 (−0.15): a crossing interaction
    eff = {("fixed", 1): 0.4, ("markdown", 1): 0.65, ("fixed", 3): 0.5, ("markdown", 3): 0.5,
           ("fixed", 5): 0.6, ("markdown", 5): 0.45}
    runs = _grid(lambda c, k: eff[(c, k)])
    factors = ["chunking", "retriever.k"]
    assert is_full_factorial(runs, factors)
    res = interaction_effects(runs, factors, ["correctness"])
    inter = res.terms[res.terms["kind"] == "interaction"].iloc[0]
    assert inter["term"] == "chunking × retriever.k" and inter["p_holm"] < 0.01
    line = res.lines[0]
    assert "the chunking effect depends on retriever.k" in line
    assert "at retriever.k=1 best chunking is markdown" in line and "at retriever.k=5 best chunking is fixed" in line


def test_additive_effects_show_main_effects_and_no_interaction():
    runs = _grid(lambda c, k: 0.3 + (0.15 if c == "markdown" else 0) + 0.04 * k, seed=1)
    res = interaction_effects(runs, ["chunking", "retriever.k"], ["correctness"])
    t = res.terms.set_index("term")
    assert t.loc["chunking", "p_holm"] < 0.01 and t.loc["retriever.k", "p_holm"] < 0.01
    assert t.loc["chunking × retriever.k", "p_holm"] > 0.05
    assert "no evidence that the chunking effect depends on retriever.k" in res.lines[0]


def test_incomplete_grid_is_not_factorial():
    runs = _grid(lambda c, k: 0.5)
    assert not is_full_factorial(runs[:-1], ["chunking", "retriever.k"])
    assert not is_full_factorial(runs, ["chunking"])


def _grid_of(values, n=30):
    """A 2 (prompt) × 2 (retriever.k) grid whose per-query values are ``values(prompt, k, q)``."""
    runs = []
    for prompt in ("cite", "concise"):
        for k in ("3", "5"):
            y = np.array([values(prompt, int(k), q) for q in range(n)], float)
            table = pd.DataFrame({"id": [f"q{i}" for i in range(n)], "hit_at_5": y})
            runs.append(
                RunData(
                    run_id=f"{prompt}{k}",
                    name=f"prompt={prompt},retriever.k={k}",
                    params={"prompt": prompt, "retriever.k": k},
                    tags={"overrides": json.dumps([f"prompt={prompt}", f"retriever.k={k}"])},
                    table=table,
                )
            )
    return runs


def test_identical_configs_have_no_effect_and_no_sentence():
    """The issue-27 prompt × k sweep: hit@5 identical in all four configs (varying over queries).
    statsmodels' Wald on the degenerate covariance gave χ² 18–40, p_holm < 1e-3, '*'."""
    rng = np.random.default_rng(0)
    hits = (rng.random(30) < 0.6).astype(float)
    res = interaction_effects(_grid_of(lambda p, k, q: hits[q]), ["prompt", "retriever.k"], ["hit_at_5"])
    assert len(res.terms) == 3
    assert (res.terms["p_value"] == 1.0).all() and (res.terms["p_holm"] == 1.0).all()
    assert (res.terms["chi2"] == 0.0).all() and (res.terms["df"] == 0).all()
    assert not any("*" in cell for row in interaction_rows(res) for cell in row)
    assert all("no evidence" in line for line in res.lines) and not any("+0.000" in x for x in res.lines)


def test_an_exact_shift_on_every_query_is_bounded_by_the_sign_flip_p():
    """No noise at all: the Wald covariance is zero, the estimate is not. p = 2·2^−G, not 0."""
    res = interaction_effects(
        _grid_of(lambda p, k, q: q / 40 + (0.1 if p == "concise" else 0.0), n=12),
        ["prompt", "retriever.k"],
        ["hit_at_5"],
    )
    t = res.terms.set_index("term")
    assert t.loc["prompt", "p_value"] == pytest.approx(2.0**-11)
    assert t.loc["retriever.k", "p_value"] == 1.0 and t.loc["prompt × retriever.k", "p_value"] == 1.0


def test_the_sentence_writer_never_prints_a_zero_spread_over_a_level():
    """A significant interaction where at k=3 both prompts are equal: 'no difference', not
    'best prompt is cite (+0.000 over cite)'."""
    df = pd.DataFrame(
        {"query": [0, 0, 0, 0], "f0": ["cite", "concise", "cite", "concise"], "f1": ["3", "3", "5", "5"],
         "y": [0.5, 0.5, 0.2, 0.9]}
    )
    line = describe(df, ["prompt", "retriever.k"], "C(f0, Sum):C(f1, Sum)", "hit_at_5", 0.001, 0.05)
    assert "at retriever.k=3 no difference between prompt levels (all 0.500)" in line
    assert "at retriever.k=5 best prompt is concise (+0.700 over cite)" in line and "+0.000" not in line
    # lower is better (a failure rate): the best level is the lower one
    low = describe(df, ["prompt", "retriever.k"], "C(f0, Sum):C(f1, Sum)", "rate_retrieval_failure", 0.001, 0.05)
    assert "at retriever.k=5 best prompt is cite (−0.700 over concise)" in low


def test_fixed_effect_fit_matches_statsmodels_with_query_dummies():
    """Independent implementation: statsmodels OLS with C(query) dummies and cluster covariance has
    the same coefficients; its covariance differs only by the documented small-sample factor
    (N−p_sm)/(N−p) (statsmodels counts the G query dummies in p_sm)."""
    import statsmodels.formula.api as smf

    from rag_experiments.analysis.interactions import _design, _within

    rng = np.random.default_rng(1)
    g, parts = 25, []
    for a in range(3):
        for b in range(2):
            y = rng.random(g) + 0.1 * a * b + rng.normal(0, 0.3, g)
            parts.append(pd.DataFrame({"query": [f"q{i}" for i in range(g)], "y": y, "f0": str(a), "f1": str(b)}))
    df = pd.concat(parts, ignore_index=True)
    fit = smf.ols("y ~ C(query) + C(f0, Sum) + C(f1, Sum) + C(f0, Sum):C(f1, Sum)", data=df).fit(
        cov_type="cluster", cov_kwds={"groups": pd.factorize(df["query"])[0]}
    )
    cols = [i for i, name in enumerate(fit.model.exog_names) if name.startswith("C(f")]
    x, _ = _design(df, 2)
    codes = pd.factorize(df["query"])[0]
    xt, yt = _within(x, codes, g), _within(df[["y"]].to_numpy(), codes, g)[:, 0]
    beta = np.linalg.lstsq(xt, yt, rcond=None)[0]
    np.testing.assert_allclose(beta, fit.params.iloc[cols].to_numpy(), atol=1e-10)
    n, p, p_sm = len(df), x.shape[1], len(fit.params)
    sm_cov = fit.cov_params().iloc[cols, cols].to_numpy() * (n - p_sm) / (n - p)
    (term, dof, w, _), *_ = wald_terms(df, 2)
    b = beta[:2]
    assert term == "C(f0, Sum)" and dof == 2
    assert w == pytest.approx(float(b @ np.linalg.solve(sm_cov[:2, :2], b)), rel=1e-8)
