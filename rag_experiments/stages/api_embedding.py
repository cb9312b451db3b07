"""``embedding=openai``: vectors from any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI,
Azure-compatible gateways, vLLM, text-embeddings-inference, Ollama, llama.cpp's server, LiteLLM).

Every request goes through the one endpoint client (``stages.endpoint``: deadline, Retry-After,
redaction, limits, usage). **Identity is content**: the identity is the model name, the vector
dimension and a *fingerprint*, the sha256 of a fixed probe text's vector rounded to 3 decimals
(:func:`fingerprint`). Another model served under the same name answers the probe with another
vector, so its vectors get a new identity (a cache miss the vector cache explains,
``core.cache.CachedEmbedder``), and two servers of one model share their vectors.

The probe is also the config check (:func:`config_problems`): an endpoint that is unreachable,
refuses the key or the model, or answers with a malformed, NaN or wrongly-sized vector exits 2
naming the key, before any run. It is made once per process per (endpoint, dimensions, key).

After the probe, every fault of a reply (vectors of another or of mixed sizes, NaN/inf, a short or
empty ``data``, a reply over the size cap, 5xx after the retries, a body trickling past the
deadline, a call the budget refuses) raises :class:`EmbeddingFault`, a ``core.steps.StepFailed``:
the run is FAILED with the message as its ``failure_reason``, exit 1, no traceback, and no vector of
the call is cached. Each :meth:`OpenAIEmbedder.encode` embeds :data:`PROBE_TEXT` again with its last
request (one more input, no more requests): a vector that no longer matches the first probe's means
another model now answers under the same name, and the call fails before any of its vectors is
cached (:data:`MODEL_CHANGED`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rag_experiments.core.parallel import thread_map
from rag_experiments.core.steps import StepFailed
from rag_experiments.stages import call_budget, dry_calls
from rag_experiments.stages.endpoint import Endpoint, GiveUp
from rag_experiments.stages.endpoint_settings import SAMPLING, Takes

log = logging.getLogger(__name__)

Kind = Literal["query", "passage"]
#: The fixed text whose vector names the model behind an endpoint (never change it: every
#: recorded fingerprint would change with it).
PROBE_TEXT = "rag-experiments embedding fingerprint: the refund reaches the card within 5 business days."
FINGERPRINT_DECIMALS = 3  # coarse enough that two servers of one model agree, fine enough to tell models apart
#: Largest component difference (L2-normalised) of the probe's vector between the start and a later
#: request that is still the same model: a batch's padding moves a component by ~1e-6, the rounding of
#: the fingerprint by 5e-4; another model moves many by far more.
SAME_MODEL_TOLERANCE = 2 * 10.0**-FINGERPRINT_DECIMALS
MODEL_CHANGED = "the model behind `embedding.model` changed during the run"


class EmbeddingFault(StepFailed):
    """A reply fault after the startup probe: the run is FAILED with this reason (module docstring)."""


class EmbeddingEndpointError(ValueError):
    """An embeddings endpoint that cannot serve this config (bad input: exit 2, no run)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def fingerprint(vector: np.ndarray) -> str:
    """sha256 (16 hex) of the L2-normalised ``vector`` rounded to FINGERPRINT_DECIMALS decimals,
    written as text (``-0.000`` folded to ``0.000``)."""
    v = np.asarray(vector, dtype=np.float64)
    v = v / max(float(np.linalg.norm(v)), 1e-12)
    rounded = np.round(v, FINGERPRINT_DECIMALS) + 0.0
    text = ",".join(f"{x:.{FINGERPRINT_DECIMALS}f}" for x in rounded)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def batches(texts: list[str], batch_size: int, max_request_chars: int) -> list[tuple[int, int]]:
    """``[start, end)`` spans of ``texts``: at most ``batch_size`` texts and ``max_request_chars``
    characters per request (a longer text goes alone: the server truncates or refuses it)."""
    spans, start, chars = [], 0, 0
    for i, t in enumerate(texts):
        if i > start and (i - start >= batch_size or chars + len(t) > max_request_chars):
            spans.append((start, i))
            start, chars = i, 0
        chars += len(t)
    if start < len(texts):
        spans.append((start, len(texts)))
    return spans


