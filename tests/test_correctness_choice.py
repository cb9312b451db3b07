"""Which correctness a verdict reads (issue 45, item 2): string match or the judge's reading,
chosen by the correctness card's κ on the same answers (``analysis.correctness_view``).

End to end: a fake judge endpoint (``tests.http_fakes`` through ``ChatServer``) answers per-fact
verdicts; ``correctness_judged`` is logged beside ``correctness``; the correctness card, on answers
labelled in the test, gives both κ and their paired difference; ``select``, ``gate`` and the
report then read the better-validated view and say which, with both κ."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from rag_experiments.analysis.correctness_view import (
    JUDGED,
    PREFIX,
    STRING,
    PairedCard,
    correctness_choice,
    paired_keys,
)
from rag_experiments.cli import gate as gate_cli
from rag_experiments.cli import select as select_cli
from rag_experiments.core.run_record import RunData
from rag_experiments.judge.llm import FACT_SYSTEM, LLMJudge
from rag_experiments.report.gate_summary import build_summary, render_summary
from rag_experiments.report.load import load_input, resolve_target
from rag_experiments.report.render import render_markdown
from rag_experiments.report.sections import build_report
from rag_experiments.spotcheck.answers import answer_card, card_metrics, generated_answers, paired_views
from rag_experiments.tracking.memory import MemoryStore
from rag_experiments.tracking.run_reader import MemoryRunReader
from tests.llm_fixtures import ChatServer
from tests.test_verdict_surfaces import _inline_texts

SWEEP = "s45"


def _judge_reply(body: dict) -> str:
    """The fake judge reads meaning the string match cannot: a fact the answer says "no longer"
    holds is contradicted, an answer that says "nothing" leaves it absent, a paraphrase supports it."""
    system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
    user = body["messages"][-1]["content"]
    if system == FACT_SYSTEM:
        answer = user.split("<answer>")[-1]
        return "contradicted" if "no longer" in answer else "absent" if "Nothing" in answer else "supported"
    if "questions" in user.lower():
        return "What does the policy say?"
    return "yes"


#: (the app's answer to an item with these key facts, what a human reader labels it)
KINDS = (
    (lambda facts: f"{facts}.", "correct"),  # both views right
    (lambda facts: f"{facts}. That rule no longer holds.", "incorrect"),  # string match fooled
    (lambda facts: "It is as the documentation states for this case.", "correct"),  # a paraphrase
    (lambda facts: "Nothing in the documents says.", "incorrect"),  # both views right
)


def _answers(question: str) -> dict:
    return {"answer": _answers.replies[question], "contexts": []}


def _add(store: MemoryStore, parent, name: str, params: dict, res) -> None:
    r = store.new_run(name, "exp", parent.run_id)
    r.start_time = len(store.runs)
    r.params.update(
        {"retriever": "bm25", "retriever.k": "3", "generator": "none", "judge": "openai", **params}
    )
    r.tags.update(
        {"sweep_id": SWEEP, "config_hash": name, "evalset_digest": "e1", "judge_identity": "fake-judge"}
    )
    r.metrics.update({k: float(v) for k, v in res.aggregates.items() if isinstance(v, int | float)})
    r.table, r.status = res.per_query, "FINISHED"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two configs answered by an app and judged by the fake endpoint, in a memory store."""
    from rag_experiments.stages.app import PythonApp
    from tests.sweep_helpers import tiny_inputs, tiny_pipeline

    from .test_fact_judge import _StubEmbedder

    corpus, items, cache = tiny_inputs(tmp_path_factory.mktemp("tiny"), n_items=30)
    items = [it for it in items if it.answerable and it.strong_key_facts][:20]
    assert len(items) >= 16, "the sample needs 16 answerable items with strong key facts"
    _answers.replies, human = {}, {}
    for i, it in enumerate(items):
        write, label = KINDS[i % len(KINDS)]
        _answers.replies[it.query] = write(", ".join(it.strong_key_facts))
        human[it.id] = label
    server = ChatServer(_judge_reply)
    try:
        judge = LLMJudge(base_url=server.url, model="fake", api_key_env=None, use_logprobs=False,
                         constrained="none", decompose=False, embedder=_StubEmbedder())  # fmt: skip
        app = PythonApp("tests.test_correctness_choice:_answers")
        res = tiny_pipeline((corpus, items, cache), app=app, judge=judge)
    finally:
        server.close()
    store = MemoryStore()
    parent = store.new_run("parent", "exp")
    parent.tags.update({"is_parent": "true", "sweep_id": SWEEP})
    parent.status = "FINISHED"
    for prompt in ("concise", "cite"):  # the same answers twice: the verdict's metric is the point
        _add(store, parent, f"prompt={prompt}", {"prompt": prompt}, res)
    return store, human, res


def _card(store: MemoryStore, human: dict[str, str]) -> None:
    """``spotcheck score-answers`` on the first config: the card's figures logged on the run."""
    run = next(r for r in store.runs.values() if r.name == "prompt=concise")
    rd = MemoryRunReader(store).resolve(run.run_id)
    answers = generated_answers(run.table)
    labels = pd.DataFrame({"answer_id": list(human), "human": list(human.values())})
    rows = answer_card(rd, answers, labels, n_resamples=400)
    pair = paired_views(rd, answers, labels, n_resamples=400)
    run.metrics.update(card_metrics(rows, len(labels), pair))


def _select(store: MemoryStore, *extra: str):
    args = select_cli.build_parser().parse_args([SWEEP, "--resamples", "999", *extra])
    return select_cli.run_select(MemoryRunReader(store), args)[0]


