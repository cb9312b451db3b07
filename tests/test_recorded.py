"""``tests/recorded.py``: recorded values match within the stated float tolerance and nowhere else."""

from __future__ import annotations

import pytest

from tests import recorded

ROWS = [{"id": "q1", "score": 0.27845150232315063, "label": "ok", "nested": [{"s": 0.5, "n": 3}]}]
AGG = {"mrr": 0.25, "n": 2}


def test_float_drift_within_tolerance_passes_and_any_other_change_fails(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(recorded, "FIXTURES", tmp_path)
    monkeypatch.setenv("RAG_RECORD_EXPECTED", "1")
    with pytest.raises(pytest.skip.Exception):
        recorded.check("x", ROWS, AGG)
    monkeypatch.delenv("RAG_RECORD_EXPECTED")
    # a float32 last-digit drift that flips round(v, 6) (0.278451 -> 0.278452): still equal
    recorded.check("x", [{**ROWS[0], "score": 0.2784515}], AGG)
    changed = (
        [{**ROWS[0], "score": 0.2785}],  # a float moved beyond the tolerance
        [{**ROWS[0], "label": "no"}],  # a string
        [{**ROWS[0], "nested": [{"s": 0.5, "n": 4}]}],  # a nested int
        [{**ROWS[0], "nested": [{"s": 0.5, "n": 3}, {"s": 0.5, "n": 3}]}],  # a row's shape
        [{**ROWS[0], "score": float("nan")}],  # a value became NaN
        [{**ROWS[0], "extra": 1}],  # a new column
    )
    for rows in changed:
        with pytest.raises(AssertionError):
            recorded.check("x", rows, AGG)
    with pytest.raises(AssertionError):
        recorded.check("x", ROWS, {**AGG, "mrr": 0.26})
