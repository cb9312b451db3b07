"""Claim-level diagnostics (evaluation.diagnostics): hand-computed values, every NaN case, unparseable
verdicts counted, and the real heuristic judge on a small worked example."""

from __future__ import annotations

import math

import pytest

from rag_experiments.core.types import Chunk, EvalItem, Span, Verdict
from rag_experiments.evaluation.diagnostics import (
    DIAGNOSTICS,
    claim_recall,
    classify_answer_claim,
    context_utilization,
    diagnose,
    gold_claims,
    hallucination,
    noise_sensitivity_irrelevant,
    noise_sensitivity_relevant,
    self_knowledge,
)
from rag_experiments.judge import HeuristicJudge, split_claims

S, U, X = "supported", "unsupported", "unparseable"
SHARES = (noise_sensitivity_relevant, noise_sensitivity_irrelevant, hallucination, self_knowledge)


def _v(*labels: str) -> list[Verdict]:
    return [Verdict(f"c{i}", lab) for i, lab in enumerate(labels)]


# -- pure functions ------------------------------------------------------------------------------


def test_claim_recall_excludes_unparseable_and_is_nan_without_a_parseable_verdict():
    assert claim_recall(_v(S, U, S, U)) == 0.5
    assert claim_recall(_v(S, X, U)) == 0.5  # 1 of the 2 parseable, the unparseable is not a "no"
    assert math.isnan(claim_recall(_v(X, X))) and math.isnan(claim_recall([]))


def test_context_utilization_counts_only_covered_gold_claims():
    ctx = _v(S, S, U, S)
    ans = _v(S, U, S, X)  # claim 2 is in the answer but not in the context: not counted
    assert context_utilization(ctx, ans) == 0.5  # covered and parseable: 0, 1 → one entailed
    assert math.isnan(context_utilization(_v(U, U), _v(S, S)))  # context covers nothing


@pytest.mark.parametrize(
    "chunks, relevant, ref, expected",
    [
        ((U, U), (True, False), S, "self_knowledge"),
        ((U, U), (True, False), U, "hallucination"),
        ((S, U), (True, False), U, "noise_relevant"),
        ((U, S), (True, False), U, "noise_irrelevant"),
        ((S, S), (True, False), U, "noise_relevant"),  # a relevant chunk entails it: relevant
        ((U, S), (True, False), S, "grounded_correct"),
        ((), (), U, "hallucination"),  # nothing retrieved
        ((S, X), (True, False), U, None),  # any unparseable verdict: not classified
        ((S, U), (True, False), X, None),
    ],
)
def test_classify_answer_claim(chunks, relevant, ref, expected):
    got = classify_answer_claim(_v(*chunks), relevant, Verdict("c", ref))
    assert got == expected


def test_answer_claim_shares_hand_computed_and_sum_to_one_with_grounded_correct():
    classes = ["hallucination", "grounded_correct", "noise_relevant", "self_knowledge", None]
    got = {f.__name__: f(classes) for f in SHARES}  # 4 classified claims, the None is left out
    assert got == {
        "noise_sensitivity_relevant": 0.25,
        "noise_sensitivity_irrelevant": 0.0,
        "hallucination": 0.25,
        "self_knowledge": 0.25,
    }
    assert sum(got.values()) + 0.25 == 1.0
    assert all(math.isnan(f([None, None])) for f in SHARES)


# -- diagnose: a verdict table stands for the judge (a plain input function, not a mock) ------------

DOC = "Webhooks are retried for 24 hours. Each event gets 15 attempts. The dashboard is blue."
CH_REL = Chunk("d#0", "d", 0, 34, DOC[:34])  # the gold span itself
CH_IRR = Chunk("d#2", "d", 64, len(DOC), DOC[64:])  # "The dashboard is blue."
GOLD = EvalItem(
    "q1",
    "how long are webhooks retried?",
    [Span("d", 0, 34)],
    gold_answer="Webhooks are retried for 24 hours. There are 15 attempts.",
    key_facts=["24 hours"],
)


def _table(entails: dict[tuple[str, str], str], asked: list):
    def verdicts(claims, context):
        asked.append((tuple(claims), context))
        return [Verdict(c, entails.get((c, context), U)) for c in claims]

    return verdicts


