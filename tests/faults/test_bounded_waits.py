"""Every wait on an endpoint is bounded: ``timeout_s`` is a total per-request deadline (a body
trickling one byte every 2 s included), and a 429's ``Retry-After`` (seconds) is honoured up to it."""

from __future__ import annotations

import threading
import time

from rag_experiments.stages.generation import OpenAICompatibleGenerator
from tests.llm_fixtures import fake_llm  # noqa: F401 - fixture

MSG = [{"role": "user", "content": "hi"}]


def _complete_within(gen, seconds: float):
    out: list = []
    t = threading.Thread(target=lambda: out.append(gen.complete(MSG)), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(seconds)
    assert out, f"complete() still waiting after {seconds} s"
    return out[0], time.monotonic() - t0


def test_a_trickling_body_is_cut_at_the_total_deadline(fake_llm):  # noqa: F811
    gen = OpenAICompatibleGenerator(base_url=fake_llm.base_url, model="trickle", timeout_s=3, max_retries=0)
    c, took = _complete_within(gen, 30)
    assert c.error and "timeout_s" in c.error and took < 8, (c.error, took)


def test_retry_after_seconds_is_honoured(fake_llm):  # noqa: F811
    fake_llm.retry_after = "2"
    gen = OpenAICompatibleGenerator(
        base_url=fake_llm.base_url, model="ratelimit", timeout_s=10, max_retries=2, backoff_s=0.01
    )
    c, _ = _complete_within(gen, 30)
    assert not c.error and c.attempts == 2, c
    first, second = fake_llm.attempt_times[("ratelimit", "hi")]
    assert second - first >= 2.0, second - first


def test_retry_after_beyond_the_deadline_fails_at_once(fake_llm):  # noqa: F811
    fake_llm.retry_after = "120"
    gen = OpenAICompatibleGenerator(
        base_url=fake_llm.base_url, model="ratelimit", timeout_s=5, max_retries=3, backoff_s=0.01
    )
    c, took = _complete_within(gen, 30)
    assert c.error and "Retry-After" in c.error and took < 5, (c.error, took)
    assert fake_llm.count("ratelimit", "hi") == 1  # not hammered with retries the server refused