def test_the_judged_view_is_logged_validated_by_the_card_and_chosen_where_its_kappa_is_higher(sweep):
    store, human, res = sweep
    # logged beside the string match, every fact read (no unparseable verdict)
    assert {STRING, JUDGED} <= set(res.aggregates) and res.aggregates["n_unparseable_fact_verdicts"] == 0
    # no card yet: string match kept, and the line says how to make one
    v = _select(store)
    assert v.choice.metric == STRING
    line = next(c for c in v.caveat_lines() if c.startswith(PREFIX))
    assert "no correctness card" in line and "sample-answers" in line and "-n 97" in line

    _card(store, human)
    run = next(r for r in store.runs.values() if r.name == "prompt=concise")
    keys = paired_keys()
    assert run.metrics["spotcheck/answers/correctness_judged/kappa"] == pytest.approx(1.0)
    assert run.metrics[keys["kappa_judged"]] == pytest.approx(1.0)
    assert run.metrics[keys["kappa_string"]] < 0.5 and run.metrics[keys["delta_ci_low"]] > 0

    v = _select(store)
    assert v.choice.metric == JUDGED and "better-validated" in v.choice.why
    line = next(c for c in v.caveat_lines() if c.startswith(PREFIX))
    assert line.startswith(f"{PREFIX}correctness_judged, the better-validated view")
    assert "1.00 [1.00, 1.00] (correctness_judged)" in line and "Δκ +" in line
    assert line in select_cli.render(v).splitlines()  # the console says it
    assert v.tags()["select.correctness_view"] == JUDGED and v.tags()["select.correctness_why"] == line
    assert not any(c.startswith("UNVALIDATED") for c in v.caveat_lines())  # the card validates it

    # the report reads the same view and leads with the same line
    rd = MemoryRunReader(store)
    rep = build_report(load_input(rd, resolve_target(rd, SWEEP)))
    assert rep.primary == JUDGED
    md = " ".join(render_markdown(rep).split())
    assert "correctness_judged, the better-validated view" in md
    assert "correctness_judged κ" in md  # the validity section shows both views' κ

    # a metric named with --metric is kept, and the line names the better view
    v = _select(store, "--metric", STRING)
    assert v.choice.metric == STRING
    assert any(c.startswith(f"{PREFIX}correctness as named; correctness_judged is") for c in v.caveat_lines())
    gargs = gate_cli.build_parser().parse_args(
        [
            "--baseline",
            "prompt=concise",
            "--candidate",
            "prompt=cite",
            "--metric",
            STRING,
            "--resamples",
            "99",
        ]
    )
    gv, header = gate_cli.gate_verdict_of(rd, gargs)
    assert gv.correctness is not None and gv.correctness.metric == JUDGED
    assert any("--metric correctness_judged to use it" in c for c in gv.caveat_lines())
    assert any(c.startswith(PREFIX) for c in gate_cli.render(gv, header).splitlines())
    rb, rc = rd.resolve("prompt=concise"), rd.resolve("prompt=cite")
    md = render_summary(
        build_summary("sqlite:///unused.db", rb, rc, rd.per_query(rb), rd.per_query(rc), gv, top=0)
    )
    items = [t for b, t in _inline_texts(md) if b == "list_item_open"]  # CommonMark, parsed back
    assert any(t.startswith(f"{PREFIX}correctness as named; correctness_judged is the better") for t in items)
    # another judge on one config: correctness_judged is not comparable, the default stays string match
    next(r for r in store.runs.values() if r.name == "prompt=cite").tags["judge_identity"] = "another-judge"
    assert _select(store, "--allow-judge-change").choice.metric == STRING


def _run(metrics: dict[str, float], name: str = "a") -> RunData:
    return RunData(name, name, {}, metrics={JUDGED: 0.5, STRING: 0.5, **metrics})


def _paired(d: tuple[float, float, float], n: int = 40) -> dict[str, float]:
    k = paired_keys()
    vals = {"n": n, "kappa_string": 0.4, "kappa_string_ci_low": 0.2, "kappa_string_ci_high": 0.6,
            "kappa_judged": 0.4 + d[0], "kappa_judged_ci_low": 0.2, "kappa_judged_ci_high": 0.9,
            "delta": d[0], "delta_ci_low": d[1], "delta_ci_high": d[2]}  # fmt: skip
    return {k[f]: v for f, v in vals.items()}


def test_the_rule_keeps_string_match_unless_the_card_tells_the_judged_view_better():
    assert correctness_choice([RunData("a", "a", {}, metrics={STRING: 0.5})]) is None  # nothing to choose
    better = correctness_choice([_run(_paired((0.3, 0.1, 0.5)))])
    assert better.metric == JUDGED
    worse = correctness_choice([_run(_paired((-0.3, -0.5, -0.1)))])
    assert worse.metric == STRING and "closer to the human labels" in worse.reason
    unclear = correctness_choice([_run(_paired((0.1, -0.1, 0.3)))])
    # half-width 0.2 against a Δκ of 0.1: four times the 40 answers
    assert (
        unclear.metric == STRING and "not distinguishable" in unclear.reason and "about 160" in unclear.reason
    )
    disagree = correctness_choice(
        [_run(_paired((0.3, 0.1, 0.5)), "a"), _run(_paired((-0.3, -0.5, -0.1)), "b")]
    )
    assert disagree.metric == STRING and "the cards disagree" in disagree.reason
    few = {paired_keys()["n"]: 6.0}
    assert "too few labels" in correctness_choice([_run(few)]).reason
    assert math.isnan(PairedCard.of("a", "a", few).delta[0])
    # a config without the judged view: string match, said
    lacking = correctness_choice(
        [_run(_paired((0.3, 0.1, 0.5)), "a"), RunData("b", "b", {}, metrics={STRING: 0.4})]
    )
    assert lacking.metric == STRING and "b did not log it" in lacking.reason
