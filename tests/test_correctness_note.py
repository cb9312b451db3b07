"""The correctness card where users look (issue 45, item 5): a generating run's closing notes and the
report's validity section name ``spotcheck sample-answers`` with the n needed, and a run whose
correctness was never checked against answer-level labels says so beside it."""

from __future__ import annotations

import math
from types import SimpleNamespace

from rag_experiments.analysis.judge_trust import (
    answers_checked,
    correctness_note,
    kappa_labels_needed,
    labels_needed,
    runs_correctness_notes,
)
from rag_experiments.report.model import Paragraph, Table
from rag_experiments.report.sections import correctness_validity
from rag_experiments.run.run_summary import closing_notes, summary_table

AGG = {
    "n_queries": 8, "n_errors": 0, "n_unparseable_verdicts": 0, "hit_at_3": 0.5, "n_scored/hit_at_3": 8,
    "correctness": 0.4, "n_scored/correctness": 5, "correctness_ci_low": 0.1, "correctness_ci_high": 0.7,
    "faithfulness": 0.8, "n_scored/faithfulness": 5,
}  # fmt: skip
CHECKED = {
    "spotcheck/answers/correctness/kappa": 0.62, "spotcheck/answers/correctness/kappa_ci_low": 0.41,
    "spotcheck/answers/correctness/kappa_ci_high": 0.83, "spotcheck/answers/correctness/n": 40.0,
}  # fmt: skip


def test_the_closing_notes_ask_for_claims_and_answers_with_the_n_needed():
    notes = closing_notes(AGG, {"judge_card_source": "synthetic"}, "r123")
    assert len(notes) == 2 and notes[0].startswith("generation metrics unvalidated on this corpus")
    n = labels_needed(0.1)
    assert n == 97 and kappa_labels_needed(0.1) == 289
    assert notes[1].startswith("correctness unvalidated: key-fact matching was never checked")
    assert f"python -m rag_experiments.spotcheck sample-answers r123 -n {n} --out answers.csv" in notes[1]
    assert "spotcheck score-answers r123 answers.csv" in notes[1]
    # checked against answer labels: no correctness note; a retrieval-only run: none either
    assert len(closing_notes(AGG | CHECKED, {"judge_card_source": "synthetic"}, "r123")) == 1
    assert runs_correctness_notes([({"hit_at_3": 0.5}, {})]) == []
    assert not answers_checked({"spotcheck/answers/correctness/kappa": math.nan})


def test_the_summary_says_so_beside_correctness():
    line = next(x for x in summary_table(AGG, 3, [3]).splitlines() if x.startswith("correctness "))
    assert line.endswith("(unvalidated: no answer labels, see note)")
    line = next(x for x in summary_table(AGG | CHECKED, 3, [3]).splitlines() if x.startswith("correctness "))
    assert "unvalidated" not in line


def _analysis(*metrics: dict) -> SimpleNamespace:
    configs = [SimpleNamespace(label=f"c{i}", metrics=m) for i, m in enumerate(metrics)]
    return SimpleNamespace(
        gen_keys=["correctness"], configs=configs, base=SimpleNamespace(run=SimpleNamespace(run_id="rb"))
    )


def _plain(blocks) -> list[str]:
    """Each block as plain text: a paragraph's spans joined, a table's rows as ``a | b | c``."""
    out = []
    for b in blocks:
        if isinstance(b, Paragraph):
            out.append("".join(sp.text for sp in b.text))
        elif isinstance(b, Table):
            out += [" | ".join("".join(sp.text for sp in c) for c in row) for row in b.rows]
    return out


def test_the_report_validity_section_names_sample_answers_or_shows_the_kappa():
    (note,) = _plain(correctness_validity(_analysis(AGG, AGG)))
    assert note == correctness_note("rb") and "spotcheck sample-answers rb -n 97" in note
    lines = _plain(correctness_validity(_analysis(AGG | CHECKED, AGG)))
    assert "never checked" in lines[0] and lines[1:] == ["c0 | 0.620 [0.410, 0.830] | 40"]
    assert correctness_validity(SimpleNamespace(gen_keys=["faithfulness"])) == []
