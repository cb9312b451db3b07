"""Rerankers: re-score the first stage's candidates, between retrieval and generation.

The retriever ranks every query ``rerank.candidates`` deep (the *first stage*); a reranker gives
each (query, candidate text) pair a score and the candidates are re-sorted by it, best first
(ties: first-stage order). The generator gets the top ``retriever.k`` of the reranked list and the
retrieval metrics score it; ranks past ``candidates`` keep the first stage's order
(``rerank_order``). ``identity`` names everything that determines the scores: the model's weight
bytes (never its path) and the settings; the pipeline caches scores per query by
(identity, query, candidate texts), so changing the reranker never recomputes chunking, embedding
or the first stage (docs/stages.md).

- ``DenseReranker``: a bi-encoder (any embedder) re-scores the candidates, cos(q, c). BM25 → dense
  needs no vector index of the whole corpus: only the candidates are embedded.
- ``CrossEncoderReranker``: a sentence-transformers ``CrossEncoder`` from a local directory.
- ``LLMReranker``: pointwise, an OpenAI-compatible chat endpoint rates each (query, passage) 0-10.
- ``EndpointReranker``: an HTTP rerank API in the Cohere/Jina shape (``POST {base_url}/rerank``
  with ``{"model", "query", "documents", "top_n"}`` → ``{"results": [{"index", "relevance_score"}]}``),
  which Jina, vLLM, llama.cpp's server (``/v1/rerank``) and Cohere's v2 API answer; TEI's
  ``/rerank`` list reply (``[{"index", "score"}]``) is read too.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rag_experiments.core.identity import dir_sha256, unreadable_weights
from rag_experiments.core.parallel import thread_map
from rag_experiments.core.redaction import redact
from rag_experiments.stages.endpoint import Endpoint
from rag_experiments.stages.endpoint_settings import SAMPLING, Takes
from rag_experiments.stages.replies import ParseError, parse_score

log = logging.getLogger(__name__)


class Reranker(Protocol):
    """``candidates``: how deep the first stage ranks for it (>= retriever.k)."""

    identity: str
    candidates: int

    def score(self, queries: list[str], texts: list[list[str]]) -> list[np.ndarray]: ...


class RerankError(RuntimeError):
    """One query could not be reranked (an endpoint that kept failing): it keeps first-stage order."""


def rerank_order(first: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """The reranked list of one query: its first ``len(scores)`` first-stage candidates sorted by
    ``scores`` descending (ties: first-stage order, a stable sort), then the rest of ``first`` in
    first-stage order. ``first`` pads with -1; padded slots stay last."""
    head = first[: len(scores)]
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    return np.concatenate([head[order], first[len(scores) :]])


def _cos(q: np.ndarray, m: np.ndarray) -> np.ndarray:
    """cos(q, m_i) = q · m_i for L2-normalised rows (every embedder returns those)."""
    return (m @ q).astype(np.float32)


class DenseReranker:
    """Re-score candidates with a bi-encoder: score(q, c) = cos(E(q), E(c)).

    ``embedding``: an embedder (an ``embedding`` option's node; the sweep wraps it in the vector
    cache). Only the candidates' texts are embedded, each distinct text once per ``score`` call;
    the pipeline hands it up to ``query_batch`` queries per call, so a run embeds the union of its
    candidates once (the vector cache commits it in blocks: a killed run resumes from the last
    block). Its ``latency_rerank_s`` is therefore that cost amortised over the queries; a server
    that embeds each query's candidates alone pays more (docs/stages.md measures both).
    """

    query_batch = 4096

    def __init__(self, embedding, candidates: int = 50) -> None:
        self.embedder = embedding
        self.candidates = int(candidates)
        self.identity = json.dumps({"reranker": "dense", "embedder": embedding.identity}, sort_keys=True)

    def score(self, queries: list[str], texts: list[list[str]]) -> list[np.ndarray]:
        unique = sorted({t for ts in texts for t in ts})
        where = {t: i for i, t in enumerate(unique)}
        passages = self.embedder.encode(unique, kind="passage") if unique else np.zeros((0, 1), np.float32)
        q = self.embedder.encode(list(queries), kind="query")
        return [
            _cos(q[i], passages[[where[t] for t in ts]]) if ts else np.zeros(0, np.float32)
            for i, ts in enumerate(texts)
        ]


def is_cross_encoder(path: str | os.PathLike) -> bool:
    """A local model directory a ``CrossEncoder`` can load: its ``config.json`` names a
    ``*ForSequenceClassification`` architecture (a bi-encoder's names ``BertModel`` or the like)."""
    cfg = Path(path).expanduser() / "config.json"
    try:
        archs = json.loads(cfg.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return False
    return any(str(a).endswith("ForSequenceClassification") for a in archs)


_MODELS: dict[str, object] = {}  # one load per process per (dir, max_length)


class CrossEncoderReranker:
    """A sentence-transformers ``CrossEncoder`` from ``path`` (a local directory, never a download):
    score(q, c) = the model's score for the pair (one label: sigmoid of the logit, monotone, so the
    ranking is the logit's; several labels: the first).

    Public models a user would point it at: cross-encoder/ms-marco-MiniLM-L6-v2 (22M parameters),
    BAAI/bge-reranker-base, mixedbread-ai/mxbai-rerank-xsmall-v1 (download once, then ``path=``).
    """

    remote = False  # a local model only: no request to count (a dry run does not run it, run.dry_run)

    def __init__(self, path: str, candidates: int = 50, batch_size: int = 32, max_length: int = 512) -> None:
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise FileNotFoundError(f"rerank.path: model directory not found: {self.path}")
        if not is_cross_encoder(self.path):
            raise FileNotFoundError(
                f"rerank.path: not a cross-encoder (no *ForSequenceClassification in config.json): {self.path}"
            )
        if why := unreadable_weights(self.path):
            raise FileNotFoundError(f"rerank.path: unreadable weights: {why}")
        self.candidates = int(candidates)
        self.batch_size, self.max_length = int(batch_size), int(max_length)
        self.identity = json.dumps(
            {
                "reranker": "cross_encoder",
                "weights_sha256": dir_sha256(self.path),
                "max_length": self.max_length,
            },
            sort_keys=True,
        )

    @property
    def model(self):
        key = f"{self.path}|{self.max_length}"
        if key not in _MODELS:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import CrossEncoder

            _MODELS[key] = CrossEncoder(str(self.path), device="cpu", max_length=self.max_length)
        return _MODELS[key]

    def score(self, queries: list[str], texts: list[list[str]]) -> list[np.ndarray]:
        pairs = [(q, t) for q, ts in zip(queries, texts, strict=True) for t in ts]
        flat = np.zeros(0, np.float32)
        if pairs:
            raw = np.asarray(
                self.model.predict(
                    pairs, batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True
                ),
                dtype=np.float32,
            )
            flat = raw[:, 0] if raw.ndim == 2 else raw
        out, at = [], 0
        for ts in texts:
            out.append(flat[at : at + len(ts)])
            at += len(ts)
        return out


class EndpointReranker:
    """An HTTP rerank API (Cohere/Jina shape, see the module docstring): one request per query,
    through the endpoint client (``stages.endpoint``: ``timeout_s`` over the whole attempt, body
    included; retries with ``Retry-After``; the key from ``api_key_env``, redacted from every
    error). A reply must score every document once with a finite number (:func:`parse_scores`). A
    query that still fails raises ``RerankError`` (the pipeline keeps its first-stage order and
    counts it; every query failing fails the run).
    """

    query_batch = 1  # the pipeline asks one query at a time: a failure costs only that query

    # no sampling; one request at a time (query_batch), so no concurrency of its own
    ENDPOINT = Takes(without=(*SAMPLING, "concurrency"), model_required=False, timeout_s=30.0)

    def __init__(
        self,
        base_url: str,
        model: str = "",
        candidates: int = 50,
        max_length: int | None = None,
        **endpoint: Any,
    ) -> None:
        s = self.settings = self.ENDPOINT.settings(endpoint, base_url=base_url, model=model)
        self.base_url, self.model = s.base_url, model
        self.candidates = int(candidates)
        self.max_length = max_length
        self.endpoint = Endpoint.of(s, "rerank.timeout_s", in_flight=False)
        # the endpoint and model name, as the generator's identity does (the weights are remote)
        self.identity = json.dumps(
            {"reranker": "endpoint", "base_url": self.base_url, "model": model, "max_length": max_length},
            sort_keys=True,
        )

    def _post(self, query: str, docs: list[str]) -> np.ndarray:
        body = {"model": self.model, "query": query, "documents": docs, "top_n": len(docs)}
        if self.max_length:
            body["max_tokens_per_doc"] = int(self.max_length)
        reply = self.endpoint.post("/rerank", body, lambda raw: parse_scores(json.loads(raw), len(docs)))
        if reply.error:
            raise RerankError(f"{self.base_url}/rerank: {'not retried: ' if reply.gave_up else ''}{reply.error}")
        return reply.data

    def score(self, queries: list[str], texts: list[list[str]]) -> list[np.ndarray]:
        return [
            self._post(q, ts) if ts else np.zeros(0, np.float32) for q, ts in zip(queries, texts, strict=True)
        ]


LLM_PROMPT = (
    "Rate how well the passage answers the question, from 0 (unrelated) to 10 (answers it fully).\n"
    "Reply with the number only.\n\nQuestion: {query}\n\nPassage:\n{passage}"
)
class LLMReranker:
    """Pointwise LLM reranking: score(q, c) = the one number on the 0-10 scale in the chat model's
    reply to ``prompt`` (``{query}``, ``{passage}``; ``replies.parse_score``: a reply with no number,
    several, or one off the scale is a parse error), asked once per candidate at temperature 0.

    Through ``stages.generation.OpenAICompatibleGenerator`` (a local llama.cpp server's ``/v1`` or
    any OpenAI-compatible endpoint), so the generator's timeout, retry and redaction rules apply.
    A query with a failed call or an unparseable reply raises ``RerankError``: the pipeline keeps
    its first-stage order and counts it (``n_rerank_errors``). ``identity``: the endpoint's
    (base URL, model, sampling) and the prompt text.
    """

    query_batch = 1  # one query per call: a failure costs only that query
    calls_per_candidate = 1  # one model call per (query, candidate): run.retrieval.warn_rerank_cost
    prompt_name = "rerank.llm"  # its prompt in MLflow's Prompt Registry: rag-experiments.rerank.llm

    ENDPOINT = Takes(without=("temperature", "seed"), max_tokens=8)  # rated at temperature 0, seed 0

    def __init__(
        self, base_url: str, model: str, candidates: int = 20, prompt: str = LLM_PROMPT, **endpoint: Any
    ) -> None:
        from rag_experiments.stages.generation import OpenAICompatibleGenerator

        self.settings = self.ENDPOINT.settings(endpoint, base_url=base_url, model=model)
        self.client = OpenAICompatibleGenerator(base_url, model, **self.settings.keywords("base_url", "model"))
        self.candidates, self.prompt = int(candidates), prompt
        self.identity = json.dumps(
            {"reranker": "llm", "llm": self.client.identity, "prompt": prompt}, sort_keys=True
        )

    def _one(self, query: str, passage: str) -> float:
        reply = self.client.complete(
            [{"role": "user", "content": self.prompt.format(query=query, passage=passage)}], dry_text="5"
        )
        if reply.error:
            raise RerankError(f"{self.client.base_url}: {reply.error}")
        try:
            return parse_score(reply.text, 0.0, 10.0)
        except ParseError as e:
            raise RerankError(f"unparseable reply {redact(reply.text or '')[:80]!r}: {e}") from None

    def score(self, queries: list[str], texts: list[list[str]]) -> list[np.ndarray]:
        # core.parallel's pool: on Ctrl-C/SIGTERM the queued calls never start and the endpoint
        # client fails the in-flight ones at once
        return [
            np.asarray(thread_map(lambda t, q=q: self._one(q, t), ts, self.client.concurrency), dtype=np.float32)
            for q, ts in zip(queries, texts, strict=True)
        ]


def parse_scores(reply, n: int) -> np.ndarray:
    """Scores by document index from ``{"results": [{"index", "relevance_score"}]}`` (Cohere,
    Jina, vLLM, llama.cpp) or ``[{"index", "score"}]`` (TEI): every index an integer in 0..n-1
    exactly once, every score a finite number; anything else is a ``ParseError``."""
    rows = reply["results"] if isinstance(reply, dict) else reply
    if not isinstance(rows, list) or len(rows) != n:
        raise ParseError(f"expected a score for each of {n} documents, got {len(rows) if isinstance(rows, list) else 0}")
    out = np.full(n, np.nan, dtype=np.float64)
    for row in rows:
        i, x = row["index"], row["relevance_score"] if "relevance_score" in row else row["score"]
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n or not math.isnan(out[i]):
            raise ParseError(f"invalid or repeated document index {i!r} (expected 0..{n - 1}, each once)")
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
            raise ParseError(f"score {x!r} of document {i} is not a finite number")
        out[i] = x
    return out.astype(np.float32)


def timed_scores(reranker, queries: list[str], texts: list[list[str]]) -> tuple[list[np.ndarray], float]:
    """``reranker.score`` and the wall time per query of the call, seconds."""
    t = time.perf_counter()
    out = reranker.score(queries, texts)
    return out, (time.perf_counter() - t) / max(len(queries), 1)
