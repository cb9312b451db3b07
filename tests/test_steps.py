"""The run loop (run/steps.py): records summed per slot, every duty derived from the records and
the slot declarations, and no module keeping its own list of stage names."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd

from rag_experiments.core.slots import SLOTS, steps
from rag_experiments.run.steps import Ledger, StepRecord, failure_reason, step_summary
from rag_experiments.run.sweep import first_stage_lines, summary_table

PKG = Path(__file__).resolve().parent.parent / "rag_experiments"


class _Step:
    def __init__(self, slot, items, failed, calls):
        self.slot, self.args = slot, (items, failed, calls)

    def run(self, state, ctx):
        state.append(self.slot)
        items, failed, calls = self.args
        return StepRecord(self.slot, items, failed, calls, first_error="boom" if failed else "")


def test_ledger_derives_timings_calls_errors_and_status_from_records():
    led, state = Ledger(), []
    led.run(_Step("chunker", 4, 0, {}), state, None)
    led.run(_Step("reranker", 8, 3, {"rerank": 8}), state, None)
    for _ in range(2):  # two replicates of the generation step: summed per slot
        led.run(_Step("generator", 5, 1, {"generation": 5}), state, None)
    assert state == ["chunker", "reranker", "generator", "generator"]
    assert list(led.timings()) == ["chunking_s", "rerank_s", "generation_s"]  # run order, from the slots
    assert led.calls() == {"rerank": 8, "generation": 10}
    assert led.error_counts() == {"n_rerank_errors": 3, "n_errors": 2}
    assert failure_reason(led.records) == ""
    assert [ln.split(":")[0] for ln in step_summary(led.records)] == ["rerank", "generation"]
    led.add(StepRecord("query_transform", 8, 8, {"query": 8}, first_error="no rewrite"))
    why = failure_reason(led.records)
    assert "every one of the 8 transformed questions errored (query step" in why and "no rewrite" in why


def test_summary_names_every_step_error_count_and_the_first_stage_line_is_a_paired_test():
    agg = {"n_queries": 3, "n_errors": 0, "n_unparseable_verdicts": 0, "n_rerank_errors": 2, "hit_at_1": 0.5}
    assert "rerank errors 2" in summary_table(agg, 1, [1])
    df = pd.DataFrame({"id": ["a", "b", "c", "d"], "hit_at_1": [1.0, 1.0, 0.0, 1.0],
                       "first_stage/hit_at_1": [0.0, 1.0, 0.0, 0.0]})  # fmt: skip
    (line,) = first_stage_lines(df, agg, 1, [1])
    assert "0.250 →  0.750" in line and "+0.500" in line and "mcnemar" in line and "n=4" in line


def _names() -> set[str]:
    out = set()
    for s in SLOTS:
        out |= {s.name, s.group} | ({s.step, s.column} - {""})
    return out


#: Lists of the same words that are not stages: the variance components (query = the eval item's
#: own difficulty, then generation and judge sampling; analysis/variance.py) and their figure.
NOT_STAGES = {"analysis/variance.py", "report/figures.py"}


def test_no_module_keeps_a_list_of_stage_names():
    """A new slot is declared once (core/slots.py); a tuple, list or set literal naming three or more
    stages elsewhere is a copy that the next slot would miss (as query and rerank once did)."""
    names, found = _names(), []
    for path in PKG.rglob("*.py"):
        if path.name == "slots.py" or str(path.relative_to(PKG)) in NOT_STAGES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typed = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)}  # Literal[...]: types
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set) and id(node) not in typed:
                hits = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
                if len(set(hits)) >= 3:
                    found.append(f"{path.relative_to(PKG)}:{node.lineno} {hits}")
    assert not found, "\n".join(found)


def test_steps_are_ordered_by_position():
    assert [s.position for s in steps()] == sorted(s.position for s in steps())
    assert all(s.step for s in steps()) and len({s.step for s in steps()}) == len(steps())