def parse_embeddings(raw: bytes, n: int) -> tuple[list[list[float]], int]:
    """(vectors in input order, prompt tokens) of an ``/embeddings`` reply for ``n`` inputs.

    A reply with another count, a missing index or a non-numeric vector is malformed (retried);
    a NaN/inf component is refused for good (:class:`GiveUp`: the model, not the wire, is wrong)."""
    body = json.loads(raw)
    rows = body["data"]
    if not isinstance(rows, list) or len(rows) != n:
        raise ValueError(f"malformed reply: {len(rows) if isinstance(rows, list) else 'no'} vectors for {n} inputs")
    ordered = sorted(rows, key=lambda r: int(r.get("index", 0)))
    if [int(r.get("index", i)) for i, r in enumerate(ordered)] != list(range(n)):
        raise ValueError("malformed reply: the vectors' indexes are not 0..n-1")
    vecs = [r.get("embedding") for r in ordered]
    dims = {len(v) if isinstance(v, list) else -1 for v in vecs}
    if len(dims) != 1 or -1 in dims or 0 in dims:  # the same reply again would be as wrong
        shown = ", ".join("not a list" if d < 0 else f"{d}-d" for d in sorted(dims))
        raise GiveUp(f"malformed reply: vectors of mixed sizes ({shown}) in one reply")
    for v in vecs:
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
            raise ValueError("malformed reply: a vector component is not a number")
        if not all(math.isfinite(x) for x in v):
            raise GiveUp("the endpoint returned a NaN/inf vector component")
    usage = body.get("usage") or {}
    tokens = usage.get("prompt_tokens", usage.get("total_tokens", 0))
    return vecs, int(tokens) if isinstance(tokens, int | float) and not isinstance(tokens, bool) else 0


@dataclass(frozen=True)
class Probe:
    """What the probe request learned: the vector, or the problems naming the keys."""

    vector: tuple[float, ...] = ()
    problems: tuple[str, ...] = ()


_PROBES: dict[tuple, Probe] = {}
_PROBES_LOCK = threading.Lock()


def _key_digest(api_key_env: str | None) -> str:
    value = os.environ.get(api_key_env or "") or ""
    return hashlib.sha256(value.encode()).hexdigest()[:12]  # the key's value never enters a dict key


def probe(endpoint: Endpoint, dimensions: int | None, api_key_env: str | None, where: str = "conf/embedding") -> Probe:
    """Embed :data:`PROBE_TEXT` once per process per (endpoint, dimensions, key): the config
    check's one request and the fingerprint's source."""
    key = (endpoint.key, dimensions, api_key_env, _key_digest(api_key_env))
    with _PROBES_LOCK:
        if key in _PROBES:
            return _PROBES[key]
    body: dict = {"model": endpoint.model, "input": [PROBE_TEXT], "encoding_format": "float"}
    if dimensions:
        body["dimensions"] = int(dimensions)
    reply = endpoint.post("/embeddings", body, lambda raw: parse_embeddings(raw, 1))
    if reply.error:
        result = Probe(problems=tuple(_probe_problems(reply.status, reply.error, endpoint, api_key_env, where)))
    else:
        vec = reply.data[0][0]
        if dimensions and len(vec) != int(dimensions):
            result = Probe(problems=(
                f"{where}: dimensions: the endpoint returned {len(vec)}-d vectors for dimensions={dimensions} "
                "(the model does not shorten vectors; drop the key or use a model that does)",
            ))  # fmt: skip
        else:
            result = Probe(vector=tuple(float(x) for x in vec))
    if not result.problems or reply.status in (400, 401, 403, 404):  # a transient failure is asked again
        with _PROBES_LOCK:
            _PROBES[key] = result
    return result


def _probe_problems(status: int | None, error: str, endpoint: Endpoint, api_key_env: str | None, where: str) -> list[str]:
    """The config key to blame for a failed probe, by the reply's status."""
    if status in (401, 403):
        return [f"{where}: api_key_env: the endpoint {endpoint.base_url} refused the key in "
                f"{api_key_env or '(no key: api_key_env=null)'} (HTTP {status})"]  # fmt: skip
    if status in (400, 404, 422):
        return [f"{where}: model: the endpoint {endpoint.base_url} refused an embeddings request for "
                f"model {endpoint.model!r} ({error[:200]})"]  # fmt: skip
    return [f"{where}: base_url: the embeddings endpoint {endpoint.base_url}/embeddings did not answer "
            f"the probe request ({error[:240]})"]  # fmt: skip


