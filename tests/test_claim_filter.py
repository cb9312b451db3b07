"""Claims that are claims (issue 37): the claim splitter drops code, filler and meta sentences,
questions and bare headings, counted as ``n_nonclaims``; a hedge that asserts is an answer."""

import json
import math
from pathlib import Path

import pytest

from rag_experiments.core.types import EvalItem, Span
from rag_experiments.evaluation.answer_metrics import judge_free_columns, rate_false_answer
from rag_experiments.evaluation.answer_scores import correctness
from rag_experiments.evaluation.declines import answer_sentences, is_decline, n_nonclaims
from rag_experiments.judge.claims import is_claim, split_claims

FIXTURES = Path(__file__).parent / "fixtures"


def _kinds(text: str) -> list[tuple[str, str]]:
    return [(s.kind, s.text) for s in answer_sentences(text)]


def test_code_blocks_and_code_fragments_are_not_claims():
    # the case: a code fragment the heuristic judge scored supported (0.75), and its filler (0.62)
    answer = (
        "Here's an example of how to do this:\n\n```python\nfrom starlette import *\napp = Starlette()\n```\n\n"
        "Routes are matched in order [1].\nfrom starlette.routing import Route\n"
        "`app.add_route(path, endpoint)`\nSet the `PORT` environment variable to choose the port."
    )
    assert _kinds(answer) == [
        ("filler", "Here's an example of how to do this:"),
        ("code", "```python\nfrom starlette import *\napp = Starlette()\n```"),
        ("claim", "Routes are matched in order."),
        ("code", "from starlette.routing import Route"),
        ("code", "app.add_route(path, endpoint)"),  # inline code, fewer than 3 words of prose
        ("claim", "Set the PORT environment variable to choose the port."),  # prose around inline code
    ]
    assert split_claims(answer) == [
        "Routes are matched in order.",
        "Set the PORT environment variable to choose the port.",
    ]
    assert n_nonclaims(answer) == 4


@pytest.mark.parametrize(
    "sentence, kind",
    [
        ("I hope this helps!", "filler"),
        ("Let me know if you have any other questions.", "filler"),
        ("Here is an example request.", "filler"),
        ("The passage provides details about the refunds of a service.", "filler"),  # real SmolLM2, a001
        ("It also discusses how to request money from the website.", "filler"),
        ("The documentation explains that retries last 24 hours.", "claim"),  # "explains that" asserts
        ("The context says the limit is 100 requests per second.", "claim"),
        ("To rotate a key, follow these steps:", "filler"),
        ("So if you want more than 2500 requests, you need another type of key:", "claim"),  # real, asserts
        ("Is that what you were looking for?", "question"),
        ("Question: how does the rate limit applies?", "question"),  # real SmolLM2, a043
        ("x = a[1]", "code"),
        ("curl -X POST https://api.ferrymail.io/v2/messages", "code"),
        ("Webhooks are retried for 24 hours.", "claim"),
        ("Up to 15 attempts", "claim"),
        ("Yes.", "fragment"),
    ],
)
def test_sentence_kinds(sentence, kind):
    assert [s.kind for s in answer_sentences(sentence)] == [kind]


def test_bare_headings_are_not_claims():
    answer = "# Webhook retries\n**Retry policy**\nRetry Policy Details\n- Up to 15 attempts [2]\nBackoff is exponential."
    assert [k for k, _ in _kinds(answer)] == ["heading", "heading", "heading", "claim", "claim"]
    assert split_claims(answer) == ["Up to 15 attempts", "Backoff is exponential."]


def test_is_claim_filters_what_an_llm_lists():
    assert is_claim("Webhooks are retried for 24 hours.")
    assert not is_claim("from starlette import *")
    assert not is_claim("Here's an example of how to do this:")
    assert not is_claim("Is it retried?")


# ------------------------------------------------------------------------------------- hedges

HEDGES = [  # hedge, then assert: answers (typical API-model phrasings)
    "I don't know, but webhooks are retried for 24 hours [1].",
    "Not in the context. Actually, webhooks are retried for 24 hours.",
    "The documentation doesn't mention SQS; however, webhooks can be sent to any HTTPS endpoint [2].",
    "I'm not sure, but I think the maximum payload size is 256 KB.",
    "The context doesn't say — but Canada is planned for next year.",
    "I couldn't find this in the passages. That said, nonprofits get 20% off the Growth plan.",
]
DECLINES = [  # declines wrapped in filler, questions or code: still declines
    "I'm sorry, but I couldn't find that in the documentation. I hope this helps!",
    "The provided context does not specify a phone number. Please contact support for details.",
    "I cannot find information about a Canada region in the passages. Is there anything else I can help with?",
    "There is no mention of a nonprofit discount. Here is what the docs say about plans:",
    "Not specified in the provided context.",
]


