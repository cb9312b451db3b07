"""Endpoints run at their limit, never past it (``stages.endpoint``): a real local endpoint that
allows 2 requests in flight (429 with ``Retry-After: 1`` beyond) loses no item of 40 generations
at concurrency 4; the adaptive cap halves once per round and grows back; ``rpm``/``tpm`` pace the
requests; the usage record carries 429s, seconds throttled, tokens and the achieved rate."""

from __future__ import annotations

import json
import threading
import time

import pytest

from rag_experiments.stages import endpoint
from rag_experiments.stages.endpoint import Endpoint, _Shared
from rag_experiments.stages.generation import OpenAICompatibleGenerator
from tests.http_fakes import FakeHTTP, Reply, Request, completion


class LimitedServer:
    """Chat completions, ``allowed`` in flight (429 + ``Retry-After`` beyond), ``delay_s`` per
    reply, ``tokens`` reported per reply; records what it accepted. A handler of
    ``tests.http_fakes.FakeHTTP``."""

    def __init__(self, allowed: int = 2, delay_s: float = 0.3, retry_after: str = "1", tokens: int = 10) -> None:
        self.allowed, self.delay_s, self.tokens, self.retry_after = allowed, delay_s, tokens, retry_after
        self.in_flight = self.max_in_flight = self.rejected = self.served = 0
        self.lock = threading.Lock()
        self.http = FakeHTTP(self._reply)
        self.base_url = self.http.url

    def _reply(self, r: Request) -> Reply:
        with self.lock:
            if self.in_flight >= self.allowed:
                self.rejected += 1
                return Reply(429, b"{}", {"Retry-After": self.retry_after})
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.delay_s)
        text = r.body["messages"][-1]["content"]
        reply = completion(f"answer to {text}", r.body["model"], (self.tokens - 1, 1))
        with self.lock:  # counted before the client can read it: no race with the assert
            self.served += 1
        return Reply(200, json.dumps(reply).encode(), done=self._left)  # in flight until written

    def _left(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def close(self) -> None:
        self.http.close()


@pytest.fixture
def limited():
    s = LimitedServer()
    yield s
    s.close()


def test_forty_generations_at_concurrency_4_against_2_in_flight_lose_no_item(limited):
    gen = OpenAICompatibleGenerator(base_url=limited.base_url, model="two-in-flight", api_key_env="NO_SUCH_KEY_VAR",
                                    concurrency=4, max_retries=3, backoff_s=0.5, timeout_s=30)  # fmt: skip
    before = endpoint.usage()
    prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(40)]
    out = gen.generate(prompts)
    assert [g.error for g in out] == [None] * 40  # 0 items lost
    assert [g.text for g in out] == [f"answer to q{i}" for i in range(40)]
    assert limited.max_in_flight <= 2 and limited.served == 40
    used = endpoint.usage_since(before)[f"{limited.base_url}#two-in-flight"]
    assert used["calls"] == 40 and used["failed"] == 0
    assert used["http_429"] == limited.rejected > 0  # the first round met the limit, and was counted
    assert used["attempts"] == 40 + limited.rejected and used["throttled_s"] > 0
    assert used["tokens"] == 40 * limited.tokens and used["rpm"] > 0


def test_the_cap_halves_once_per_round_and_grows_back_slowly_near_the_limit_met():
    sh = _Shared(limit=8)
    sh.cond.acquire()  # the callers hold it
    t = time.monotonic()
    sh.on_429(sent_at=t)
    assert (sh.cap, sh.ceiling, sh.allowed()) == (4, 8, 4)
    sh.on_429(sent_at=t)  # sent before the cut: the same round, no second halving
    assert sh.allowed() == 4
    grown = []
    for _ in range(4 + 5 + 6):
        sh.on_success()
        grown.append(sh.allowed())
    assert grown[3] == 5 and grown[8] == 6 and grown[14] == 7  # one more per `cap` successes
    for _ in range(8 * 8 - 1):
        sh.on_success()
    assert sh.allowed() == 7  # the count that met a 429 is probed only after 8 * 8 successes
    sh.on_success()
    assert sh.allowed() == 8 and sh.cap == 0  # back at the declared limit
    sh.on_429(sent_at=time.monotonic())
    assert sh.allowed() == 4


def test_rpm_and_tpm_pace_the_requests_and_the_record_says_so():
    s = LimitedServer(allowed=100, delay_s=0.0, tokens=100)
    try:
        before = endpoint.usage()
        ep = Endpoint(s.base_url, "paced-rpm", rpm=600)  # one request every 0.1 s
        for i in range(6):
            assert ep.post("/chat/completions", {"model": "paced-rpm", "messages": [{"role": "user", "content": str(i)}]}).error is None
        used = endpoint.usage_since(before)[f"{s.base_url}#paced-rpm"]
        sh = ep._shared
        assert sh.usage.last_sent - sh.usage.first_sent >= 5 * 0.1 - 1e-6  # never faster than rpm
        assert 0 < used["rpm"] <= 600 + 1e-6 and used["tokens"] == 600
        ep2 = Endpoint(s.base_url, "paced-tpm", tpm=12_000)  # 100 tokens per reply: 0.5 s after each
        for i in range(3):
            assert ep2.post("/chat/completions", {"model": "paced-tpm", "messages": [{"role": "user", "content": str(i)}]}).error is None
        u2 = ep2._shared.usage
        assert u2.last_sent - u2.first_sent >= 2 * 0.5 - 1e-6 and u2.throttled_s > 0
    finally:
        s.close()


def test_limits_are_shared_per_endpoint_tightest_rate_largest_concurrency():
    a = Endpoint("http://127.0.0.1:9/v1", "shared-m", max_concurrency=2, rpm=100, tpm=5000)
    b = Endpoint("http://127.0.0.1:9/v1", "shared-m", max_concurrency=6, rpm=50)
    c = Endpoint("http://127.0.0.1:9/v1", "other-m", rpm=10)
    assert a._shared is b._shared and a._shared is not c._shared
    assert (a._shared.limit, a._shared.rpm, a._shared.tpm) == (6, 50, 5000)


@pytest.mark.parametrize(
    ("key", "value"), [("max_concurrency", 0), ("max_concurrency", 2.5), ("rpm", 0), ("rpm", -5), ("tpm", "fast")]
)
def test_out_of_range_limits_are_named(key, value):
    from rag_experiments.run.config_schema import _Group
    from rag_experiments.run.endpoint_checks import endpoint_problems

    g = _Group("generator", {key: value})
    endpoint_problems(g)
    assert len(g.problems) == 1 and g.problems[0].startswith(f"conf/generator: {key}: must be")
    ok = _Group("generator", {"max_concurrency": 4, "rpm": 500, "tpm": 2e5})
    endpoint_problems(ok)
    assert ok.problems == []


def test_a_429_without_retry_after_is_not_hammered_and_gives_up_after_rate_limited_s():
    s = LimitedServer(allowed=0, delay_s=0.0, retry_after="soon")  # every request a 429, no usable Retry-After
    try:
        ep = Endpoint(s.base_url, "always-429", max_retries=1, backoff_s=0.1, rate_limited_s=2.0)
        r = ep.post("/chat/completions", {"model": "always-429", "messages": [{"role": "user", "content": "x"}]})
        assert r.error and r.error.startswith("still rate-limited after 2 s") and r.status == 429
        assert s.rejected == r.attempts <= 10  # backoff doubling per 429: 0.1, 0.2, 0.4, 0.8, 1.6 s …
    finally:
        s.close()
