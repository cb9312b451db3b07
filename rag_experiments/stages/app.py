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

Every reply passes the text gate (``core.text_gate``) where it is made: the answer redacted (the
configured keys, ``app.api_key_env``'s, ``sk-…`` …) and cut at ``app.max_answer_chars`` (default
:data:`APP_ANSWER_CAP`; ``AppReply.truncated``), ``contexts`` a list (a bare string is that
question's error, never read one character at a time). Whatever a Python target raises, ``sys.exit``
included, is that question's error (:func:`contained`), or exit 2 when it happens at the config
check (import, or the first question asked there).

The app replaces the chunker, retriever, query transform, reranker and generator of the run
(``Slot.replaces``); its identity is its code or URL and its parameters. Replies are cached per
(identity, question); a failed call is not cached and is counted (``n_app_errors``): an app that
fails on every question fails the run, one that fails on some is retried by the same command.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rag_experiments.core.cache import stable_hash
from rag_experiments.core.parallel import signal_seen
from rag_experiments.core.redaction import error_text
from rag_experiments.core.text_gate import TextTypeError, gate_list, gate_text
from rag_experiments.stages import dry_calls
from rag_experiments.stages.endpoint import Endpoint, GiveUp
from rag_experiments.stages.endpoint_limits import CHARS_PER_TOKEN_CAP
from rag_experiments.stages.endpoint_settings import SAMPLING, Takes


class AppShapeError(ValueError):
    """An app reply that is not an answer and a list of contexts."""


@dataclass
class AppReply:
    """One question's reply: the answer, the contexts (dicts with ``text`` and optional
    ``doc_id``/``start``/``end``/``score``), the seconds, the error ("" when none), the id of the
    app's own MLflow trace of this question ("" when it made none), whether the answer was cut at
    ``app.max_answer_chars`` (``truncated``) and whether the app tried to end the process
    (``exited``: ``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit`` of its own).

    Its texts are always gated (``core.text_gate``): whoever builds one (a fresh reply, the cache's
    copy of an older one) holds a redacted answer and error, before the cache, MLflow,
    ``per_query`` or the report see them."""

    answer: str = ""
    contexts: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""
    trace_id: str = ""
    truncated: bool = False
    exited: bool = False

    def __post_init__(self) -> None:
        self.answer = gate_text(self.answer, "answer").text
        self.error = gate_text(self.error, "error").text
        self.contexts = [{**c, "text": gate_text(c["text"], "context", shapes=False).text} for c in self.contexts]


class App(Protocol):
    identity: str
    concurrency: int

    def ask(self, question: str) -> AppReply: ...


def reply_of(out: Any, cap: int | None = None) -> AppReply:
    """An app's return value as an :class:`AppReply` through the text gate (the answer cut at
    ``cap`` characters); :class:`AppShapeError` for any other shape: an answer that is not a
    string, ``contexts`` that are not a list (a bare string is refused, never read one character
    at a time), a context that is neither a string nor a dict with a string ``text``."""
    if isinstance(out, tuple) and len(out) == 2:
        out = {"answer": out[0], "contexts": out[1]}
    if not isinstance(out, dict):
        raise AppShapeError(f"expected {{'answer': str, 'contexts': [...]}} or (answer, contexts), got {type(out).__name__}")
    try:
        answer = gate_text(out.get("answer"), "answer", cap)
        raw = out.get("contexts")
        contexts = []
        for i, c in enumerate(gate_list(raw, "contexts") if raw is not None else []):
            c = {"text": c} if isinstance(c, str) else c
            if not isinstance(c, dict):
                raise TextTypeError(f"contexts[{i}]: expected a string or a dict with 'text', got {type(c).__name__}")
            gate_text(c.get("text"), f"contexts[{i}].text")
            contexts.append(c)
    except TextTypeError as e:
        raise AppShapeError(str(e)) from None
    return AppReply(answer.text, contexts, truncated=answer.truncated)


#: The longest app answer kept when ``app.max_answer_chars`` is not set (characters): the
#: generator's default cap at 4,096 tokens (``max_tokens * 16``); longer answers are cut and counted.
APP_ANSWER_CAP = 4096 * CHARS_PER_TOKEN_CAP
#: What an app raising these tried to do; it is that question's error, not the sweep's exit.
_ENDINGS = {SystemExit: "called sys.exit", KeyboardInterrupt: "raised KeyboardInterrupt",
            GeneratorExit: "raised GeneratorExit"}  # fmt: skip


def contained(fn: Callable[[], Any], what: str) -> tuple[Any, str, bool]:
    """``(fn(), "", False)``, or ``(None, error, exited)`` for anything the user's code raises,
    ``SystemExit``/``KeyboardInterrupt``/``GeneratorExit`` included (``exited``: it tried to end
    the process). A real Ctrl-C/SIGTERM to our process while ``fn`` runs in the main thread is
    re-raised: only the app's own interrupt is contained. A forking target is contained: a child
    process that returns here (from a bare ``os.fork()``) is ended at once with ``os._exit``, so
    only the parent's reply counts and the child never runs our code."""
    pid = os.getpid()
    with signal_seen() as seen:
        try:
            out = fn()
        except BaseException as e:  # noqa: BLE001 - the user's code: any failure is this question's
            _end_forked_child(pid, what)
            if seen.is_set():  # our own process was signalled: the user's Ctrl-C, not the app's
                raise
            ending = next((w for t, w in _ENDINGS.items() if isinstance(e, t)), "")
            text = error_text(e, 300) if not ending else f"{type(e).__name__}: {what} {ending} ({str(e)[:200] or 'no message'})"
            return None, text, bool(ending)
    _end_forked_child(pid, what)
    return out, "", False


def _end_forked_child(pid: int, what: str) -> None:
    if os.getpid() != pid:  # we are a child the user's code forked: it must not run the sweep
        os.write(2, f"{what}: a process forked by the app was ended (only the parent's reply counts)\n".encode())
        os._exit(0)


class PythonApp:
    """A Python function ``pkg.module:function`` called as ``function(question, **params)``.

    Whatever the function raises is that question's error, ``sys.exit``, ``KeyboardInterrupt``
    and ``GeneratorExit`` included (:func:`contained`); while the module is imported (the config
    check) it is a bad ``app.target`` (exit 2). ``os._exit`` cannot be caught in the process: the
    run it kills is marked KILLED by the next start (``heal_stale_runs``)."""

    def __init__(
        self,
        target: str,
        params: dict[str, Any] | None = None,
        concurrency: int = 1,
        max_answer_chars: int | None = None,
    ) -> None:
        module, _, name = str(target).partition(":")
        fn, error, _ = contained(lambda: getattr(importlib.import_module(module), name), "app.target")
        if error:  # not importable, a syntax error, an import that calls sys.exit …
            raise FileNotFoundError(f"app.target: cannot import {target!r} ({error}); expected pkg.module:function")
        self.fn = fn
        self.params, self.concurrency, self.target = dict(params or {}), max(1, int(concurrency)), str(target)
        self.max_answer_chars = int(max_answer_chars) if max_answer_chars is not None else APP_ANSWER_CAP
        try:  # identity is content: the function's module source, not its name
            code = inspect.getsource(inspect.getmodule(self.fn))
        except (OSError, TypeError):
            code = target
        ident = {"app": "python", "target": target, "code": stable_hash(code), "params": self.params}
        if max_answer_chars is not None:  # the default keeps the identity of earlier runs
            ident["max_answer_chars"] = self.max_answer_chars
        self.identity = json.dumps(ident, sort_keys=True, default=str)

    def ask(self, question: str) -> AppReply:
        if dry_calls.active():  # dry_run=true: your code is not called (it may call paid models)
            dry_calls.record(f"python:{self.target}", "app", {"question": question})
            return AppReply(dry_calls.placeholder_answer(question), [{"text": "placeholder"}])
        t = time.perf_counter()
        out, error, exited = contained(lambda: self.fn(question, **self.params), f"app.target {self.target}")
        if not error:
            try:
                reply = reply_of(out, self.max_answer_chars)
            except AppShapeError as e:
                error = error_text(e, 300)
        if error:
            return AppReply(seconds=time.perf_counter() - t, error=error, exited=exited)
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

    # ``url`` is its address; no sampling
    ENDPOINT = Takes(without=("base_url", "model", *SAMPLING), max_retries=2)

    def __init__(
        self,
        url: str,
        request: dict[str, Any] | None = None,
        answer_field: str = "answer",
        contexts_field: str = "contexts",
        trace_id_field: str | None = None,
        max_answer_chars: int | None = None,
        **endpoint: Any,
    ) -> None:
        base, _, path = str(url).rpartition("/")
        self.url, self.path = str(url), "/" + path
        self.settings = self.ENDPOINT.settings(endpoint, base_url=base)
        self.request = dict(request or {"question": "{question}"})
        self.answer_field, self.contexts_field = answer_field, contexts_field
        self.trace_id_field = trace_id_field  # the reply's MLflow trace id of this request, if it sends one
        self.concurrency = self.settings.concurrency
        self.endpoint = Endpoint.of(self.settings, "app.timeout_s")
        self.max_answer_chars = int(max_answer_chars) if max_answer_chars is not None else APP_ANSWER_CAP
        ident = {"app": "http", "url": self.url, "request": self.request, "answer": answer_field, "contexts": contexts_field}
        if max_answer_chars is not None:  # the default keeps the identity of earlier runs
            ident["max_answer_chars"] = self.max_answer_chars
        self.identity = json.dumps(ident, sort_keys=True)

    def _body(self, question: str) -> dict:
        fill = lambda v: v.replace("{question}", question) if isinstance(v, str) else v  # noqa: E731
        return {k: fill(v) for k, v in self.request.items()}

    def _parse(self, raw: bytes) -> AppReply:
        data = json.loads(raw)
        try:  # a reply of the wrong shape is not retried: the app would answer the same
            reply = reply_of({"answer": _field(data, self.answer_field), "contexts": _field(data, self.contexts_field)},
                             self.max_answer_chars)  # fmt: skip
        except AppShapeError as e:
            raise GiveUp(f"AppShapeError: {e}") from None
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