def test_diagnose_hand_computed():
    g1, g2 = "Webhooks are retried for 24 hours.", "There are 15 attempts."
    a1, a2, a3 = "Retries last 24 hours.", "The dashboard is blue.", "Retries last 48 hours."
    answer = f"{a1} {a2} {a3}"
    ctx = f"{CH_REL.text}\n\n{CH_IRR.text}"
    ref = GOLD.gold_answer
    table = {
        (g1, ctx): S,  # g2 (15 attempts) is not in the retrieved context
        (g1, answer): S,
        (a1, CH_REL.text): S,
        (a1, ref): S,  # a1: grounded and correct
        (a2, CH_IRR.text): S,  # a2: incorrect, only an irrelevant chunk entails it
        # a3: entailed by no chunk and incorrect: hallucination
    }
    asked: list = []
    d = diagnose(GOLD, answer, [a1, a2, a3], [g1, g2], [CH_REL, CH_IRR], _table(table, asked), False)
    assert d.values == {
        "claim_recall": 0.5,
        "context_utilization": 1.0,
        "noise_sensitivity_relevant": 0.0,
        "noise_sensitivity_irrelevant": pytest.approx(1 / 3),
        "hallucination": pytest.approx(1 / 3),
        "self_knowledge": 0.0,
    }
    assert d.answer_classes == ["grounded_correct", "noise_irrelevant", "hallucination"]
    assert d.reasons == {} and d.n_unparseable == 0
    # calls: gold vs context, covered gold vs answer, answer vs reference, answer vs each chunk
    assert [len(c) for c, _ in asked] == [2, 1, 3, 3, 3]


def test_diagnose_nan_cases_have_reasons():
    unans = EvalItem("q2", "what colour is the logo?", [], gold_answer="")
    d = diagnose(unans, "It is red.", ["It is red."], [], [CH_IRR], _table({}, []), False)
    assert all(math.isnan(d.values[m]) for m in DIAGNOSTICS)
    assert set(d.reasons.values()) == {"unanswerable item"} and set(d.reasons) == set(DIAGNOSTICS)

    # a decline: utilisation 0 (the context had the claim), no answer-claim metric, no call on it
    asked: list = []
    g1 = "Webhooks are retried for 24 hours."
    ctx = f"{CH_REL.text}"
    d = diagnose(GOLD, "I don't know.", [], [g1], [CH_REL], _table({(g1, ctx): S}, asked), True)
    assert d.values["claim_recall"] == 1.0 and d.values["context_utilization"] == 0.0
    assert all(math.isnan(d.values[m]) for m in DIAGNOSTICS[2:])
    assert d.reasons["hallucination"] == "declining answer" and len(asked) == 1

    # the context covers no gold claim: utilisation undefined, not 0
    d = diagnose(GOLD, "Blue.", [], [g1], [CH_IRR], _table({}, []), False)
    assert d.values["claim_recall"] == 0.0 and math.isnan(d.values["context_utilization"])
    assert d.reasons["context_utilization"] == "context covers no gold claim"


def test_diagnose_counts_unparseable_verdicts_and_never_reads_them_as_no():
    def garbled(claims, context):
        return [Verdict(c, X) for c in claims]

    d = diagnose(GOLD, "Retries last 24 hours.", ["Retries last 24 hours."], ["g"], [CH_REL], garbled, False)
    assert all(math.isnan(d.values[m]) for m in DIAGNOSTICS)
    assert d.reasons["claim_recall"] == "every verdict unparseable"
    assert d.reasons["hallucination"] == "every answer claim has an unparseable verdict"
    assert d.n_unparseable == 1 + 1 + 1  # gold vs context, answer claim vs reference, vs the chunk


def test_gold_claims_prefer_the_gold_answer_and_fall_back_to_key_facts():
    assert gold_claims(GOLD, split_claims) == [
        "Webhooks are retried for 24 hours.",
        "There are 15 attempts.",
    ]
    no_answer = EvalItem("q3", "q", [Span("d", 0, 5)], gold_answer=None, key_facts=["24 hours", " "])
    assert gold_claims(no_answer, split_claims) == ["24 hours"]


# -- the real heuristic judge (MiniLM) -------------------------------------------------------------


def test_heuristic_judge_worked_example():
    judge = HeuristicJudge()
    answer = "Webhooks are retried for 24 hours. Webhooks are retried for 48 hours."
    claims = judge.split(answer)
    d = diagnose(
        GOLD,
        answer,
        claims,
        gold_claims(GOLD, judge.split),
        [CH_REL, CH_IRR],
        judge.verdicts,
        declined=False,
    )
    # gold: "retried for 24 hours" is in the context, "15 attempts" is not (it sits in no chunk)
    assert d.values["claim_recall"] == 0.5
    assert d.values["context_utilization"] == 1.0
    # the 24-hour claim is grounded and correct; the 48-hour one contradicts context and gold
    assert d.answer_classes == ["grounded_correct", "hallucination"]
    assert d.values["hallucination"] == 0.5 and d.values["self_knowledge"] == 0.0
