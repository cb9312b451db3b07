"""Your application as a black box (docs/app.md): the ``app`` slot.

A team's RAG application (its own retriever service, LangChain or LlamaIndex code, an HTTP
endpoint) is evaluated as it is. For each question it returns the answer and the contexts it used
(text, optionally ``doc_id``, ``start``, ``end``, ``score``). Gold evidence is text in the corpus,
so the contexts are mapped onto corpus spans (``evalset.contexts.ContextMapper``, in the app's
step ``run.app_step.AppStep``) and from then on everything
works as for the built-in stages: retrieval metrics on the mapped contexts in the app's order,
generation metrics, failure labels and judges on its answer.

- ``PythonApp``: ``app.target=pkg.module:function``; the function gets the question and
  ``app.params.*`` as keyword arguments (Hydra can sweep them) and returns ``{"answer": str,
  "contexts": [str | {"text", "doc_id"?, "start"?, "end"?, "score"?}]}`` or ``(answer, contexts)``.
- ``HttpApp``: ``app.url``; the request body is ``app.request`` with ``{question}`` filled in, the
  reply's ``app.answer_field`` and ``app.contexts_field`` are read (and ``app.trace_id_field``, the
  app's own MLflow trace id, when given); through the one endpoint client (deadline, retries,
  ``Retry-After``, redaction, abort).

The app replaces the chunker, retriever, query transform, reranker and generator of the run
(``Slot.replaces``); its identity is its code or URL and its parameters. Replies are cached per
(identity, question); a failed call is not cached and is counted (``n_app_errors``): an app that
fails on every question fails the run, one that fails on some is retried by the same command.
"""

from __future__ import annotations

import importlib
import inspect
import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from rag_experiments.core.cache import stable_hash
from rag_experiments.core.redaction import error_text
from rag_experiments.stages import dry_calls
from rag_experiments.stages.endpoint import Endpoint


class AppShapeError(ValueError):
    """An app reply that is not an answer and a list of contexts."""


@dataclass
class AppReply:
    """One question's reply: the answer, the contexts (dicts with ``text`` and optional
    ``doc_id``/``start``/``end``/``score``), the seconds, the error ("" when none), and the id of
    the app's own MLflow trace of this question ("" when it made none)."""

    answer: str = ""
    contexts: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""
    trace_id: str = ""


class App(Protocol):
    identity: str
    concurrency: int

    def ask(self, question: str) -> AppReply: ...


def reply_of(out: Any) -> AppReply:
    """An app's return value as an :class:`AppReply`; :class:`AppShapeError` for any other shape."""
    if isinstance(out, tuple) and len(out) == 2:
        out = {"answer": out[0], "contexts": out[1]}
    if not isinstance(out, dict) or not isinstance(out.get("answer"), str):
        raise AppShapeError(f"expected {{'answer': str, 'contexts': [...]}} or (answer, contexts), got {type(out).__name__}")
    contexts = []
    for c in out.get("contexts") or []:
        c = {"text": c} if isinstance(c, str) else c
        if not isinstance(c, dict) or not isinstance(c.get("text"), str):
            raise AppShapeError(f"a context must be a string or a dict with 'text', got {c!r:.80}")
        contexts.append(c)
    return AppReply(out["answer"], contexts)


class PythonApp:
    """A Python function ``pkg.module:function`` called as ``function(question, **params)``."""

    def __init__(self, target: str, params: dict[str, Any] | None = None, concurrency: int = 1) -> None:
        module, _, name = str(target).partition(":")
        try:
            self.fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as e:
            raise FileNotFoundError(f"app.target: cannot import {target!r} ({error_text(e, 200)}); expected pkg.module:function") from None
        self.params, self.concurrency, self.target = dict(params or {}), max(1, int(concurrency)), str(target)
        try:  # identity is content: the function's module source, not its name
            code = inspect.getsource(inspect.getmodule(self.fn))
        except (OSError, TypeError):
            code = target
        self.identity = json.dumps({"app": "python", "target": target, "code": stable_hash(code), "params": self.params},
                                   sort_keys=True, default=str)  # fmt: skip

    def ask(self, question: str) -> AppReply:
        if dry_calls.active():  # dry_run=true: your code is not called (it may call paid models)
            dry_calls.record(f"python:{self.target}", "app", {"question": question})
            return AppReply(dry_calls.placeholder_answer(question), [{"text": "placeholder"}])
        t = time.perf_counter()
        try:
            reply = reply_of(self.fn(question, **self.params))
        except Exception as e:  # noqa: BLE001 - the user's code: any failure is this question's error
            return AppReply(seconds=time.perf_counter() - t, error=error_text(e, 300))
        reply.seconds = time.perf_counter() - t
        return reply


def _field(data: Any, path: str) -> Any:
    """The value at a dotted ``path`` of a JSON reply (None where a part is missing)."""
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


class HttpApp:
    """An HTTP endpoint: POST ``request`` (``{question}`` filled in) to ``url``; the reply's
    ``answer_field`` and ``contexts_field`` (dotted paths) are the answer and the contexts."""

    def __init__(
        self,
        url: str,
        request: dict[str, Any] | None = None,
        answer_field: str = "answer",
        contexts_field: str = "contexts",
        api_key_env: str | None = None,
        trace_id_field: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        concurrency: int = 4,
    ) -> None:
        base, _, path = str(url).rpartition("/")
        self.url, self.path = str(url), "/" + path
        self.request = dict(request or {"question": "{question}"})
        self.answer_field, self.contexts_field = answer_field, contexts_field
        self.trace_id_field = trace_id_field  # the reply's MLflow trace id of this request, if it sends one
        self.concurrency = max(1, int(concurrency))
        self.endpoint = Endpoint(base, "", api_key_env, timeout_s, max_retries, backoff_s,
                                 max_concurrency=self.concurrency, what="app.timeout_s")  # fmt: skip
        self.identity = json.dumps({"app": "http", "url": self.url, "request": self.request,
                                    "answer": answer_field, "contexts": contexts_field}, sort_keys=True)  # fmt: skip

    def _body(self, question: str) -> dict:
        fill = lambda v: v.replace("{question}", question) if isinstance(v, str) else v  # noqa: E731
        return {k: fill(v) for k, v in self.request.items()}

    def _parse(self, raw: bytes) -> AppReply:
        data = json.loads(raw)
        reply = reply_of({"answer": _field(data, self.answer_field), "contexts": _field(data, self.contexts_field)})
        if self.trace_id_field:
            reply.trace_id = str(_field(data, self.trace_id_field) or "")
        return reply

    def _dry_reply(self, body: dict) -> bytes:
        """A dry run's placeholder (``stages.dry_calls``): a reply of the declared mapping, an
        answer and one context, so the steps after the app run on it."""
        reply: dict = {}
        for path, value in ((self.answer_field, dry_calls.placeholder_answer(body)), (self.contexts_field, [{"text": "placeholder"}])):
            node, *parts = reply, *path.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        return json.dumps(reply).encode()

    def ask(self, question: str) -> AppReply:
        r = self.endpoint.post(self.path, self._body(question), self._parse, dry=self._dry_reply)
        if r.error:
            return AppReply(seconds=r.seconds, error=r.error)
        r.data.seconds = r.seconds
        return r.data