@pytest.mark.parametrize("text", HEDGES)
def test_a_hedge_that_asserts_is_an_answer(text):
    assert not is_decline(text)
    assert split_claims(text)  # its claims are judged
    # on an unanswerable item it is a false answer
    assert correctness(text, [], answerable=False) == 0.0
    assert rate_false_answer(text, is_decline(text), answerable=False) == 1.0


@pytest.mark.parametrize("text", DECLINES)
def test_a_decline_among_non_claims_stays_a_decline(text):
    assert is_decline(text)
    assert split_claims(text) == []
    assert correctness(text, [], answerable=False) == 1.0


def test_hedge_splits_into_the_decline_and_its_claim():
    assert _kinds("I don't know, but webhooks are retried for 24 hours [1].") == [
        ("decline", "I don't know"),
        ("claim", "webhooks are retried for 24 hours"),
    ]


def _smollm2(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]


def test_real_smollm2_answers_non_claims_and_declines():
    """The 21 real SmolLM2 answers of the cite fixture: the only decline (a001, 'The answer is "I
    don't know."' followed by four sentences about the passages) stays a decline, since what follows
    is meta, not claims; 12 sentences are dropped as non-claims (4 filler, 3 code, 3 headings,
    2 questions) and 65 kept as claims."""
    rows = _smollm2("smollm2_cite_answers.jsonl")
    declined = {r["id"] for r in rows if is_decline(r["answer"])}
    assert declined == {"a001"}
    kinds = [s.kind for r in rows for s in answer_sentences(r["answer"])]
    assert {k: kinds.count(k) for k in set(kinds)} == {
        "claim": 65, "filler": 4, "code": 3, "heading": 3, "question": 2, "fragment": 3, "decline": 1,
    }  # fmt: skip
    assert sum(n_nonclaims(r["answer"]) for r in rows) == 12


def test_n_nonclaims_is_a_per_query_column():
    it = EvalItem("q", "how long are webhooks retried", [Span("d", 0, 1)], key_facts=["24 hours"])
    answer = "Here's how:\n```\nretry(24)\n```\nWebhooks are retried for 24 hours. Anything else?"
    rows = judge_free_columns([it, it], [answer, None], ["", ""], [[], []], cites=False)
    assert rows[0]["n_nonclaims"] == 3 and rows[1]["n_nonclaims"] == 0
    assert rows[0]["correctness"] == 1.0 and math.isnan(rows[1]["correctness"])


def test_real_smollm2_concise_answers():
    """48 real SmolLM2-135M answers to ``prompt=concise`` on the sample (generation_subset 48,
    packaged model via llama.cpp): none declines, before or after the hedge rule (SmolLM2 hardly
    ever declines), and 15 of their 136 sentences are non-claims (5 filler, 5 headings, 4 code,
    1 question) in 12 answers — the figures docs/metrics.md quotes."""
    rows = _smollm2("smollm2_concise_answers.jsonl")
    assert len(rows) == 48 and not any(r["old_declined"] for r in rows)
    assert not any(is_decline(r["answer"]) for r in rows)
    kinds = [s.kind for r in rows for s in answer_sentences(r["answer"])]
    assert {k: kinds.count(k) for k in set(kinds)} == {
        "claim": 118, "filler": 5, "heading": 5, "code": 4, "question": 1, "fragment": 3,
    }  # fmt: skip
    assert sum(n_nonclaims(r["answer"]) > 0 for r in rows) == 12


def test_kappa_before_and_after_the_claim_filter_on_hand_labels():
    """30 judged claims of those answers (the heuristic judge's verdicts from the run, split by the
    old splitter), labelled supported / unsupported by hand against the context, blind to the judge's
    verdict: every claim the filter drops (10) and 10 + 10 drawn from the kept claims the judge
    called supported / unsupported (``inclusion_prob`` of each stratum). The filter drops exactly
    the 10; κ (unweighted, on the 30) goes from 0.25 to 0.30 — within noise (CIs [0.00, 0.53] and
    [0.00, 0.63]): dropping non-claims removes 3 lenient verdicts, but the judge's main error on
    SmolLM2 is leniency on real claims (7 of the 10 kept claims it called supported are not)."""
    from rag_experiments.judge.agreement import cohen_kappa

    rows = _smollm2("smollm2_claim_labels.jsonl")
    kept = [r for r in rows if is_claim(r["claim"])]
    assert len(rows) == 30 and len(kept) == 20
    assert all(r["human"] == "unsupported" for r in rows if not is_claim(r["claim"]))
    before = cohen_kappa([r["human"] for r in rows], [r["judge"] for r in rows])
    after = cohen_kappa([r["human"] for r in kept], [r["judge"] for r in kept])
    assert round(before, 3) == 0.254 and round(after, 3) == 0.300
