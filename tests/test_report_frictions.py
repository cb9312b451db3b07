"""Report frictions of issue 37: worst queries leave out items never generated, and a sweep report
names the configs that did not finish instead of calling the rest "the only config"."""

from __future__ import annotations

import pandas as pd

from rag_experiments.core.run_record import RunData
from rag_experiments.report.load import Config, Target
from rag_experiments.report.queries import worst
from tests.test_run_reader import SWEEP, readers  # noqa: F401  (the seam's two stores)


def _table() -> pd.DataFrame:
    ret = [{"chunk_id": "c1", "doc_id": "d", "start": 0, "end": 10, "rank": 1}]
    gold = [{"doc_id": "d", "start": 100, "end": 110}]
    return pd.DataFrame(
        {
            "id": ["q1", "q2", "q3", "q4"],
            "query": ["a?", "b?", "c?", "d?"],
            "retrieved": [ret] * 4,
            "gold_spans": [gold] * 4,
            "failure_label": ["retrieval_failure", None, "error", "ok"],
            "answer": ["wrong", None, None, "right"],  # q2: outside generation_subset; q3: failed
            "error": [None, None, "timeout", None],
            "correctness": [0.0, float("nan"), float("nan"), 1.0],
        }
    )


def test_worst_queries_leave_out_items_never_generated():
    run = RunData("r1", "r1", {}, table=_table())
    ids = list(worst(Config(run, run, "r1"), k=1, n=5, gen=True)["id"])
    assert "q2" not in ids and ids[:2] == ["q3", "q1"]  # the error first, then the retrieval failure
    assert set(worst(Config(run, run, "r1"), k=1, n=5, gen=False)["id"]) == {"q1", "q2", "q3", "q4"}


def test_a_sweep_report_names_failed_and_missing_configs():
    done = RunData("a" * 32, "x", {}, run_name="chunking=markdown")
    failed = RunData("b" * 32, "y", {}, run_name="chunking=whole", status="FAILED")
    parent = RunData("c" * 32, "p", {}, tags={"configs_finished": "1/3"})
    note = Target("sw", [done], parent.run_id, parent, "sw", [failed]).unfinished_note()
    assert note is not None and "did not finish: chunking=whole (FAILED)" in note
    assert "1 never logged a run" in note and "2 config(s)" in note and "the 1 that finished" in note
    assert Target("sw", [done], parent.run_id, None, "sw").unfinished_note() is None


def test_the_sweep_target_finds_its_failed_config_in_both_stores(readers):  # noqa: F811
    """The seam's sweep has a FAILED config (chunking.size=1024): both readers name it."""
    from rag_experiments.report.load import resolve_target

    for rd in readers.values():
        note = resolve_target(rd, SWEEP).unfinished_note()
        assert note is not None and "did not finish: chunking.size=1024 (FAILED)" in note, note
        assert "the report covers the 3 that finished" in note
