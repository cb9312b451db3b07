"""How far to trust the judge (analysis/judge_trust.py): the label counts, which κ leads, the notes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rag_experiments.analysis.judge_trust import (
    KAPPA_UNRELIABLE,
    card_title,
    generation_marker,
    human_kappa,
    is_generation_metric,
    kappa_labels_needed,
    labels_needed,
    runs_judge_notes,
)

SYNTH = {"judge_card_source": "synthetic"}
CARD = {"judge_card/kappa": 0.52, "judge_card/n_pairs": 200.0}


def test_labels_needed_gives_the_ci_half_width_it_promises():
    """n = ⌈z² p(1−p)/h²⌉; a simulated agreement rate at that n has a 95 % CI of about ±h."""
    assert labels_needed(0.1) == 97 and labels_needed(0.05) == 385 and labels_needed(0.1, p=0.9) == 35
    assert kappa_labels_needed(0.1) == 289  # p_o 0.75, p_e 0.5: κ 0.5
    rng = np.random.default_rng(0)
    n = labels_needed(0.1)
    means = rng.binomial(n, 0.5, 20000) / n
    half = 1.96 * math.sqrt(0.25 / n)
    assert half <= 0.1 and abs(np.mean(np.abs(means - 0.5) <= 0.1) - 0.95) < 0.01
    with pytest.raises(ValueError):
        labels_needed(0)


def test_human_labels_lead_and_the_synthetic_card_is_never_a_human_kappa():
    assert human_kappa(CARD, SYNTH) is None  # synthetic: a bound, not a measurement of this judge
    file_card = human_kappa(CARD, {"judge_card_source": "file:mine.jsonl"})
    assert file_card.kappa == 0.52 and file_card.source == "labelled pairs (file:mine.jsonl)"
    spot = human_kappa({**CARD, "spotcheck/kappa": 0.05, "spotcheck/n": 58.0}, SYNTH)
    assert (spot.kappa, spot.source, spot.n) == (0.05, "spot-check", 58)  # this run's labels first
    assert "optimistic bound" in card_title("synthetic") and card_title("file:x.jsonl").endswith("x.jsonl")


def test_notes_marker_below_0_4_else_unvalidated_once():
    unlabelled = [(CARD, SYNTH), (CARD, SYNTH)]
    (note,) = runs_judge_notes(unlabelled, "abc123")
    assert note.startswith("generation metrics unvalidated on this corpus")
    assert "python -m rag_experiments.spotcheck sample abc123 -n 97" in note
    low = [(CARD, SYNTH), ({**CARD, "spotcheck/kappa": 0.05, "spotcheck/n": 58.0}, SYNTH)]
    assert runs_judge_notes(low) == [
        "judge κ=0.05 vs your labels (spot-check, n=58): generation conclusions unreliable (κ < 0.4)"
    ]
    assert generation_marker(low) == runs_judge_notes(low)[0]
    ok = [({"spotcheck/kappa": KAPPA_UNRELIABLE}, SYNTH)]
    assert runs_judge_notes(ok) == [] and generation_marker(ok) is None
    assert runs_judge_notes([({"hit_at_5": 0.8}, {})]) == []  # retrieval-only: nothing to say
    assert runs_judge_notes([({}, {"judge_card_source": "disabled"})])[0].startswith("generation metrics unvalidated")
    assert is_generation_metric("faithfulness") and is_generation_metric("rate_ok")
    assert not is_generation_metric("hit_at_5") and not is_generation_metric("no_such_metric")
