"""Interactions of a full-factorial sweep (analysis/interactions.py) on synthetic per-query tables."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from rag_experiments.analysis.attribution import RunData
from rag_experiments.analysis.interactions import interaction_effects, is_full_factorial


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
