"""The headline rule (which metrics lead, from the swept factors' side) and the default baseline
(``analysis.baseline``) that compare --sweep and report share: pure functions, no store, no model."""

from __future__ import annotations

import pandas as pd
import pytest

from rag_experiments.analysis.baseline import choose_baseline, context_k, sweep_baseline
from rag_experiments.core.run_record import RunData
from rag_experiments.evaluation.headline import (
    CHUNKING_REASON,
    GENERATION_REASON,
    factor_side,
    headline_reason,
    lead_side,
    primary_metric,
    table_metrics,
)
from rag_experiments.run.defaults import default_levels

GEN = ["correctness", "faithfulness", "rate_ok"]
RETRIEVAL = [
    "hit_at_3",
    "hit_at_5",
    "mrr",
    "evidence_recall_at_5",
    "evidence_recall_at_256tok",
    "hit_at_256tok",
]


@pytest.mark.parametrize(
    ("factor", "generated", "side"),
    [
        ("prompt", True, "generation"),
        ("judge", False, "generation"),
        ("generator", True, "generation"),
        ("generator.temperature", True, "generation"),
        ("retriever.k", True, "generation"),  # k = how many chunks the generator reads
        ("retriever.k", False, "retrieval"),
        ("chunking", True, "chunking"),
        ("chunking.size", False, "chunking"),
        ("retriever", True, "retrieval"),
        ("embedding", True, "retrieval"),
        ("rerank", True, "retrieval"),
    ],
)
def test_each_factor_has_the_side_of_the_metrics_it_can_move(factor, generated, side) -> None:
    assert factor_side(factor, generated) == side


def test_the_lead_is_the_side_every_swept_factor_can_move() -> None:
    avail = RETRIEVAL + GEN
    # prompt × k on generating runs: generation leads, its primary metric is correctness
    assert lead_side(["prompt", "retriever.k"], generated=True) == "generation"
    assert primary_metric(["prompt", "retriever.k"], avail) == "correctness"
    assert table_metrics(avail, ["retriever.k"])[:3] == GEN
    assert headline_reason(["prompt", "retriever.k"], generated=True) == GENERATION_REASON
    # a chunking × prompt sweep: the prompt cannot move retrieval metrics, the chunker moves answers
    assert primary_metric(["chunking", "prompt"], avail) == "correctness"
    # without generation a k sweep is a retrieval sweep, chunking leads with the equal budget
    assert primary_metric(["retriever.k"], RETRIEVAL) == "hit_at_5"
    assert primary_metric(["chunking", "retriever"], RETRIEVAL + GEN) == "evidence_recall_at_256tok"
    assert headline_reason(["chunking"], generated=True) == CHUNKING_REASON
    assert primary_metric(["embedding"], avail, k=3) == "hit_at_3"
    # no correctness logged (an eval set without key facts): the next generation metric
    assert primary_metric(["prompt"], RETRIEVAL + ["faithfulness"]) == "faithfulness"


def _runs(levels: list[dict[str, str]], primary: dict[str, list[float]] | None = None) -> list[RunData]:
    out = []
    for i, lv in enumerate(levels):
        table = pd.DataFrame({"id": ["a", "b"], **{m: v[i] for m, v in (primary or {}).items()}})
        out.append(RunData(f"r{i}", ",".join(f"{k}={v}" for k, v in lv.items()), dict(lv), {}, table))
    return out


def test_the_default_config_is_the_baseline_whatever_the_scores() -> None:
    levels = [{"prompt": p, "retriever.k": k} for p in ("cite", "concise") for k in ("3", "5")]
    defaults = {"prompt": "concise", "retriever.k": "5"}
    got = choose_baseline(levels, defaults, [0.9, 0.9, 0.9, 0.1], "correctness")
    assert (got.index, got.label, got.why) == (3, "prompt=concise, retriever.k=5", "the default config")
    assert got.line() == "baseline: prompt=concise, retriever.k=5 (the default config)"


def test_closest_to_the_default_then_best_on_the_primary_in_its_direction() -> None:
    levels = [{"prompt": p, "retriever.k": k} for p in ("cite", "concise") for k in ("3", "10")]
    defaults = {"prompt": "concise", "retriever.k": "5"}  # k=5 not swept: prompt=concise is closest
    got = choose_baseline(levels, defaults, [0.9, 0.9, 0.2, 0.4], "correctness")
    assert got.index == 3 and got.why.startswith("closest to the default config (prompt=concise)")
    # lower is better for a failure rate: the lower of the two closest
    low = choose_baseline(levels, defaults, [0.0, 0.0, 0.2, 0.4], "rate_generation_failure")
    assert low.index == 2
    # nothing at a default level: the best, and a tie says it was broken by run order
    none = choose_baseline(levels, {"prompt": "x", "retriever.k": "1"}, [0.5, 0.7, 0.7, None], "faithfulness")
    assert none.index == 1 and none.why.startswith("no config is at a default level")
    assert "tied with 1 other config(s): first in run order" in none.why


def test_sweep_baseline_reads_levels_primary_and_k_from_the_runs() -> None:
    levels = [{"prompt": p, "retriever.k": k} for p in ("cite", "concise") for k in ("3", "5")]
    runs = _runs(levels, {"correctness": [[1, 1], [1, 1], [0, 1], [0, 0]], "hit_at_5": [[1, 1]] * 4})
    assert context_k([r.params for r in runs]) == 5  # a tie between 3 and 5 goes to the larger
    got = sweep_baseline(runs, ["prompt", "retriever.k"], defaults={"prompt": "concise", "retriever.k": "5"})
    assert got.primary == "correctness" and got.index == 3  # the default, though it scores 0
    nodefault = sweep_baseline(runs, ["prompt", "retriever.k"], defaults={})
    assert nodefault.index == 0 and "tied with 1 other" in nodefault.why


def test_default_levels_come_from_the_composed_default_config() -> None:
    assert default_levels(["prompt", "retriever.k", "chunking", "generator.temperature", "nope.key"]) == {
        "prompt": "concise",
        "retriever.k": "5",
        "chunking": "markdown",
        "generator.temperature": "0.0",
    }


def test_racing_decides_on_the_primary_metric_select_reads() -> None:
    """A prompt sweep races on correctness (no prompt can move hit@k); judge=none on rate_ok; a
    retrieval sweep on hit@k; a chunking sweep on the smallest budget's evidence recall."""
    from rag_experiments.evaluation.headline import planned_primary
    from rag_experiments.run.racing import settings

    assert planned_primary(["prompt"], 5, generates=True, judged=True) == "correctness"
    assert planned_primary(["prompt"], 5, generates=True, judged=False) == "rate_ok"
    assert planned_primary(["retriever.k"], 5, generates=True, judged=True) == "correctness"  # context size
    assert planned_primary(["retriever"], 5, generates=True, judged=True) == "hit_at_5"
    assert planned_primary(["retriever.k"], 3, generates=False) == "hit_at_3"
    assert planned_primary(["chunking.chunk_size"], 5) == "evidence_recall_at_256tok"
    sweep = {"overrides": ["prompt=concise,cite", "retriever.k=5"]}
    assert settings({"enabled": True}, 5, 0, sweep, generates=True, judged=True).primary == "correctness"
    assert settings({"enabled": True}, 5, 0, sweep).primary == "hit_at_5"  # retrieval-only runs
    assert settings({"enabled": True, "primary": "rate_ok"}, 5, 0, sweep, True, True).primary == "rate_ok"
