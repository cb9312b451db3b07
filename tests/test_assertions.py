"""Per-item assertions (issue 45, item 3): an eval item's ``assert`` list, validated at load
(``FILE:LINE: assert[i]: …``, exit 2), evaluated per answer (``evaluation.assertions``), a declared
per-query column, counted in the aggregates, traced as assessments, and a critical check failing
for a candidate fails the gate whatever the aggregates (``analysis.checks``, ``gate``,
``gate --summary-md``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from rag_experiments.analysis.checks import check_results, critical_failures, newly_failing
from rag_experiments.analysis.gate import gate_passed, non_inferiority
from rag_experiments.cli.evalset import main as evalset_main
from rag_experiments.core.query_table import read_per_query, write_per_query
from rag_experiments.core.types import Check, EvalItem, Span
from rag_experiments.evalset.checks import parse_checks
from rag_experiments.evalset.corpus import load_corpus
from rag_experiments.evalset.load import EvalSetError, load_evalset
from rag_experiments.evaluation.answer_metrics import run_aggregates
from rag_experiments.evaluation.assertions import (
    add_assertion_columns,
    assertion_columns,
    check_result,
    match_form,
)
from rag_experiments.report.gate_summary import CriticalRow, GateSummary, Link, render_summary
from rag_experiments.tracking.assessments import check_feedbacks
from tests.llm_fixtures import fake_llm  # noqa: F401 - fixture

DOCS = {
    "refunds.md": "# Refunds\n\nRefunds of annual plans are prorated to the days left.\n",
    "webhooks.md": "# Webhooks\n\nFailed deliveries are retried for 24 hours with exponential backoff.\n",
}


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    for name, text in DOCS.items():
        (d / name).write_text(text)
    return d


def _write(tmp_path, rows) -> str:
    p = tmp_path / "evalset.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def _item(i: int, checks) -> dict:
    return {
        "id": f"q{i}", "query": "are annual refunds prorated",
        "gold_evidence": [{"doc_id": "refunds.md", "quote": "prorated to the days left"}],
        "key_facts": ["prorated"], "assert": checks,
    }  # fmt: skip


def test_checks_load_and_bad_ones_name_file_line_and_index(corpus, tmp_path, capsys):
    good = [
        {"type": "not_contains", "value": "never", "critical": True},
        {"type": "regex", "value": r"(?i)prorat(ed|ion)"},
        {"type": "answers"},
        {"type": "cites", "value": "refunds.md"},
        {"type": "max_latency_s", "value": 2.5},
    ]
    ev = _write(tmp_path, [_item(1, good)])
    items, _ = load_evalset(ev, load_corpus(corpus))
    assert items[0].checks[0] == Check("not_contains", "never", True)
    assert [c.type for c in items[0].checks] == ["not_contains", "regex", "answers", "cites", "max_latency_s"]
    bad = [
        {"type": "not_contain", "value": "x"},  # unknown type
        {"type": "regex", "value": "(unclosed"},  # invalid regex
        {"type": "contains"},  # missing value
        {"type": "cites", "value": "refund.md"},  # unknown document, with a guess
        {"type": "max_latency_s", "value": -1},
        {"type": "declines", "value": "yes"},  # takes no value
        {"type": "contains", "value": "x", "critical": "yes"},
        {"type": "contains", "valeu": "x"},  # a typo of a key
    ]
    ev = _write(tmp_path, [_item(1, good), _item(2, bad)])
    with pytest.raises(EvalSetError) as e:
        load_evalset(ev, load_corpus(corpus))
    got = e.value.problems
    assert got == [
        f"{ev}:2: assert[0]: unknown type 'not_contain' (one of contains, not_contains, regex, not_regex, "
        "declines, answers, cites, max_latency_s)",
        f"{ev}:2: assert[1]: regex: invalid regular expression '(unclosed': missing ), unterminated "
        "subpattern at position 0",
        f"{ev}:2: assert[2]: contains: missing value (a non-empty string)",
        f"{ev}:2: assert[3]: cites: unknown doc_id 'refund.md'; did you mean 'refunds.md'?",
        f"{ev}:2: assert[4]: max_latency_s: value must be a number > 0, got -1",
        f"{ev}:2: assert[5]: declines takes no value (got 'yes')",
        f"{ev}:2: assert[6]: critical must be true or false, got 'yes'",
        f"{ev}:2: assert[7]: unknown key(s) 'valeu' (a check has type, value, critical)",
        f"{ev}:2: assert[7]: contains: missing value (a non-empty string)",
    ]
    assert evalset_main(["validate", "--corpus", str(corpus), "--evalset", ev]) == 2
    err = capsys.readouterr().err
    assert f"{ev}:2: assert[1]: regex: invalid regular expression" in err
    assert parse_checks({"type": "contains"}, "f:1")[1] == [
        "f:1: assert: expected a list of checks, got dict"
    ]


@pytest.mark.parametrize(
    "check, answer, declined, cited, latency, passed",
    [
        (Check("contains", "24 Hours"), "Retried for 24  hours.", False, None, 0.1, True),  # case, spaces
        (
            Check("contains", "24 hours"),
            "Retried for 24-hours.",
            False,
            None,
            0.1,
            False,
        ),  # a hyphen is not a space
        (Check("not_contains", "never"), "It is NEVER retried.", False, None, 0.1, False),
        (Check("not_contains", "never"), "It is retried.", False, None, 0.1, True),
        (Check("regex", r"\b24 hours\b"), "for 24 hours", False, None, 0.1, True),
        (
            Check("regex", r"\b24 Hours\b"),
            "for 24 hours",
            False,
            None,
            0.1,
            False,
        ),  # as written: case-sensitive
        (Check("not_regex", r"(?i)\bnever\b"), "Nevertheless, yes.", False, None, 0.1, True),
        (Check("declines"), "I don't know.", True, None, 0.1, True),
        (Check("declines"), "24 hours.", False, None, 0.1, False),
        (Check("answers"), "24 hours.", False, None, 0.1, True),
        (Check("cites", "webhooks.md"), "24 hours [1].", False, ["webhooks.md"], 0.1, True),
        (Check("cites", "webhooks.md"), "24 hours [1].", False, ["refunds.md"], 0.1, False),
        (Check("cites", "webhooks.md"), "24 hours.", False, None, 0.1, False),  # the prompt asks for none
        (Check("max_latency_s", 1.0), "24 hours.", False, None, 1.0, True),
        (Check("max_latency_s", 1.0), "24 hours.", False, None, 1.5, False),
        (Check("not_contains", "never"), None, False, None, 0.1, False),  # no answer: fails
    ],
)
def test_each_check_type(check, answer, declined, cited, latency, passed):
    got, detail = check_result(check, answer, declined, cited, latency)
    assert got is passed and detail


def test_match_form():
    assert match_form("  Never\tEVER\n") == "never ever"


def _rows(answers: dict[str, str], checks: dict[str, list[Check]], latency: float = 0.2):
    items = [EvalItem(i, "q", [Span("webhooks.md", 0, 5)], checks=checks.get(i, [])) for i in answers]
    rows = [
        {"id": i, "query": f"question {i}", "answer": a, "error": None, "declined": a.startswith("I don't"),
         "cited_chunk_ids": ["webhooks.md#0-60"], "latency_retrieval_s": latency / 2,
         "latency_generation_s": latency / 2, "latency_judge_s": 9.0}
        for i, a in answers.items()
    ]  # fmt: skip
    return items, rows


def test_columns_aggregates_schema_and_assessments(tmp_path):
    checks = {
        "q1": [
            Check("not_contains", "never", True),
            Check("cites", "webhooks.md"),
            Check("max_latency_s", 0.5),
        ],
        "q2": [Check("declines", critical=True)],
    }
    items, rows = _rows({"q1": "Never retried.", "q2": "24 hours.", "q3": "fine"}, checks)
    add_assertion_columns(rows, items, [True, True, False])
    assert [a["passed"] for a in rows[0]["assertions"]] == [False, True, True]  # judge time is not serving
    assert rows[0]["assertions"][2]["detail"] == "serving latency 0.200 s ≤ 0.5 s"
    assert (rows[0]["n_assertions_failed"], rows[0]["n_critical_failed"]) == (1, 1)
    assert (rows[1]["n_assertions_failed"], rows[1]["n_critical_failed"]) == (1, 1)
    assert rows[2]["assertions"] == [] and math.isnan(rows[2]["n_assertions_failed"])  # not generated
    df = pd.DataFrame(rows)
    df["gold_spans"] = [[{"doc_id": "webhooks.md", "start": 0, "end": 5}]] * 3
    agg = run_aggregates(df)
    assert (agg["n_assertions"], agg["n_assertions_failed"], agg["n_critical_failed"]) == (4, 2, 2)
    path = tmp_path / "per_query.parquet"
    write_per_query(df.drop(columns=["gold_spans"]), path)  # a declared nested column: written as Arrow
    back = read_per_query(path)
    assert back.loc[0, "assertions"][0]["type"] == "not_contains" and back.loc[0, "assertions"][0]["critical"]
    fb = check_feedbacks(back.loc[0].to_dict())
    assert [(f.name, f.value) for f in fb] == [("assert/0", False), ("assert/1", True), ("assert/2", True)]
    assert fb[0].rationale == "not_contains 'never' (critical): contains 'never'"
    # a run whose items carry no check gets no column: its table is as before
    items, rows = _rows({"q1": "x"}, {})
    add_assertion_columns(rows, items, [True])
    assert (
        "assertions" not in rows[0]
        and run_aggregates(pd.DataFrame(rows).assign(gold_spans=[[]])).get("n_assertions") is None
    )


def _table(answers: dict[str, str], checks: dict[str, list[Check]]) -> pd.DataFrame:
    items, rows = _rows(answers, checks)
    for r in rows:
        r.update(assertion_columns(next(it for it in items if it.id == r["id"]), r))
        r["hit_at_5"] = 1.0
    return pd.DataFrame(rows)


def test_a_critical_check_the_candidate_breaks_fails_the_gate_while_the_aggregates_pass():
    checks = {
        "q1": [Check("not_contains", "never", critical=True)],
        "q2": [Check("contains", "24 hours", critical=True), Check("cites", "refunds.md")],
        "q3": [Check("answers")],
    }
    base = _table({"q1": "Retried for 24 hours.", "q2": "No idea, sorry.", "q3": "24 hours."}, checks)
    cand = _table({"q1": "Never retried after 24 hours.", "q2": "Nothing.", "q3": "I don't know."}, checks)
    res = non_inferiority(base.set_index("id")["hit_at_5"], cand.set_index("id")["hit_at_5"], margin=0.5)
    assert res.passed  # the aggregate is unchanged
    crit = critical_failures(base, cand)
    assert [(f.item_id, f.index, f.check, f.baseline) for f in crit] == [
        ("q1", 0, "not_contains 'never'", "passes"),  # broken by the candidate: first
        ("q2", 0, "contains '24 hours'", "fails too"),
    ]
    assert crit[0].detail == "contains 'never'" and crit[0].query == "question q1"
    assert not gate_passed([res], crit) and gate_passed([res], [])
    new = newly_failing(base, cand)  # compare's list: critical or not, passing in the baseline
    assert [(f.item_id, f.check) for f in new] == [("q1", "not_contains 'never'"), ("q3", "answers")]
    assert critical_failures(base, base.drop(columns=["assertions"])) == []  # a run without checks
    assert check_results(pd.concat([cand, base]))[("q1", 0)]["passed"] is False  # any replicate failing


def test_the_summary_lists_critical_failures_first():
    s = GateSummary(
        verdict="FAIL", confidence="95%", baseline=Link("base", "#/b"), candidate=Link("cand", "#/c"),
        rows=[], caveats=[], underpowered=False, diff=[],
        critical=[CriticalRow("q1", "how long | retried", "assert[0] not_contains 'never'", "contains 'never'",
                              "passes", Link("trace", "#/experiments/1/traces?selectedEvaluationId=tr-1"))],
    )  # fmt: skip
    md = render_summary(s)
    assert md.index("### Critical checks failing") < md.index("| metric |")
    assert "1 critical check of the eval items fails for the candidate" in md
    row = next(line for line in md.splitlines() if line.startswith("| q1 |"))
    assert "how long \\| retried" in row and "| passes |" in row
    assert "[candidate](<#/experiments/1/traces?selectedEvaluationId=tr-1>)" in row


def test_gate_cli_fails_on_a_critical_check_and_the_summary_names_it(tmp_path, capsys):
    """End to end on a real sqlite store: identical metrics, one critical check broken."""
    from mlflow.tracking import MlflowClient

    from rag_experiments.cli import gate

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("rag", artifact_location=str(tmp_path / "mlruns"))
    ids = [f"q{i}" for i in range(60)]
    checks = {i: [Check("not_contains", "never", critical=True)] for i in ids}
    hits = np.array([1.0 if k % 3 else 0.0 for k in range(60)])

    def log(name: str, answers: dict[str, str]) -> None:
        t = _table(answers, checks).assign(hit_at_5=hits, mrr=hits / 2, faithfulness=0.9)
        rid = client.create_run(
            exp, run_name=name, tags={"evalset_digest": "e1", "corpus_digest": "c1"}
        ).info.run_id
        p = tmp_path / rid / "per_query.parquet"
        p.parent.mkdir()
        write_per_query(t, p)
        client.log_artifact(rid, str(p))
        client.set_terminated(rid)

    log("base", dict.fromkeys(ids, "Retried for 24 hours."))
    log("cand", dict.fromkeys(ids, "Retried for 24 hours.") | {"q7": "Never retried."})
    md = tmp_path / "summary.md"
    argv = ["--tracking-uri", uri, "--baseline", "base", "--candidate", "cand", "--summary-md", str(md)]
    assert gate.main(argv) == 1
    out = capsys.readouterr().out
    assert out.index("CRITICAL CHECKS FAILED: 1") < out.index("hit_at_5")  # first, before the metrics
    assert "  q7 assert[0] not_contains 'never': contains 'never'; baseline passes" in out
    assert "GATE FAILED: 1 critical check(s) fail for the candidate" in out
    text = md.read_text()
    assert (
        text.startswith("## Regression gate: ❌ FAIL")
        and "| q7 | question q7 | assert[0] not_contains 'never'" in text.replace("\\", "")  # inert escapes
    )


def test_the_real_pipeline_writes_the_columns_and_counts(tmp_path, fake_llm):  # noqa: F811
    """The real pipeline (tiny corpus, BM25, an OpenAI-compatible endpoint on 127.0.0.1 that echoes
    the prompt, no judge): checks added to two items come back as columns and run counts."""
    from dataclasses import replace

    from rag_experiments.stages.generation import OpenAICompatibleGenerator
    from rag_experiments.stages.prompts import PromptTemplate
    from tests.sweep_helpers import tiny_inputs, tiny_pipeline

    corpus, items, cache = tiny_inputs(tmp_path, n_items=4)
    first = items[0]
    checks = [
        Check("contains", first.query.upper(), critical=True),  # the echo holds the question
        Check("not_contains", "banana"),
        Check("declines"),  # it does not decline: fails
        Check("cites", first.gold_spans[0].doc_id),  # the prompt asks for no citations: fails
        Check("max_latency_s", 60),
    ]
    items = [
        replace(first, checks=checks),
        replace(items[1], checks=[Check("answers", critical=True)]),
        *items[2:],
    ]
    gen = OpenAICompatibleGenerator(base_url=fake_llm.base_url, model="ok", max_retries=0)
    prompt = PromptTemplate("plain", "Answer from the context.", "Question: {question}\n\n{context}")
    res = tiny_pipeline((corpus, items, cache), generator=gen, prompt=prompt, judge=None)
    df = res.per_query.set_index("id")
    got = [(a["type"], a["passed"]) for a in df.loc[first.id, "assertions"]]
    assert got == [("contains", True), ("not_contains", True), ("declines", False), ("cites", False),
                   ("max_latency_s", True)]  # fmt: skip
    assert df.loc[first.id, "n_assertions_failed"] == 2 and df.loc[first.id, "n_critical_failed"] == 0
    assert df.loc[items[2].id, "assertions"] == []  # an item without checks
    assert (res.aggregates["n_assertions"], res.aggregates["n_assertions_failed"]) == (6, 2)
    assert res.aggregates["n_critical_failed"] == 0


def test_the_report_lists_each_configs_newly_failing_checks_critical_first():
    from types import SimpleNamespace as NS

    from rag_experiments.report.model import plain
    from rag_experiments.report.sweep_extras import checks_section

    checks = {"q1": [Check("contains", "24 hours")], "q2": [Check("not_contains", "never", critical=True)]}
    base = NS(label="base", table=_table({"q1": "24 hours.", "q2": "Retried."}, checks))
    worse = NS(label="k=3", table=_table({"q1": "A day.", "q2": "Never retried."}, checks))
    same = NS(label="k=5", table=base.table)
    s = checks_section(NS(base=base, configs=[base, worse, same]))
    assert s.title == "Checks newly failing against base (2)"
    rows = [[plain(c) for c in r] for r in s.blocks[-1].rows]
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [
        ("k=3", "q2", "assert[0] not_contains 'never'", "yes"),  # critical first
        ("k=3", "q1", "assert[0] contains '24 hours'", ""),
    ]
    quiet = checks_section(NS(base=base, configs=[base, same]))
    assert "No config fails a check that base passes (2 checks" in plain(quiet.blocks[0].text)
    plain_tables = NS(base=NS(label="b", table=base.table.drop(columns=["assertions"])), configs=[])
    assert checks_section(plain_tables) is None
