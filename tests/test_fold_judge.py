"""The folded LLM judge (issue 45, item 6): ``judge.fold=true`` asks an answer's claims and their
verdicts in one constrained JSON call, read strictly (docs/judges.md, "Folded judging"). Against a
fake endpoint that answers both protocols from one rule, it makes 2 judge calls per answer (the
folded call and relevance) instead of 1 + claims + 1, with the same verdicts and faithfulness; an
unreadable claim is counted, an unreadable reply fails the answer's judging and is asked again."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest

from rag_experiments.core.identity import semantic_config
from rag_experiments.judge.claims import parse_folded
from rag_experiments.judge.llm import LLMJudge
from tests.http_fakes import FakeHTTP, Request, completion, judge_text
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

C1, C2 = "Webhooks are retried for three days.", "Each retry carries the same event id."


@pytest.mark.parametrize(
    ("reply", "read"),
    [(json.dumps({"claims": [{"claim": C1, "supported": "yes"}, {"claim": C2, "supported": "No"}]}),
      [(C1, "supported"), (C2, "unsupported")]),
     ("```json\n" + json.dumps({"claims": [{"claim": C1, "supported": True}]}) + "\n```", [(C1, "supported")]),
     (json.dumps({"claims": [{"claim": C1, "supported": "maybe"}, {"claim": C2, "supported": "yes", "why": "x"}]}),
      [(C1, "unparseable"), (C2, "unparseable")]),  # a hedge, an extra key: counted, never "no"
     (json.dumps({"claims": [{"supported": "yes"}, {"claim": "Hi.", "supported": "yes"}]}),
      [('{"supported": "yes"}', "unparseable")]),  # no claim text: counted; a fragment: dropped
     (json.dumps({"claims": []}), []),
     ("yes", None), ("", None), ('{"claims": "all"}', None), ('{"claims": [], "note": 1}', None), ("[1]", None)],
)  # fmt: skip
def test_a_folded_reply_is_read_strictly(reply, read):
    assert parse_folded(reply) == read


def test_fold_changes_the_identity_only_when_set():
    kw = {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": None}
    assert "fold" not in json.loads(LLMJudge(**kw).identity)
    assert LLMJudge(**kw, fold=False).identity == LLMJudge(**kw).identity != LLMJudge(**kw, fold=True).identity
    assert semantic_config({"judge": {"fold": False, "model": "m"}}) == semantic_config({"judge": {"model": "m"}})
    with pytest.raises(ValueError, match="judge.fold=true needs judge.decompose=true"):
        LLMJudge(**kw, fold=True, decompose=False)


def test_fold_without_decompose_is_refused_naming_the_key():
    from tests.test_endpoint_settings import _validate

    problems = _validate("judge=local", "judge.fold=true", "judge.decompose=false")
    assert "conf/judge: fold: needs judge.decompose=true: the folded call lists the answer's claims (got True)" in problems
    assert not _validate("judge=openai", "judge.base_url=http://127.0.0.1:9/v1", "judge.fold=true")


def _word(claim: str, context: str) -> str:
    """The fake judge's rule: "never" is not supported, "maybe" unreadable, "broken" makes the folded
    reply unreadable, anything else supported."""
    return "no" if "never" in claim else "perhaps" if "maybe" in claim else "garble" if "broken" in claim else "yes"


def _answers(question: str) -> dict:
    return {"answer": _answers.replies[question], "contexts": []}


REPLIES = [f"{C1} {C2}", "Refunds are never paid back to the card. Refunds take five business days.",
           "Exports are maybe limited to ten files. Exports run every night at midnight.", "I don't know."]  # fmt: skip


def _run(tmp_path, fold: bool, replies=REPLIES):
    from rag_experiments.stages.app import PythonApp
    from tests.sweep_helpers import tiny_inputs, tiny_pipeline

    corpus, items, cache = tiny_inputs(tmp_path, n_items=len(replies))
    # no reference: the answers' own judging alone (no diagnostics, no key facts: their calls are not folded)
    inputs = (corpus, [dataclasses.replace(it, gold_answer=None, gold_answers=[], key_facts=[]) for it in items], cache)
    _answers.replies = {it.query: r for it, r in zip(inputs[1], replies, strict=True)}
    with FakeHTTP(lambda r: completion(judge_text(r.body, _word))) as ep:
        judge = LLMJudge(base_url=ep.url, model="fake", api_key_env=None, use_logprobs=False, constrained="none",
                         fold=fold, embedder=_StubEmbedder())  # fmt: skip
        res = tiny_pipeline(inputs, app=PythonApp("tests.test_fold_judge:_answers"), judge=judge)
        sent = {k: _count(ep, k) for k in (DECOMPOSE, VERDICT, FOLDED, QUESTIONS)}
        again = tiny_pipeline(inputs, app=PythonApp("tests.test_fold_judge:_answers"), judge=judge)
    return res, again, sent


def test_folded_judging_takes_two_calls_per_answer_with_the_unfolded_verdicts(tmp_path):
    flat, _, flat_sent = _run(tmp_path / "flat", fold=False)
    folded, again, sent = _run(tmp_path / "folded", fold=True)
    # 3 answers with 2 claims each, then a decline (no claim: only its relevance call)
    assert flat_sent == {DECOMPOSE: 3, VERDICT: 6, FOLDED: 0, QUESTIONS: 4}
    assert sent == {DECOMPOSE: 0, VERDICT: 0, FOLDED: 3, QUESTIONS: 4}  # 2 calls per answer with claims, was 4
    assert "judge_claims" not in folded.calls and "judge_verdicts" not in folded.calls
    a, b = flat.per_query.set_index("id"), folded.per_query.set_index("id")
    pairs = lambda df, i: [(v["claim"], v["label"]) for v in df.loc[i, "verdicts"]]  # noqa: E731
    for i in a.index:
        assert pairs(a, i) == pairs(b, i)
        assert a.loc[i, "n_unparseable"] == b.loc[i, "n_unparseable"]
        fa, fb = a.loc[i, "faithfulness"], b.loc[i, "faithfulness"]
        assert (math.isnan(fa) and math.isnan(fb)) or fa == fb
    assert sorted(b["n_unparseable"]) == [0, 0, 0, 1] and sorted(b["n_judge_errors"]) == [0, 0, 0, 0]
    assert {"supported", "unsupported", "unparseable"} <= {v["label"] for vs in b["verdicts"] for v in vs}
    assert again.calls.get("judge_folded", 0) == 0  # cached per (judge, answer, context)


def test_an_unreadable_folded_reply_fails_the_answer_and_is_asked_again(tmp_path):
    replies = [REPLIES[0], "Exports are broken on Sundays. Exports run every night at midnight."]
    res, again, _ = _run(tmp_path, fold=True, replies=replies)
    df = res.per_query.set_index("id")
    bad = df[df["n_judge_errors"] > 0]
    assert len(bad) == 1 and math.isnan(bad["faithfulness"].iloc[0]) and bad["n_claims"].iloc[0] == 0
    assert res.calls["judge_folded_unread"] == 1 and res.calls["judge_errors"] == 1
    step = res.records["judge"]
    assert step.failed == 1 and "judge.fold" in step.first_error
    assert again.calls["judge_folded"] == 1 and again.calls["judge_folded_unread"] == 1  # not cached


def test_the_card_of_a_folded_judge_asks_the_folded_call_and_counts_resplit_claims(tmp_path):
    from rag_experiments.core.cache import StageCache
    from rag_experiments.evalset.judge_pairs import JudgePair
    from rag_experiments.judge.validity import validity_card

    def claims_of(answer: str) -> list[str]:  # a judge that splits "and" claims in two
        return [p.strip().rstrip(".") + "." for p in answer.split(" and ")] if " and " in answer else [answer]

    ctx = "Webhooks are retried for three days. Each retry carries the same event id."
    pairs = [JudgePair("a", C1, ctx, "supported", group="a"), JudgePair("b", "Webhooks are never retried.", ctx, "unsupported", group="b"),
             JudgePair("c", "Webhooks are retried for three days and refunds are never paid.", ctx, "unsupported", group="c"),
             JudgePair("d", C2, ctx, "supported", group="d")]  # fmt: skip
    with FakeHTTP(lambda r: completion(judge_text(r.body, _word, claims_of))) as ep:
        judge = LLMJudge(base_url=ep.url, model="fake", api_key_env=None, use_logprobs=False, constrained="none", fold=True)
        card = validity_card(judge, pairs, StageCache(tmp_path / "cache"), n_resamples=50, progress=False)
        assert _count(ep, FOLDED) == 4 and _count(ep, VERDICT) == 0
        flat = LLMJudge(base_url=ep.url, model="fake", api_key_env=None, use_logprobs=False, constrained="none")
        unfolded = validity_card(flat, pairs, StageCache(tmp_path / "cache"), n_resamples=50, progress=False)
        assert _count(ep, VERDICT) == 4
    assert card["accuracy"]["value"] == 1.0 and card["n_resplit"] == 1  # c: a "yes" and a "no" part: unsupported
    assert "n_resplit" not in unfolded and unfolded["accuracy"]["value"] == 1.0


DECOMPOSE, VERDICT, FOLDED = "Break the answer below", "Is the claim supported", "List the answer's claims, each with"
QUESTIONS = "different questions"
ANSWER = "Failed webhook deliveries are retried with exponential backoff for three days."


def _count(ep: FakeHTTP, *needles: str) -> int:
    return sum(all(n in json.dumps(r.body) for n in needles) for _, r in ep.requests)


def _model(r: Request) -> dict:
    """Answers one sentence; as a judge, :func:`judge_text` with every claim supported."""
    text = json.dumps(r.body)
    if any(n in text for n in (DECOMPOSE, VERDICT, FOLDED, QUESTIONS, "reference fact")):
        return completion(judge_text(r.body, lambda claim, context: "yes"))
    return completion(ANSWER)


def test_the_dry_run_counts_the_folded_calls_a_real_run_makes(tmp_path):
    """judge.fold=true through the sweep: the dry run's count is what the real run then sends, and
    the answers' own judging is 2 calls each (the folded call and relevance)."""
    docs, ev = make_tiny(tmp_path, n_items=4)
    with FakeHTTP(_model) as ep:
        args = [*sweep_args(tmp_path, docs, ev), "generator=openai", f"generator.base_url={ep.url}", "generator.model=m",
                "generator.api_key_env=null", "retriever=bm25", "generation_subset=3", "judge_card.enabled=false",
                "metrics.bootstrap_resamples=100"]  # fmt: skip
        judge = ["judge=openai", f"judge.base_url={ep.url}", "judge.model=m", "judge.api_key_env=null",
                 "judge.use_logprobs=false", "judge.constrained=none", "judge.fold=true"]  # fmt: skip
        run_sweep(tmp_path, *args, "judge=none")  # the answers, cached
        assert ep.count() == 3
        dry = run_sweep(tmp_path, *args, *judge, "dry_run=true")
        assert ep.count() == 3, dry.stdout
        total = int(re.search(r"^total: (\d+) calls", dry.stdout, re.M).group(1))
        before = len(ep.requests)
        run_sweep(tmp_path, *args, *judge)
        assert len(ep.requests) - before == total, dry.stdout
        # the generated answers' judging: the folded call and relevance (the claim-level diagnostics
        # still split the gold answers and ask per claim: not folded)
        assert _count(ep, DECOMPOSE, ANSWER) == 0 and _count(ep, FOLDED, ANSWER) == 3 and _count(ep, QUESTIONS) == 3


class _StubEmbedder:
    """Answer relevance's metric embedder, without MiniLM (its value is not what this tests)."""

    identity = "stub"

    def encode(self, texts, kind="query"):
        import numpy as np

        return np.ones((len(texts), 4), dtype=np.float32) / 2.0
