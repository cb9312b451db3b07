"""The endpoint client's dry mode (``dry_run=true``, docs/endpoints.md "Dry run").

While :func:`start` is in force, :meth:`stages.endpoint.Endpoint.post` sends nothing: it records the
request it would send (:class:`DryCall`: the real body the real step built) and hands the caller's
parser a placeholder reply of the shape that path answers with (:func:`placeholder`), so the real
steps run on the eval set without network and the calls they would make are counted, not guessed.

- **input tokens**: ``ceil(chars / 4)`` of the text the request carries (chat messages' contents,
  embedding inputs, the query and documents of a rerank, else the JSON body): the same
  4-characters-a-token rule the budget's bound uses (``call_budget.CHARS_PER_TOKEN``);
- **output tokens**: the request's ``max_tokens`` (an upper bound: a model may stop sooner), 0 for
  paths that answer no text (embeddings, rerank);
- **cost**: :func:`stages.call_budget.reply_cost` of those tokens at the endpoint's prices, the
  table the budget and ``cost_usd`` read; None where the endpoint has no price;
- **the placeholder answer** has :data:`CLAIMS_PER_ANSWER` sentences, one claim each, so the judge
  calls that depend on an answer's claims are counted under that stated assumption; an LLM judge's
  decomposition of any answer (a cached real one too) lists its own sentence claims
  (``judge.llm.LLMJudge.split``).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import dataclass

from rag_experiments.stages import call_budget

#: claims in an answer the dry run has not seen (one not in the cache): the judge's calls per answer
#: follow from it (a verdict call per claim), so it is printed with the estimate
CLAIMS_PER_ANSWER = 3
PLACEHOLDER_DIMS = 8  # the length of a placeholder embedding when the request names no ``dimensions``


def placeholder_answer(request: object) -> str:
    """The answer to ``request``: :data:`CLAIMS_PER_ANSWER` claim lines naming a digest of the
    request, so two requests' answers share no claim (a real model's answers to two prompts differ:
    their verdicts are not one cache entry) while one request always gets the same answer."""
    tag = hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()[:10]
    words = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    return "\n".join(
        f"- The placeholder answer states fact {w} about topic {tag}." for w in words[:CLAIMS_PER_ANSWER]
    )


@dataclass
class DryCall:
    """One request the dry run would send."""

    key: str  # stages.endpoint.endpoint_key
    path: str
    tokens_in: int
    tokens_out: int  # the request's max_tokens: an upper bound
    usd: float | None  # at the endpoint's prices; None: the endpoint has no price
    bound: float = 0.0  # what the budget reserves for it (``call_budget.call_bound``)
    step: str = ""  # the core.slots name of the step that made it ("" outside any step)


_LOCK = threading.Lock()
_ON: list[bool] = [False]
_CALLS: list[DryCall] = []


def start() -> None:
    """Dry mode on: every ``Endpoint.post`` records its request and sends nothing."""
    with _LOCK:
        _ON[0] = True
        _CALLS.clear()


def stop() -> None:
    with _LOCK:
        _ON[0] = False


def active() -> bool:
    return _ON[0]


def calls() -> list[DryCall]:
    with _LOCK:
        return list(_CALLS)


def mark() -> int:
    """The number of calls recorded so far (``label`` tags the ones after it)."""
    with _LOCK:
        return len(_CALLS)


def label(since: int, step: str) -> None:
    """Tag the calls recorded after ``since`` that no step claimed yet with ``step``."""
    with _LOCK:
        for c in _CALLS[since:]:
            c.step = c.step or step


def request_tokens(path: str, body: dict) -> int:
    """``ceil(chars / 4)`` of the text a request carries (module docstring)."""
    if path.endswith("/chat/completions"):
        chars = sum(len(m.get("content") or "") if isinstance(m.get("content"), str) else len(json.dumps(m.get("content")))
                    for m in body.get("messages") or [])  # fmt: skip
    elif path.endswith("/embeddings"):
        inputs = body.get("input")
        chars = sum(len(str(x)) for x in (inputs if isinstance(inputs, list) else [inputs]))
    elif path.endswith("/rerank"):
        chars = len(str(body.get("query") or "")) + sum(len(str(d)) for d in body.get("documents") or [])
    else:
        chars = len(json.dumps(body, ensure_ascii=False))
    return math.ceil(chars / call_budget.CHARS_PER_TOKEN)


def record(key: str, path: str, body: dict) -> DryCall:
    """Record the request ``body`` to ``path`` at the endpoint ``key``."""
    tin = request_tokens(path, body)
    tout = (
        int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        if path.endswith("/chat/completions")
        else 0
    )
    usd = (
        call_budget.reply_cost(key, {"prompt_tokens": tin, "completion_tokens": tout})
        if call_budget.priced(key)
        else None
    )
    call = DryCall(key, path, tin, tout, usd, call_budget.call_bound(key, body))
    with _LOCK:
        _CALLS.append(call)
    return call


def chat_reply(body: dict, text: str | None = None) -> bytes:
    """A chat completion answering ``text`` (default: :data:`CLAIMS_PER_ANSWER` claim sentences),
    with first-token logprobs (yes over no) when the request asks for them; the fields of OpenAI's
    reply that strict readers require (MLflow's judge reads ``id``)."""
    choice: dict = {
        "index": 0,
        "message": {"role": "assistant", "content": text or placeholder_answer(body.get("messages"))},
        "finish_reason": "stop",
    }
    if body.get("logprobs"):
        tops = [{"token": "yes", "logprob": -0.1}, {"token": "no", "logprob": -2.4}]
        choice["logprobs"] = {"content": [{"token": "yes", "logprob": -0.1, "top_logprobs": tops}]}
    reply = {"id": "dry-run", "object": "chat.completion", "created": 0, "model": body.get("model", ""),
             "choices": [choice], "usage": {"prompt_tokens": 0, "completion_tokens": 0}}  # fmt: skip
    return json.dumps(reply).encode()


def _vector(text: str, dims: int) -> list[float]:
    """A deterministic non-zero placeholder vector of ``text`` (no model: retrieval over these ranks
    at random, which changes which chunks a prompt carries, not how many)."""
    digest = hashlib.sha256(text.encode()).digest()
    return [(digest[i % len(digest)] + 1) / 256.0 for i in range(dims)]


def placeholder(path: str, body: dict) -> bytes:
    """The reply of the shape ``path`` answers with: a chat completion, embeddings, rerank scores;
    anything else an empty JSON object (a caller with its own reply shape
    passes ``dry`` to ``Endpoint.post``)."""
    if path.endswith("/chat/completions"):
        return chat_reply(body)
    if path.endswith("/embeddings"):
        inputs = body.get("input")
        inputs = inputs if isinstance(inputs, list) else [inputs]
        dims = int(body.get("dimensions") or PLACEHOLDER_DIMS)
        rows = [{"index": i, "embedding": _vector(str(x), dims)} for i, x in enumerate(inputs)]
        return json.dumps({"data": rows, "usage": {"prompt_tokens": 0}}).encode()
    if path.endswith("/rerank"):
        n = len(body.get("documents") or [])
        return json.dumps(
            {"results": [{"index": i, "relevance_score": 1.0 / (1 + i)} for i in range(n)]}
        ).encode()
    return b"{}"