class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint as an embedder (module docstring).

    ``dimensions``: sent to models that shorten vectors (text-embedding-3-*); None sends nothing.
    Requests hold at most ``batch_size`` texts and ``max_request_chars`` characters (about a
    quarter as many tokens: OpenAI allows 300,000 tokens per request, 8,192 per input), and
    ``concurrency`` of them are in flight. ``price_per_1k_tokens`` prices the endpoint usage record.
    ``max_concurrency``/``rpm``/``tpm``: the endpoint's limits (``stages.endpoint``).
    """

    ENDPOINT = Takes(without=SAMPLING, api_key_env="OPENAI_API_KEY")  # no sampling: vectors

    def __init__(
        self,
        base_url: str,
        model: str,
        dimensions: int | None = None,
        batch_size: int = 64,
        max_request_chars: int = 100_000,
        query_prefix: str = "",
        passage_prefix: str = "",
        price_per_1k_tokens: float = 0.0,
        **endpoint: Any,
    ) -> None:
        s = self.settings = self.ENDPOINT.settings(endpoint, base_url=base_url, model=model)
        self.base_url, self.model = s.base_url, s.model
        self.dimensions = int(dimensions) if dimensions else None
        self.batch_size, self.max_request_chars = int(batch_size), int(max_request_chars)
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.concurrency = s.concurrency
        self.price_per_1k_tokens = float(price_per_1k_tokens)
        self._endpoint = Endpoint.of(s, "embedding.timeout_s")
        call_budget.set_price(self._endpoint.key, self.price_per_1k_tokens, 0.0)
        found = probe(self._endpoint, self.dimensions, s.api_key_env)
        if found.problems:
            raise EmbeddingEndpointError(list(found.problems))
        self.dim = len(found.vector)
        self._probe_vector = found.vector
        self.fingerprint = fingerprint(np.asarray(found.vector))
        #: what the endpoint is called, whatever answers: the vector cache reports a new fingerprint under it
        self.identity_name = f"openai-embeddings {self.base_url} {self.model} dimensions={self.dimensions}"
        self.identity = json.dumps(
            {
                "kind": "openai-embeddings",
                "model": self.model,
                "dimensions": self.dim,
                "fingerprint": self.fingerprint,
                "query_prefix": query_prefix,
                "passage_prefix": passage_prefix,
            },
            sort_keys=True,
        )

    def encode(self, texts: list[str], kind: Kind = "passage") -> np.ndarray:
        """L2-normalised float32 rows, one per text; any request failing for good, or the model
        behind the name changing, raises :class:`EmbeddingFault` (a missing vector would silently
        drop a chunk from retrieval; another model's vectors would mix two spaces)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        prefix = self.query_prefix if kind == "query" else self.passage_prefix
        inputs = [prefix + t for t in texts] + [PROBE_TEXT]  # the probe again, in the last request
        spans = batches(inputs, self.batch_size, self.max_request_chars)
        where = f"embedding: {self.base_url}/embeddings ({self.model})"

        def one(span: tuple[int, int]) -> list[list[float]]:
            part = inputs[span[0] : span[1]]
            body: dict = {"model": self.model, "input": part, "encoding_format": "float"}
            if self.dimensions:
                body["dimensions"] = self.dimensions
            reply = self._endpoint.post("/embeddings", body, lambda raw: parse_embeddings(raw, len(part)))
            if reply.error:  # a budget stop says how to resume, as every step's does
                budget = reply.error.startswith("budget:") and call_budget.stop_reason()
                raise EmbeddingFault(f"{where}: {budget or reply.error}")
            vecs = reply.data[0]  # post() counted the tokens and their cost
            if len(vecs[0]) != self.dim:
                raise EmbeddingFault(f"{where}: the endpoint returned {len(vecs[0])}-d vectors; its probe's "
                                     f"were {self.dim}-d (embedding.dimensions={self.dimensions})")  # fmt: skip
            return vecs

        parts = thread_map(one, spans, self.concurrency)  # Ctrl-C aborts the client via core.parallel
        rows = [v for p in parts for v in p]
        x = np.asarray(rows[:-1], dtype=np.float32)
        self._same_model(np.asarray(rows[-1], dtype=np.float64), where)
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        return x / np.maximum(norms, 1e-12)

    def _same_model(self, vector: np.ndarray, where: str) -> None:
        """The probe text's vector now against the one the identity was made from."""
        if dry_calls.active():  # placeholders: no model answered
            return
        unit = lambda v: v / max(float(np.linalg.norm(v)), 1e-12)  # noqa: E731
        drift = float(np.abs(unit(vector) - unit(np.asarray(self._probe_vector))).max())
        if drift > SAME_MODEL_TOLERANCE:
            raise EmbeddingFault(f"{MODEL_CHANGED} ({where}: the probe text's vector moved by {drift:.3g}, "
                                 f"fingerprint was {self.fingerprint}); nothing of this step is cached")  # fmt: skip
