"""Judges: the strict verdict parser, the heuristic judge, the LLM judge on a real llama.cpp server
and on a misbehaving endpoint, and the correctness/faithfulness helpers."""

from __future__ import annotations

import math

import pytest

from rag_experiments.core.types import Verdict
from rag_experiments.judge import (
    LLMJudge,
    correctness,
    faithfulness,
    is_decline,
    key_fact_recall,
    parse_verdict,
    split_claims,
    yes_no_score,
)
from tests import llm_fixtures

# fixtures shared with the other LLM tests (tests/llm_fixtures.py)
fake_llm = llm_fixtures.fake_llm
requires_smollm2 = llm_fixtures.requires_smollm2

# -- parse_verdict ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("Yes.", "supported"),
        ("yes", "supported"),
        (" YES!\n", "supported"),
        ("**Yes**", "supported"),
        ("NO", "unsupported"),
        ("No.", "unsupported"),
        ("supported", "supported"),
        ("Unsupported.", "unsupported"),
        ('{"verdict": "supported"}', "supported"),
        ('{"verdict": "unsupported"}', "unsupported"),
        ('{"supported": true}', "supported"),
        ('{"supported": false}', "unsupported"),
        ('```json\n{"verdict": "unsupported"}\n```', "unsupported"),
        # strict: hedges, prose, empties and garbage are counted as unparseable, never as "no"
        ("yes, but it depends", "unparseable"),
        ("Sure! The answer is yes", "unparseable"),
        ("No, because the context says 24 hours", "unparseable"),
        ("", "unparseable"),
        ("   ", "unparseable"),
        ("maybe", "unparseable"),
        ("yesno", "unparseable"),
        ('{"verdict": "maybe"}', "unparseable"),
        ('{"verdict": "supported", "extra": 1}', "unparseable"),
        ('{"supported": "yes"}', "unparseable"),
        ('{"verdict": ', "unparseable"),
        ("\x00\x01 garbage ###", "unparseable"),
        (None, "unparseable"),
    ],
)
def test_parse_verdict(reply, expected):
    assert parse_verdict(reply) == expected


def test_yes_no_score_sums_variants_and_floors():
    top = [("Yes", math.log(0.3)), (" yes", math.log(0.1)), ("No", math.log(0.2)), ("The", -1.0)]
    assert yes_no_score(top) == pytest.approx(math.log(0.4) - math.log(0.2))
    assert yes_no_score([("no", -0.1)]) == pytest.approx(-20 + 0.1)
    assert yes_no_score([("The", -0.1)]) is None


# -- claims, declines, correctness --------------------------------------------------------------


def test_split_claims_and_declines():
    ans = "Webhooks retry with exponential backoff for 24 hours [1]. Then they are marked failed [1, 2]. Ok."
    assert split_claims(ans) == [
        "Webhooks retry with exponential backoff for 24 hours.",
        "Then they are marked failed.",
    ]
    assert split_claims("I don't know.") == []
    assert split_claims("The documentation does not say how long refunds take.") == []
    quoted = 'Quote: "Refunds are issued within 5 business days." Answer: Refunds take 5 business days [2].'
    assert split_claims(quoted) == [
        "Refunds are issued within 5 business days.",
        "Refunds take 5 business days.",
    ]
    assert is_decline("I don’t know")
    assert is_decline("This is not mentioned in the context.")
    assert not is_decline("Refunds take 5 days.")
    assert not is_decline("")


def test_correctness_and_key_facts():
    assert (
        key_fact_recall(
            "They retry for 24 hours with exponential backoff.", ["24 hours", "exponential backoff"]
        )
        == 1
    )
    assert key_fact_recall("A 24-hour retry window.", ["24 hours", "exponential backoff"]) == 0.5
    assert key_fact_recall("48 hours", ["24 hours"]) == 0.0
    assert key_fact_recall("It costs $1,000.", ["1,000"]) == 1.0
    assert math.isnan(key_fact_recall("x", []))
    assert correctness("I don't know.", ["24 hours"], answerable=False) == 1.0
    assert correctness("Webhooks retry for 24 hours.", ["24 hours"], answerable=False) == 0.0
    assert correctness("I don't know.", ["24 hours"], answerable=True) == 0.0


def test_faithfulness_excludes_unparseable():
    vs = [Verdict("a", "supported"), Verdict("b", "unsupported"), Verdict("c", "unparseable")]
    assert faithfulness(vs) == (0.5, 3, 1)
    score, n, unp = faithfulness([Verdict("c", "unparseable")])
    assert math.isnan(score) and (n, unp) == (1, 1)
    assert math.isnan(faithfulness([])[0])


# -- heuristic judge ----------------------------------------------------------------------------

CONTEXT = (
    "Webhooks are delivered over HTTPS with a signature header. Failed deliveries retry with "
    "exponential backoff for 24 hours before the event is marked failed. You can replay failed "
    "events from the dashboard."
)


