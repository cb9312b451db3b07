"""The one home of the tests' fake HTTP servers (issue 42, item 10): endpoints, apps and embeddings.

:class:`FakeHTTP` is a threaded server on 127.0.0.1 whose answer to every request is
``handle(Request)``: a :class:`Reply` (status, body, headers, a body trickled byte by byte, a hang)
or plain bytes / a dict (200 JSON). It records every request (``requests``: arrival time and the
request) so a test can count what an endpoint received, e.g. 0 model requests during a dry run.
The chat-, app- and embeddings-shaped fakes of the tests are handlers of it, not servers of their
own.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    """One request as the fake saw it: method, path, headers, raw body and its JSON (or {})."""

    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    body: Any


@dataclass
class Reply:
    """What the fake answers: ``status``, ``body``, extra ``headers``; ``trickle_s`` > 0 sends the
    body one byte every that many seconds; ``hang_s`` > 0 waits that long and answers nothing;
    ``done()`` runs once the reply is written (or given up): a request is in flight until then."""

    status: int = 200
    body: bytes = b"{}"
    headers: dict[str, str] = field(default_factory=dict)
    trickle_s: float = 0.0
    hang_s: float = 0.0
    done: Callable[[], None] | None = None


def send_body(handler: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str = "application/json",
              headers: dict[str, str] | None = None) -> None:  # fmt: skip
    """One whole HTTP reply from a handler: status, type, length, extra headers, body."""
    handler.send_response(code)
    handler.send_header("Content-Type", ctype)
    handler.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(body)


def _as_reply(out: Reply | bytes | str | dict | list) -> Reply:
    if isinstance(out, Reply):
        return out
    if isinstance(out, bytes):
        return Reply(body=out)
    if isinstance(out, str):
        return Reply(body=out.encode())
    return Reply(body=json.dumps(out).encode())


class FakeHTTP:
    """A threaded HTTP server on 127.0.0.1 answering ``handle(request)`` (module docstring).

    ``url``: ``http://127.0.0.1:PORT`` + ``prefix`` (``/v1`` for an OpenAI-compatible base URL);
    ``requests``: (time.monotonic(), :class:`Request`) of every request; ``close()`` stops it (also
    as a context manager)."""

    def __init__(self, handle: Callable[[Request], Any], prefix: str = "/v1", start: bool = True) -> None:
        self.handle, self.requests = handle, []
        self.trickled = {"cut": 0, "whole": 0}  # trickled bodies the client gave up on / read whole
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _serve(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {}
                req = Request(self.command, self.path, dict(self.headers), raw, body)
                with outer._lock:
                    outer.requests.append((time.monotonic(), req))
                reply = _as_reply(outer.handle(req))
                try:
                    outer._answer(self, reply)
                finally:
                    if reply.done is not None:
                        reply.done()

            do_POST = do_GET = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = self.base + prefix
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        if start:
            self.thread.start()

    def _answer(self, h: BaseHTTPRequestHandler, r: Reply) -> None:
        if r.hang_s:
            time.sleep(r.hang_s)
            return
        if not r.trickle_s:
            return send_body(h, r.status, r.body, headers=r.headers)
        h.send_response(r.status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(r.body)))
        h.end_headers()
        try:
            for b in r.body:
                h.wfile.write(bytes([b]))
                h.wfile.flush()
                time.sleep(r.trickle_s)
        except OSError:  # the client gave up at its deadline: fine
            with self._lock:
                self.trickled["cut"] += 1
            return
        with self._lock:
            self.trickled["whole"] += 1

    def count(self, path_suffix: str = "") -> int:
        """Requests received whose path ends with ``path_suffix``."""
        return sum(r.path.endswith(path_suffix) for _, r in self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeHTTP:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def completion(content: str, model: str = "m", usage: tuple[int, int] = (1, 1)) -> dict:
    """An OpenAI chat completion whose answer is ``content`` and whose usage is ``usage``."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def embeddings(texts: list[str], vector: Callable[[str], list[float]]) -> dict:
    """An OpenAI ``/embeddings`` reply: ``vector(text)`` per input, in order, with its usage."""
    rows = [{"object": "embedding", "index": i, "embedding": vector(t)} for i, t in enumerate(texts)]
    return {"object": "list", "data": rows, "usage": {"prompt_tokens": len(texts), "total_tokens": len(texts)}}


def _block(tag: str, text: str) -> str:
    """The text of the first ``<tag>`` block of a prompt (core.sanitize.delimited), "" if none."""
    start, end = text.find(f"<{tag}>\n"), text.find(f"\n</{tag}>")
    return text[start + len(tag) + 3 : end] if 0 <= start < end else ""


def judge_text(body: dict, verdict: Callable[[str, str], str], claims_of: Callable[[str], list[str]] | None = None) -> str:
    """A fake chat judge's reply to each of ``judge.llm.LLMJudge``'s requests, from one rule:
    ``verdict(claim, context)`` is the word said for a claim ("yes", "no" or anything else: an
    unreadable one). The claims call lists ``claims_of(answer)`` (default: its sentence claims);
    a per-claim verdict says the word; the folded call (``judge.fold=true``) answers its JSON with
    the same claims and words (``"garble"`` as the word of any claim: the whole reply unreadable);
    the questions call three questions; a fact verdict "supported"."""
    from rag_experiments.judge.claims import split_claims

    text = "\n".join(str(m.get("content") or "") for m in body.get("messages") or [])
    claims_of = claims_of or split_claims
    if "Break the answer below" in text:
        return "\n".join(f"- {c}" for c in claims_of(_block("answer", text)))
    if "Is the claim supported" in text:
        return verdict(_block("claim", text), _block("context", text))
    if "List the answer's claims, each with" in text:
        context = _block("context", text)
        items = [{"claim": c, "supported": verdict(c, context)} for c in claims_of(_block("answer", text))]
        return "not json" if any(i["supported"] == "garble" for i in items) else json.dumps({"claims": items})
    if "different questions" in text:
        return "What is retried?\nFor how long?\nWith which id?"
    if "reference fact" in text:
        return "supported"
    return "yes"
