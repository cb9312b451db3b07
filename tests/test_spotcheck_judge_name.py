"""``spotcheck score``'s summary names the judge (issue 37: it said "judge `None`" for the heuristic
judge, whose ``judge_model`` tag is "None")."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rag_experiments.core.run_record import RunData
from rag_experiments.spotcheck.scoring import Agreement
from rag_experiments.spotcheck.summary import judge_name, render_summary


def _run(judge: str, model: str) -> RunData:
    tags = {"judge_model": model, "judge_identity": "abc123", "generator_model": "smollm2.gguf"}
    return RunData("0123456789abcdef", "cfg", {"judge": judge}, tags, run_name="cfg")


def _agreement() -> Agreement:
    confusion = pd.DataFrame([[3, 1], [0, 4]], index=["supported", "unsupported"], columns=["supported", "unsupported"])
    return Agreement(8, 0, 0, 0.875, 0.75, (0.3, 1.0), confusion, 0.2, 0.25, sample={"agreement": 0.875, "kappa": 0.75, "leniency": 0.2, "strictness": 0.25})


def test_the_summary_names_a_model_free_judge():
    text = render_summary(_run("heuristic", "None"), _agreement(), Path("labels.csv"))
    first = next(ln for ln in text.splitlines() if ln.startswith("Labels:"))
    assert first == "Labels: `labels.csv`; judge `heuristic`, generator `smollm2.gguf`.", first
    assert "None" not in first


def test_a_judge_with_a_model_is_named_with_it():
    assert judge_name(_run("openai", "gpt-4o-mini")) == "openai (gpt-4o-mini)"
    assert judge_name(RunData("r", "r", {"judge": "heuristic"}, {})) == "heuristic"
