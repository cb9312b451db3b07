"""Key-fact correctness read by a judge model (issue 45, item 2): each reference fact judged
supported / contradicted / absent through the endpoint client, a strict parser (unparseable
replies counted, never read as absent), cached, logged as ``correctness_judged`` beside the
string-match ``correctness``."""

from __future__ import annotations

import math

import pytest

from rag_experiments.evaluation.fact_scores import correctness_judged, reference_facts
from rag_experiments.judge.llm import FACT_SYSTEM, LLMJudge, parse_fact_verdict
from tests.llm_fixtures import ChatServer


@pytest.mark.parametrize(
    ("reply", "label"),
    [("supported", "supported"), ("Contradicted.", "contradicted"), ("**absent**", "absent"),
     ('{"verdict": "absent"}', "absent"), ("```json\n{\"verdict\": \"supported\"}\n```", "supported"),
     ("Supported, mostly", "unparseable"), ("yes", "unparseable"), ("", "unparseable"),
     ('{"verdict": "maybe"}', "unparseable"), ('{"verdict": "absent", "why": "x"}', "unparseable")],
)  # fmt: skip
def test_a_fact_verdict_is_read_strictly(reply, label):
    assert parse_fact_verdict(reply) == label


def test_correctness_judged_counts_what_was_read():
    assert correctness_judged(["supported", "contradicted", "absent", "unparseable"], True, False) == 1 / 3
    assert math.isnan(correctness_judged(["unparseable"], True, False))  # nothing read: NaN, not 0
    assert correctness_judged([], False, True) == 1.0 and correctness_judged([], False, False) == 0.0
    assert reference_facts([" ", "24 hours"], "ref") == ["24 hours"] and reference_facts([], " ref ") == ["ref"]


def _judge_reply(body: dict) -> str:
    """The fake judge: a fact is contradicted when the answer says "never", unparseable when it
    says "maybe", supported otherwise; claim verdicts yes; relevance questions."""
    system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
    user = body["messages"][-1]["content"]
    if system == FACT_SYSTEM:
        answer = user.split("<answer>")[-1]
        return "contradicted" if "never" in answer else "it depends" if "maybe" in answer else "supported"
    if "questions" in user.lower():
        return "How long are webhooks retried?\nWhat is the retry policy?"
    return "yes"


def _answers(question: str) -> dict:
    """An app answering from a fixed list (no model): right, contradicting, unparseable to the judge."""
    return {"answer": _answers.replies[question], "contexts": []}


def test_correctness_judged_is_logged_cached_and_counts_unparseable_replies(tmp_path):
    from rag_experiments.stages.app import PythonApp
    from tests.sweep_helpers import tiny_inputs, tiny_pipeline

    corpus, items, cache = tiny_inputs(tmp_path, n_items=4)
    answerable = [it for it in items if it.answerable][:3]
    _answers.replies = {it.query: f"{' '.join(it.strong_key_facts) or it.gold_answer}. {tail}"
                        for it, tail in zip(answerable, ("Yes.", "It is never so.", "maybe"), strict=True)}  # fmt: skip
    _answers.replies.update({it.query: "I don't know." for it in items if not it.answerable})
    items = [*answerable, *[it for it in items if not it.answerable]]
    server = ChatServer(_judge_reply)
    try:
        judge = LLMJudge(base_url=server.url, model="fake", api_key_env=None, use_logprobs=False,
                         constrained="none", decompose=False, embedder=_StubEmbedder())  # fmt: skip
        app = PythonApp("tests.test_fact_judge:_answers")
        res = tiny_pipeline((corpus, items, cache), app=app, judge=judge)
        df = res.per_query.set_index("id")
        got = [df.loc[it.id, "correctness_judged"] for it in answerable]
        assert got[0] == 1.0 and got[1] == 0.0 and math.isnan(got[2])  # right, contradicted, unread
        unanswerable = [it.id for it in items if not it.answerable]
        assert all(df.loc[i, "correctness_judged"] == 1.0 for i in unanswerable)  # declined
        assert res.aggregates["n_unparseable_fact_verdicts"] == len(answerable[2].strong_key_facts or [1])
        assert "correctness_judged" in res.aggregates and res.calls["judge_facts"] > 0
        calls = server.calls
        again = tiny_pipeline((corpus, items, cache), app=app, judge=judge)
        assert again.calls.get("judge_facts", 0) == 0 and server.calls == calls  # all from the cache
    finally:
        server.close()


class _StubEmbedder:
    """Answer relevance's metric embedder, without MiniLM (its value is not what this tests)."""

    identity = "stub"

    def encode(self, texts, kind="query"):
        import numpy as np

        return np.ones((len(texts), 4), dtype=np.float32) / 2.0