@pytest.fixture(scope="module")
def heuristic():
    from rag_experiments.judge.validity import instantiate_judge, judge_config
    from rag_experiments.stages.embedding import metric_embedder

    return instantiate_judge(judge_config("heuristic"), embedder=metric_embedder())


def test_heuristic_numbers_negation_and_relevance(heuristic):
    claims = [
        "Webhooks retry for 48 hours.",
        "Failed webhook deliveries retry with exponential backoff for 24 hours.",
        "Failed webhook deliveries do not retry.",
        "The Enterprise plan includes SAML single sign-on.",
        "Failed deliveries retry with exponential backoff for two days.",
    ]
    labels = [v.label for v in heuristic.verdicts(claims, CONTEXT)]
    assert labels == ["unsupported", "supported", "unsupported", "unsupported", "unsupported"]
    vs = heuristic.verdicts(claims[:1], CONTEXT)
    assert "48" in vs[0].rationale and vs[0].score is not None
    assert heuristic.verdicts([], CONTEXT) == []
    assert heuristic.verdicts(["Webhooks retry for a day."], "")[0].label == "unsupported"
    rel, method = heuristic.answer_relevance("How long do webhooks retry?", "Webhooks retry for 24 hours.")
    off, _ = heuristic.answer_relevance("How long do webhooks retry?", "Our office is in Berlin.")
    assert method == "cosine(answer, query)" and rel > off
    assert heuristic.model is None and "sim_threshold" in heuristic.identity


def test_heuristic_direction_words(heuristic):
    ctx = "Treatment with the drug decreases blood pressure in adults."
    assert heuristic.verdicts(["The drug increases blood pressure in adults."], ctx)[0].label == "unsupported"
    assert heuristic.verdicts(["The drug decreases blood pressure in adults."], ctx)[0].label == "supported"


# -- LLM judge ----------------------------------------------------------------------------------


@requires_smollm2
def test_local_llm_judge_scores_with_logprobs():
    from rag_experiments.judge import LocalLLMJudge
    from rag_experiments.stages.generation import LocalLlamaGenerator

    judge = LocalLLMJudge(max_tokens=32, n_questions=2)
    gen = LocalLlamaGenerator()
    assert judge.client.base_url == gen.base_url  # shares the generator's server
    vs = judge.verdicts(["Webhooks retry for 24 hours.", "Webhooks retry for 48 hours."], CONTEXT)
    for v in vs:
        assert v.label in ("supported", "unsupported") and v.error is None
        assert v.score is not None and v.rationale == "logprob"  # llama.cpp returned logprobs
        assert (v.score >= judge.threshold) == (v.label == "supported")
    claims = judge.split("Webhooks retry for 24 hours. They are then marked failed.")
    assert claims and all(isinstance(c, str) and c for c in claims)
    assert judge.split("I don't know.") == []
    rel, method = judge.answer_relevance("How long do webhooks retry?", "Webhooks retry for 24 hours.")
    assert method == "generated-questions(2)" and (math.isnan(rel) or -1 <= rel <= 1)
    # token usage of every call (docs/metrics.md, "Judge tokens"): the llama.cpp server reports it
    assert judge.last_usage()["prompt_tokens"] >= 10 and judge.last_usage()["completion_tokens"] >= 1
    for v in vs:
        assert v.usage["prompt_tokens"] >= 20 and 1 <= v.usage["completion_tokens"] <= 32
    judge.split("I don't know.")  # a decline has no claims: no call, 0 tokens (not unknown)
    assert judge.last_usage() == {"prompt_tokens": 0, "completion_tokens": 0}


def test_llm_judge_garbage_is_unparseable_not_unsupported(fake_llm):
    judge = LLMJudge(fake_llm.base_url, model="garbage", max_retries=0, backoff_s=0.0, embedder=object())
    vs = judge.verdicts(["Webhooks retry for 24 hours.", "Another claim here."], CONTEXT)
    assert [v.label for v in vs] == ["unparseable", "unparseable"]
    assert vs[0].raw == "banana split"
    # no logprobs, so a constrained retry: both calls' usage (1 + 1 per call on the fake server)
    assert vs[0].usage == {"prompt_tokens": 2, "completion_tokens": 2}
    assert faithfulness(vs)[2] == 2
    # decomposition of an unusable reply falls back to the sentence splitter
    assert judge.split("Webhooks retry for 24 hours. They are then marked failed.") == [
        "Webhooks retry for 24 hours.",
        "They are then marked failed.",
    ]
    assert math.isnan(judge.answer_relevance("q?", "Webhooks retry for 24 hours.")[0])


def test_llm_judge_endpoint_errors_are_unparseable(fake_llm):
    judge = LLMJudge(fake_llm.base_url, model="always503", max_retries=1, backoff_s=0.0)
    v = judge.verdicts(["Webhooks retry for 24 hours."], CONTEXT)[0]
    assert v.label == "unparseable" and "503" in v.error
    assert v.usage is None  # a failed call reported no usage: unknown, never 0
    assert sum(fake_llm.attempts.values()) == 2  # 1 try + 1 retry, then given up
