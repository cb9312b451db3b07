"""The fault matrix (docs/reliability.md): every remote step against the same misbehaving endpoint.

Rows are the steps that call out (generate, judge, MLflow's judge, query transform, history rewrite,
rerank API, LLM reranker, an HTTP app, the embeddings API, and ``answer_slot``: an answer-side slot
added by the recipe in the tests alone, ``tests/answer_slot.py``); a new remote step adds a row to
``STEPS``, never tests of its own. Columns are the ways an endpoint misbehaves, plus an app's (a bare-string
``contexts``, wrong types, a huge answer, a secret in it) and the embeddings' after the startup
probe (wrong or mixed sizes, short ``data``, a reply over the size cap, another model, a budget
stop). The ``app=python`` row (``test_python_app_cell``) runs the user's code's own faults: raise,
``sys.exit``, its own ``KeyboardInterrupt``/``GeneratorExit``, wrong types, a bare string, some
failing, huge, a secret. The fakes are ``tests/http_fakes.py``'s.
Every cell asserts the same rule, the one ``run.steps`` derives for every step:

- the step fails on every item → the run fails, naming the step (``failure_reason``);
- it fails on some → the run finishes with the count, and the same run again redoes exactly those
  (failures are never cached);
- a 429's ``Retry-After`` is honoured and nothing is lost;
- Ctrl-C/SIGTERM stops it within seconds and no request leaves after the signal;
- the API key is nowhere in what the run keeps.

Two more columns for every row, ``app=python`` included (``ROWS``): a dry run
(``test_dry_run_column``: no model request reaches the fakes, the step's calls are counted and
printed) and a budget (``test_budget_column``: stopped at ``budget.max_calls`` with the budget's
reason; the same command resumes and finishes, no call made twice).

The CLI's exit code and MLflow status for such a run are checked end to end by
``test_dead_reranker_and_transform_fail_the_cli_run`` (slow tier).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rag_experiments.core.cache import CachedEmbedder
from rag_experiments.core.steps import StepFailed
from rag_experiments.judge.llm import LLMJudge
from rag_experiments.run.steps import failure_reason
from rag_experiments.stages import call_budget
from rag_experiments.stages.api_embedding import _PROBES, MODEL_CHANGED, OpenAIEmbedder
from rag_experiments.stages.app import APP_ANSWER_CAP, HttpApp, PythonApp
from rag_experiments.stages.endpoint import MAX_REPLY_BYTES
from rag_experiments.stages.generation import OpenAICompatibleGenerator
from rag_experiments.stages.history import HistoryRewrite
from rag_experiments.stages.query import RewriteQuery
from rag_experiments.stages.rerank import EndpointReranker, LLMReranker
from rag_experiments.stages.retrieval import DenseRetriever
from rag_experiments.tracking.mlflow_judge import MLflowJudge
from tests.answer_slot import Polish
from tests.answer_slot import register as register_answer_slot
from tests.http_fakes import FakeHTTP, Reply, Request, embeddings
from tests.llm_fixtures import ChatServer, _completion
from tests.sweep_helpers import REPO, tiny_inputs, tiny_pipeline

KEY_ENV, KEY = "RAG_MATRIX_KEY", "sk-matrix-DoNotStore-5e4d3c2b1a09f8e7"
FAST = dict(timeout_s=1.0, max_retries=1, backoff_s=0.01)
RATELIMITED = 3


class MisbehavingEndpoint:
    """One OpenAI-compatible endpoint (``/chat/completions``, ``/rerank``, ``/embeddings`` and an
    app's ``/ask``; a handler of ``tests.http_fakes.FakeHTTP``) that misbehaves as ``mode`` says:
    ok · http500 · http400 · malformed (200, not JSON) · empty (200, nothing in it) · nan (200 whose
    number is NaN) · trickle (a body one byte every 0.3 s) · ratelimit (429 with ``Retry-After: 1``
    on the first attempt of up to ``RATELIMITED`` requests) · half (500 forever on every request
    that names one of the questions ``bad``) · echokey (401 repeating the key) · hang (accepts,
    never answers). An app's modes (``/ask``): barecontexts (``contexts`` a bare string) ·
    wrongtypes (an answer that is a number) · hugeanswer (an answer of ``HUGE`` characters) ·
    leakanswer (an answer repeating the key it was sent and an ``sk-…`` token). The embeddings'
    modes: wrongdim (4-d vectors after 3-d probes) · mixeddim (one vector 4-d) · short (one vector
    fewer) · oversize (a body over the client's size cap) · swap (another model: other vectors).
    ``arrivals`` lists (time.monotonic, request hash) of every request."""

    HUGE = 200_000

    def __init__(self, good_chat: str, bad: tuple[str, ...] = ()) -> None:
        self.mode, self.arrivals, self.seen, self.limited = "ok", [], {}, 0
        self.bad = [json.dumps(q)[1:-1].encode() for q in bad]  # half: requests naming these fail
        self.http = FakeHTTP(self.reply)
        self.url = self.http.url
        self.good_chat, self.app_context = good_chat, ""

    def good(self, path: str, body: dict, nan: bool = False, auth: str = "") -> bytes:
        mode = self.mode
        if path.endswith("/embeddings"):  # a vector per input: its length and letters, normalised later
            def vector(t: str) -> list[float]:
                v = [len(t) + 1.0, float(t.count("e")) + 1, 1.0]
                return [v[1], v[0], 2.0] if mode == "swap" else v + [1.0] if mode == "wrongdim" else v

            out = embeddings(body.get("input", []), vector)
            if mode == "mixeddim" and out["data"]:
                out["data"][0]["embedding"].append(1.0)
            if mode == "short":
                out["data"] = out["data"][:-1]
            if mode == "oversize":
                out["padding"] = "x" * (MAX_REPLY_BYTES + 1)
            return (json.dumps(out).replace("1.0]", "NaN]") if nan else json.dumps(out)).encode()
        if path.endswith("/ask"):  # an application: an answer and a passage of the first document
            answer: Any = self.good_chat
            contexts: Any = [{"text": self.app_context}]
            if mode == "barecontexts":
                contexts = self.app_context
            elif mode == "wrongtypes":
                answer = 42
            elif mode == "hugeanswer":
                answer = "x" * self.HUGE
            elif mode == "leakanswer":
                answer = f"{self.good_chat} {auth} sk-live0123456789abcdefXYZ"
            return json.dumps({"answer": answer, "contexts": contexts}).encode()
        if path.endswith("/rerank"):
            docs = body.get("documents", [])
            score = "NaN" if nan else None
            rows = [{"index": i, "relevance_score": score or 1.0 / (i + 1)} for i in range(len(docs))]
            return json.dumps({"results": rows}).replace('"NaN"', "NaN").encode()
        return json.dumps(_completion("NaN" if nan else self.good_chat, body.get("model", "m"))).encode()

    def reply(self, r: Request) -> Reply:
        mode, raw = self.mode, r.raw
        digest = hashlib.sha256(raw).hexdigest()
        self.arrivals.append((time.monotonic(), digest))
        self.seen[digest] = self.seen.get(digest, 0) + 1
        if mode == "hang":
            return Reply(hang_s=30)
        if mode == "http500" or (mode == "half" and any(b in raw for b in self.bad)):
            return Reply(500, b'{"error": {"message": "boom"}}')
        if mode == "http400":
            return Reply(400, b'{"error": {"message": "bad request"}}')
        if mode == "malformed":
            return Reply(200, b'{"choices": [ not json')
        if mode == "empty":
            return Reply(200, b"{}")
        auth = r.headers.get("Authorization", "")
        if mode == "echokey":
            return Reply(401, json.dumps({"error": {"message": f"bad key {auth}"}}).encode())
        # RATELIMITED requests at most: each costs a 1 s wait, and a judge makes many
        if mode == "ratelimit" and self.seen[digest] == 1 and self.limited < RATELIMITED:
            self.limited += 1
            return Reply(429, b"{}", {"Retry-After": "1"})
        out = self.good(r.path, r.body, nan=mode == "nan", auth=auth)
        return Reply(200, out, trickle_s=0.3 if mode == "trickle" else 0.0)

    def close(self) -> None:
        self.http.close()


@dataclass(frozen=True)
class Row:
    """A remote step: how to build a run whose ``slot`` calls ``url`` (everything else healthy)."""

    name: str
    slot: str
    good_chat: str  # what the endpoint answers a chat request with when it behaves
    numeric: bool = False  # its reply is a number: a NaN is an error
    # the corpus's embeddings: a missing vector cannot be left out of an index, so any failure
    # (all or part of the items) fails the run with an error naming the endpoint
    whole: bool = False
    turns: bool = False  # its items are conversation turns (each with a history)

    def inputs(self, inputs):
        """The tiny inputs, each item a second turn when the step reads the history."""
        if not self.turns:
            return inputs
        history = [{"role": "user", "text": "Tell me about webhooks."}, {"role": "assistant", "text": "They notify you."}]
        return inputs[0], [dataclasses.replace(it, history=history, turn=2) for it in inputs[1]], inputs[2]

    def stages(self, url: str, healthy: str, timeout_s: float = FAST["timeout_s"]) -> dict[str, Any]:
        prompt = instantiate(OmegaConf.load(REPO / "rag_experiments" / "conf" / "prompt" / "concise.yaml"))
        fast = dict(FAST, timeout_s=timeout_s)
        gen = lambda u: OpenAICompatibleGenerator(u, "m", api_key_env=KEY_ENV, concurrency=2, **fast)  # noqa: E731
        if self.name == "generate":
            return {"generator": gen(url), "prompt": prompt}
        if self.name == "judge":
            judge = LLMJudge(url, "m", api_key_env=KEY_ENV, use_logprobs=False, constrained="none",
                             decompose=False, n_questions=1, concurrency=2, **fast)  # fmt: skip
            return {"generator": gen(healthy), "prompt": prompt, "judge": judge}
        if self.name == "mlflow_judge":  # MLflow's judges; their requests sent by our client (a shim)
            judge = MLflowJudge(url, "m", api_key_env=KEY_ENV, num_retries=FAST["max_retries"], timeout_s=timeout_s,
                                concurrency=2)  # fmt: skip
            return {"generator": gen(healthy), "prompt": prompt, "judge": judge}
        if self.name == "query":
            return {"query_transform": RewriteQuery(gen(url))}
        if self.name == "history":
            return {"history": HistoryRewrite(gen(url))}
        if self.name == "rerank_endpoint":
            return {"reranker": EndpointReranker(url, "m", candidates=4, api_key_env=KEY_ENV, **fast)}
        if self.name == "rerank_llm":
            return {"reranker": LLMReranker(url, "m", candidates=3, api_key_env=KEY_ENV, concurrency=2, **fast)}
        if self.name == "http_app":
            return {"app": HttpApp(url + "/ask", api_key_env=KEY_ENV, concurrency=2, **fast)}
        if self.name == "python_app":  # the user's code in process: no call of ours
            return {"app": PythonApp("tests.app_fixture:quick")}
        if self.name == "answer_slot":  # a slot of the tests alone (tests/answer_slot.py), in Stages.extra
            return {"generator": gen(healthy), "prompt": prompt, "extra": {"polisher": Polish(gen(url))}}
        raise KeyError(self.name)  # embeddings: built by _embedder, while the endpoint still answers


STEPS = (
    Row("generate", "generator", "Webhooks are retried for 24 hours."),
    Row("judge", "judge", "yes"),
    Row("mlflow_judge", "judge", json.dumps({"rationale": "the context says so", "result": "yes"})),
    Row("query", "query_transform", "webhook retry schedule"),
    Row("history", "history", "webhook retry schedule", turns=True),
    Row("rerank_endpoint", "reranker", "", numeric=True),
    Row("rerank_llm", "reranker", "7", numeric=True),
    Row("http_app", "app", "Webhooks are retried for 24 hours."),
    Row("embeddings", "retriever", "", numeric=True, whole=True),
    Row("answer_slot", "polisher", "Webhooks are retried for 24 hours [1]. (polished)"),
)
ALL_FAIL = ("dead", "http500", "http400", "malformed", "empty", "trickle", "echokey")
APP_FAIL = ("barecontexts", "wrongtypes")  # an app's reply of the wrong shape: that question's error
APP_MODES = (*APP_FAIL, "hugeanswer", "leakanswer")
EMBED_FAIL = ("wrongdim", "mixeddim", "short", "oversize", "swap", "budget")  # after the startup probe
CELLS = [(r, m) for r in STEPS for m in (*ALL_FAIL, "nan", "ratelimit", "half") if m != "nan" or r.numeric]
CELLS += [(r, m) for r in STEPS if r.slot == "app" for m in APP_MODES]
CELLS += [(r, m) for r in STEPS if r.whole for m in EMBED_FAIL]


@pytest.fixture
def world(tmp_path, monkeypatch):
    """(the tiny inputs, a healthy generator endpoint whose answer names the item's question, so
    that a judge's requests about it name it too)."""
    monkeypatch.setenv(KEY_ENV, KEY)
    register_answer_slot(monkeypatch)  # the answer_slot row's slot, declared for this test only
    inputs = tiny_inputs(tmp_path, n_items=4)
    queries = [it.query for it in inputs[1]]

    def answer(body: dict) -> str:
        prompt = "\n".join(m.get("content", "") for m in body["messages"])
        asked = next((q for q in queries if q in prompt), "")
        return f"Webhooks are retried for 24 hours [1]. You asked: {asked}"

    healthy = ChatServer(answer)
    yield inputs, healthy
    healthy.close()


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # closed once the with block ends


def _cell(r: Row, m: str):
    """A trickling body waits out every attempt's deadline (up to a minute for the judge's many
    calls): those cells run in the full suite, not the fast tier."""
    return pytest.param(r, m, id=f"{r.name}-{m}", marks=[pytest.mark.slow] if m == "trickle" else [])


@pytest.mark.parametrize(("row", "mode"), [_cell(r, m) for r, m in CELLS])
def test_cell(world, row: Row, mode: str):
    inputs, healthy = world
    inputs = row.inputs(inputs)
    ep = MisbehavingEndpoint(row.good_chat, bad=tuple(it.query for it in inputs[1][:2]))
    ep.app_context = inputs[0].docs[0].text[:80]
    if row.whole:
        return _embeddings_cell(inputs, ep, mode)
    ep.mode = mode
    url = _dead_url() if mode == "dead" else ep.url
    try:
        t0 = time.monotonic()
        res = tiny_pipeline(inputs, **row.stages(url, healthy.url))
        took = time.monotonic() - t0
        rec, why = res.records[row.slot], failure_reason(res.records)
        kept = res.per_query.to_json() + json.dumps(res.tags) + json.dumps({k: vars(v) for k, v in res.records.items()})
        assert KEY not in kept and "sk-live" not in kept  # nothing leaked, whatever the endpoint said
        if mode == "hugeanswer":  # cut at the app's cap, not stored whole
            assert rec.failed == 0 and res.per_query["answer"].str.len().max() == APP_ANSWER_CAP, rec
            return
        if mode == "leakanswer":
            assert rec.failed == 0 and not why and "[REDACTED" in res.per_query["answer"].iloc[0]
            return
        if mode in ALL_FAIL or mode in APP_FAIL or mode == "nan":
            assert rec.items > 0 and rec.failed == rec.items, (rec, res.per_query.filter(like="error").to_dict())
            assert why and rec.first_error and f"({_step(row)} step" in why, why
            if mode == "trickle":  # the deadline bounds the body: every trickled reply was cut, none read
                # whole (load-independent: a body takes ~60 s at one byte per 0.3 s, an attempt 1 s)
                assert ep.http.trickled["whole"] == 0 and ep.http.trickled["cut"] > 0, (ep.http.trickled, took)
            return
        if mode == "ratelimit":
            assert rec.failed == 0 and not why, (rec, why)
            waits = _retry_gaps(ep)
            assert waits and min(waits) >= 0.95, waits  # Retry-After: 1 honoured, never earlier
            return
        # half: the run finishes with the count; the same run again redoes exactly those
        assert 0 < rec.failed < rec.items and not why, (rec, why)
        first_failed = rec.failed
        ep.mode = "ok"
        again = tiny_pipeline(inputs, **row.stages(url, healthy.url))
        rec2 = again.records[row.slot]
        assert rec2.failed == 0 and not failure_reason(again.records), rec2
        if row.slot != "judge":  # one call per item: the re-run asks exactly the failed ones
            assert sum(rec2.calls.values()) == first_failed, (rec2.calls, first_failed)
        else:  # per claim and per relevance question: some calls, fewer than a fresh run
            assert 0 < sum(rec2.calls.values()) < sum(rec.calls.values()), (rec2.calls, rec.calls)
    finally:
        ep.close()


def _embedder(ep: MisbehavingEndpoint, cache, timeout_s: float = FAST["timeout_s"]):
    """The corpus's embedder on ``ep``, built while it answers (its identity probes it once)."""
    inner = OpenAIEmbedder(ep.url, "m", api_key_env=KEY_ENV, concurrency=2, **dict(FAST, timeout_s=timeout_s))
    return DenseRetriever(CachedEmbedder(inner, cache), k=3)


def _embeddings_cell(inputs, ep: MisbehavingEndpoint, mode: str) -> None:
    """The embeddings row: a dead endpoint is bad input at construction (the config check: exit 2
    naming base_url); any vector missing later fails the run naming the endpoint, never a partial
    index; a 429's Retry-After is honoured; the key is never in the message."""
    from rag_experiments.stages.api_embedding import EmbeddingEndpointError

    try:
        if mode == "dead":
            with pytest.raises(EmbeddingEndpointError) as e:
                OpenAIEmbedder(_dead_url(), "m", api_key_env=KEY_ENV, **FAST)
            assert "base_url" in str(e.value)
            return
        retriever = _embedder(ep, inputs[2])
        ep.mode = mode
        if mode == "ratelimit":
            res = tiny_pipeline(inputs, retriever=retriever)
            assert res.records["retriever"].failed == 0 and not failure_reason(res.records)
            assert min(_retry_gaps(ep)) >= 0.95
            return
        if mode == "budget":  # the budget stops the step inside it: a stop, not a crash
            call_budget.reset()
            call_budget.set_budget(max_calls=1)
        try:
            with pytest.raises(StepFailed) as e:  # all, half, NaN, …: no index from some of the vectors
                tiny_pipeline(inputs, retriever=retriever)
        finally:
            call_budget.reset()
        why = e.value.reason  # the run's failure_reason (run.sweep.execute): FAILED, exit 1, no traceback
        assert "embedding" in why and KEY not in why, why
        expected = {"wrongdim": "4-d vectors; its probe's were 3-d", "mixeddim": "mixed sizes (3-d, 4-d)",
                    "short": "vectors for", "oversize": "reply larger than", "swap": MODEL_CHANGED,
                    "budget": "budget"}  # fmt: skip
        assert expected.get(mode, "") in why, why
        if mode == "swap":  # nothing of the failed step is cached: the same command embeds again
            ep.mode = "ok"
            n = len(ep.arrivals)
            assert tiny_pipeline(inputs, retriever=retriever).records["retriever"].failed == 0
            assert len(ep.arrivals) > n
    finally:
        ep.close()


#: What a user's ``app=python`` target may do (tests/app_fixture.py); all but ``huge``/``leaks``
#: fail every question, ``some`` fails some (``sys.exit(3)``) until the app is healed.
PY_APP = {"raise": "broken", "sys_exit": "exits", "interrupt": "interrupts", "generator_exit": "generator_exit",
          "wrong_types": "wrong_types", "bare_string_contexts": "bare_string_contexts", "some": "some_fail",
          "huge": "huge", "secret": "leaks"}  # fmt: skip


@pytest.mark.parametrize("mode", list(PY_APP))
def test_python_app_cell(world, monkeypatch, mode: str):
    """The ``app=python`` row: whatever the target raises (``sys.exit`` and its own
    ``KeyboardInterrupt`` included) or returns of the wrong shape is that question's error, never
    the run's crash or exit code; all failing fails the run naming the app step; some failing is
    redone by the same run again; a huge answer is cut at the cap; a secret is stored nowhere."""
    inputs, _ = world
    monkeypatch.setenv("RAG_APP_KEY", KEY)
    monkeypatch.delenv("RAG_APP_HEALED", raising=False)
    params = {} if PY_APP[mode] in ("broken", "exits", "interrupts", "generator_exit", "wrong_types",
                                    "bare_string_contexts") else {"context": inputs[0].docs[0].text[:80]}  # fmt: skip
    if mode == "huge":
        params["size"] = 3 * APP_ANSWER_CAP

    def run():
        return tiny_pipeline(inputs, app=PythonApp(f"tests.app_fixture:{PY_APP[mode]}", params))

    res = run()
    rec, why = res.records["app"], failure_reason(res.records)
    kept = res.per_query.to_json() + json.dumps({k: vars(v) for k, v in res.records.items()})
    assert KEY not in kept and "sk-live" not in kept
    if mode == "huge":
        assert rec.failed == 0 and res.per_query["answer"].str.len().max() == APP_ANSWER_CAP
    elif mode == "secret":
        assert rec.failed == 0 and not why
    elif mode == "some":
        assert 0 < rec.failed < rec.items and not why, (rec, why)
        assert res.per_query["app_error"].dropna().str.contains("SystemExit").all()
        monkeypatch.setenv("RAG_APP_HEALED", "1")
        again = run().records["app"]
        assert again.failed == 0 and again.calls == {"app": rec.failed}  # exactly the failed ones
    else:
        assert rec.items > 0 and rec.failed == rec.items and "(app step" in why, (rec, why)


# -- the dry-run and budget columns: every row, the app=python one included ---------------------
ROWS = (*STEPS, Row("python_app", "app", ""))
#: the dry run's table name of each row's calls (``run.dry_run.step_of``)
def _dry_step(row: Row) -> str:
    """The dry run's line for the row's calls: its slot's step (``run.dry_run.step_of``)."""
    from rag_experiments.core.slots import steps

    return {s.name: s.step for s in steps()}.get(row.slot, row.slot)


def _row_stages(row: Row, ep: MisbehavingEndpoint, healthy, cache) -> dict[str, Any]:
    return {"retriever": _embedder(ep, cache)} if row.whole else row.stages(ep.url, healthy.url)


def _is_probe(r: Request) -> bool:
    """The embeddings' startup probe (its fixed text alone), not a model request of a step."""
    from rag_experiments.stages.api_embedding import PROBE_TEXT

    return r.path.endswith("/embeddings") and r.body.get("input") in (PROBE_TEXT, [PROBE_TEXT])


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_dry_run_column(world, row: Row, capsys):
    """``dry_run=true`` (the endpoint client's dry mode, as ``run.dry_run`` runs every config):
    the row's step runs on placeholders and its calls are counted, while the fake endpoints
    receive no model request (at most one probe per endpoint); the printed report says what was
    sent. The app=python target is not called (it may call paid models)."""
    from rag_experiments.run import dry_run
    from rag_experiments.stages import dry_calls

    inputs, healthy = world
    inputs = row.inputs(inputs)
    ep = MisbehavingEndpoint(row.good_chat)
    ep.app_context = inputs[0].docs[0].text[:80]
    healthy_before = healthy.calls
    dry_calls.start()
    try:  # built in dry mode too: the dry run's config check builds the stages (the embeddings' probe)
        res = tiny_pipeline(inputs, **_row_stages(row, ep, healthy, inputs[2]))
        calls = dry_calls.calls()
    finally:
        dry_calls.stop()
        ep.close()
    got = [r for _, r in ep.http.requests]
    probes = [r for r in got if _is_probe(r)]
    assert len(got) == len(probes) <= 1, [r.path for r in got]  # no model request, one probe at most
    assert healthy.calls == healthy_before  # the healthy generator's endpoint: nothing either
    rec = res.records[row.slot]
    assert rec.items > 0 and rec.failed == 0 and not failure_reason(res.records), (rec, failure_reason(res.records))
    mine = [c for c in calls if dry_run.step_of(c) == _dry_step(row)]
    assert mine, sorted({dry_run.step_of(c) for c in calls})  # its calls counted, not skipped
    assert len(mine) >= (1 if row.whole else rec.items), (len(mine), rec)
    dry_run.print_report([dry_run.Row(row.name, calls)], {})
    out = capsys.readouterr().out
    assert ("probe" in out) if probes else ("nothing was sent" in out), out
    assert re.search(rf"^\S*\s+{_dry_step(row)}\s+{len(mine)}\s", out, re.M), out


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_budget_column(world, tmp_path, row: Row):
    """``budget.max_calls`` at half the calls a whole run makes: the first run stops at the limit
    (never past it), FAILED with the budget's reason; the same command (a new process: the same
    budget, counted afresh) resumes and finishes, and no call is made twice. The app=python row's
    code calls its models itself: nothing of it is counted, nothing stopped."""
    from rag_experiments.core.cache import StageCache

    inputs, healthy = world
    inputs = row.inputs(inputs)
    ep = MisbehavingEndpoint(row.good_chat)
    ep.app_context = inputs[0].docs[0].text[:80]

    def run(cache) -> str:
        _PROBES.clear()  # each run is a new process: the embeddings probe their endpoint again
        stages = _row_stages(row, ep, healthy, cache)
        try:
            res = tiny_pipeline((inputs[0], inputs[1], cache), **stages)
        except StepFailed as e:  # the corpus's embeddings: the run's failure_reason, raised
            return e.reason
        return failure_reason(res.records)

    def probes() -> int:  # the embeddings' startup probe: one call of each run (the same command probes again)
        return sum(_is_probe(r) for _, r in ep.http.requests[n_requests:])

    try:
        call_budget.reset()
        n_requests = len(ep.http.requests)
        assert run(StageCache(tmp_path / "unbudgeted")) == ""
        probe = probes()
        total = call_budget.spent()["calls"] - probe  # what a whole run calls (a fresh cache)
        if row.name == "python_app":
            call_budget.set_budget(max_calls=1)
            assert total == 0 and run(inputs[2]) == "" and call_budget.spent()["calls"] == 0
            return
        assert total >= 2, total
        limit, made, runs = (total + 1) // 2 + probe, 0, 0
        while True:
            call_budget.reset()  # the same command again: a new process, the same budget
            call_budget.set_budget(max_calls=limit)
            n_requests = len(ep.http.requests)
            why = run(inputs[2])
            runs += 1
            assert call_budget.spent()["calls"] <= limit  # never past it
            assert probes() == probe
            made += call_budget.spent()["calls"] - probe
            if not why:
                break
            assert f"budget: budget.max_calls={limit} reached" in why, why  # FAILED with the budget's reason
            assert "same command" in why, why  # how to resume: every row, the embeddings' StepFailed too
            assert runs < 3, (runs, made, total)
        assert runs == 2 and made == total, (runs, made, total)  # resumed where it stopped, nothing redone
    finally:
        call_budget.reset()
        ep.close()


def _step(row: Row) -> str:
    from rag_experiments.core.slots import slot

    return slot(row.slot).step


def _retry_gaps(ep: MisbehavingEndpoint) -> list[float]:
    """Seconds between a request's first attempt and its retry, for every retried request."""
    first: dict[str, float] = {}
    gaps = []
    for t, h in ep.arrivals:
        if h in first:
            gaps.append(t - first.pop(h))
        else:
            first[h] = t
    return gaps


@pytest.mark.parametrize("row", STEPS, ids=[r.name for r in STEPS])
def test_signal_stops_every_remote_step_at_once(world, row: Row):
    """SIGINT (SIGTERM maps to the same) while the endpoint holds every request: the run stops in
    seconds, not at the timeouts, and no request reaches the endpoint after the signal."""
    inputs, healthy = world
    inputs = row.inputs(inputs)
    ep = MisbehavingEndpoint(row.good_chat)
    ep.app_context = inputs[0].docs[0].text[:80]
    if row.whole:
        stages = {"retriever": _embedder(ep, inputs[2], timeout_s=20.0)}
        ep.arrivals.clear()  # the probe at construction
    else:
        stages = row.stages(ep.url, healthy.url, timeout_s=20.0)  # only the signal can end these calls early
    ep.mode = "hang"
    main, sent = threading.get_ident(), []

    def interrupt():
        while not ep.arrivals:  # once a request is in flight
            time.sleep(0.05)
        sent.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            tiny_pipeline(inputs, **stages)
        stopped = time.monotonic()
        assert sent and stopped - sent[0] < 5.0, "waited for the requests in flight (timeout 20 s)"
        time.sleep(0.5)
        late = [t for t, _ in ep.arrivals if t > sent[0] + 0.3]
        assert not late, f"{len(late)} requests sent after the signal"
    finally:
        ep.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "override",
    [
        ["rerank=endpoint", "rerank.base_url=http://127.0.0.1:9/v1", "rerank.timeout_s=1", "rerank.max_retries=0"],
        ["query=rewrite", "+generator@query.llm=openai", "query.llm.base_url=http://127.0.0.1:9/v1",
         "query.llm.model=m", "query.llm.api_key_env=null", "query.llm.timeout_s=1", "query.llm.max_retries=0"],
    ],
    ids=["rerank", "query"],
)
def test_dead_reranker_and_transform_fail_the_cli_run(tmp_path, override):
    """The issue's reproduction: a reranker (or transform) failing on every query gave a FINISHED
    run, exit 0, that the same command then skipped. Now: FAILED naming the step, exit != 0, and
    the same command runs it again."""
    from mlflow.tracking import MlflowClient

    from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

    docs, ev = make_tiny(tmp_path, n_items=3)
    args = [*override, "retriever=bm25", "generator=none", *sweep_args(tmp_path, docs, ev)]
    first = run_sweep(tmp_path, *args, check=False)
    assert first.returncode not in (0, 2), (first.returncode, first.stderr[-2000:])
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp_id = client.get_experiment_by_name("test").experiment_id
    (run,) = client.search_runs([exp_id])
    assert run.info.status == "FAILED" and "every one of the 3" in run.data.tags["failure_reason"]
    again = run_sweep(tmp_path, *args, check=False)
    assert "[skip]" not in again.stdout and again.returncode == first.returncode
    assert len(client.search_runs([exp_id])) == 2


def test_a_dry_run_of_every_remote_step_sends_no_model_request(tmp_path):
    """Issue 42 (4), end to end: ``dry_run=true`` of configs using every remote step one config
    composes (the embeddings API, the query transform, the LLM reranker, the generator, MLflow's
    judge through its shim; the other rows' dry runs are ``test_dry_run_column``'s), all on one live
    fake endpoint: it receives no model request (at most its probe), and the printed table counts
    every step's calls."""
    from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

    ep = MisbehavingEndpoint("yes")
    u = ep.url
    try:
        docs, ev = make_tiny(tmp_path, n_items=3)
        p = run_sweep(tmp_path, *sweep_args(tmp_path, docs, ev), "rerank=llm", f"rerank.base_url={u}",
                      "rerank.model=r", "rerank.candidates=4", "retriever.k=3", "embedding=openai", f"embedding.base_url={u}",
                      "embedding.api_key_env=null", "query=rewrite", "generator=openai", f"generator.base_url={u}",
                      "generator.model=m", "generator.api_key_env=null", "judge=mlflow", f"judge.base_url={u}",
                      "judge.model=m", "judge_card.enabled=false", "generation_subset=2", "dry_run=true", check=False)  # fmt: skip
    finally:
        ep.close()
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    got = [r for _, r in ep.http.requests]
    probes = [r for r in got if _is_probe(r)]
    assert len(got) == len(probes) <= 1, [r.path for r in got]
    assert ("probe" in p.stdout) if probes else ("nothing was sent" in p.stdout), p.stdout
    for step in ("retrieval", "query", "rerank", "generation", "judging"):  # core.slots: the steps' names
        assert re.search(rf"^\S*\s+{step}\s+[1-9]", p.stdout, re.M), (step, p.stdout)
    assert not (tmp_path / "mlflow.db").exists()


def test_a_lone_surrogate_in_a_reply_is_replaced_once_for_every_chat_step(world, tmp_path):
    """A JSON ``"\\ud800"`` decodes to a lone surrogate no cache, table or store can encode; the
    endpoint's chat parser replaces it (U+FFFD), so the run and its per-query table survive."""
    inputs, _ = world
    odd = ChatServer(lambda body: "Webhooks retry \ud800 for 24 hours.")
    try:
        row = STEPS[0]
        res = tiny_pipeline(inputs, **row.stages(odd.url, odd.url))
        assert res.records["generator"].failed == 0
        assert res.per_query["answer"].str.contains("\ufffd").all()
        res.per_query.to_parquet(tmp_path / "t.parquet")
    finally:
        odd.close()
