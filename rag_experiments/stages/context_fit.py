"""Fit the retrieved context into the generator's window instead of sending a prompt it rejects.

The local llama.cpp generator (``generator=local``) has a known window: a prompt may use
``ctx_size - max_tokens`` tokens (:func:`prompt_budget`; llama.cpp answers HTTP 400 beyond it), counted
as its server templates and tokenizes the messages (:func:`llama_count_tokens`). For it, each query's top-k chunks are kept in rank
order and the context is cut, at a character boundary, to the longest prefix whose rendered prompt
fits; chunks past the cut are dropped and the last kept chunk is shortened (its ``end`` moves with
it, so it stays a span of its document). The generator, the judge and the per-query ``context``
column all see the fitted context; ``context_truncated`` says which queries were cut and the run
logs how many (``n_context_truncated``). Generators without a known window (remote endpoints) are
left alone.

Counting is skipped when a prompt cannot exceed the budget: a byte-level BPE token covers at least
one byte, so ``utf8 bytes + TEMPLATE_SLACK`` tokens bounds any prompt. Counts are cached by
(generator identity, messages), so a cached run starts no server; a dry run (``stages.dry_calls``)
counts 4 characters a token and starts none either.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

from rag_experiments.core.cache import StageCache, stage_key
from rag_experiments.core.types import Chunk
from rag_experiments.stages import dry_calls
from rag_experiments.stages.endpoint import Endpoint

log = logging.getLogger(__name__)

TEMPLATE_SLACK = 64  # chat-template tokens (role markers, BOS) on top of the messages' bytes


def _upper_bound(messages: list[dict]) -> int:
    return sum(len(str(m.get("content", "")).encode()) for m in messages) + TEMPLATE_SLACK


def prompt_budget(generator) -> int | None:
    """Tokens a prompt may use (``ctx_size - max_tokens``) for a generator with a ``ctx_size``
    (the local llama.cpp server); None for endpoints whose window we do not know."""
    ctx = getattr(generator, "ctx_size", None)
    if not ctx:
        return None
    return int(ctx) - int(json.loads(generator.identity).get("max_tokens", 0))


_TOKENIZERS: dict[str, Endpoint] = {}


def _tokenizer(root: str) -> Endpoint:
    if root not in _TOKENIZERS:
        _TOKENIZERS[root] = Endpoint(root, "tokenizer", timeout_s=60, max_retries=2, what="tokenizer timeout_s")
    return _TOKENIZERS[root]


def _post(root: str, path: str, body: dict, field: str):
    reply = _tokenizer(root).post(path, body, lambda raw: json.loads(raw)[field])
    if reply.error:
        raise RuntimeError(f"llama.cpp {path} at {root}: {reply.error}")
    return reply.data


def llama_count_tokens(generator, messages: list[dict]) -> int:
    """Tokens of ``messages`` as the llama.cpp server templates (``/apply-template``) and
    tokenizes (``/tokenize``) them, through the endpoint client (deadline, retries, abort)."""
    root = generator.base_url.removesuffix("/v1")
    prompt = _post(root, "/apply-template", {"messages": messages}, "prompt")
    return len(_post(root, "/tokenize", {"content": prompt, "add_special": True}, "tokens"))


def _counter(generator, cache: StageCache):
    def count(messages: list[dict]) -> int:
        key = stage_key("generation", "prompt_tokens", generator.identity, messages)
        hit = cache.get_json_many("prompt_tokens", [key])
        if key in hit:
            return int(hit[key])
        if dry_calls.active():  # a dry run counts, starting no server: the budget's 4 characters a token
            return dry_calls.request_tokens("/chat/completions", {"messages": messages})
        n = llama_count_tokens(generator, messages)
        cache.put_json_many("prompt_tokens", {key: n})
        return n

    return count


def _cut(chunks: list[Chunk], n_chars: int) -> list[Chunk]:
    """The first ``n_chars`` characters of the chunks' texts, in rank order (whole chunks first)."""
    out, left = [], n_chars
    for c in chunks:
        if left <= 0:
            break
        if len(c.text) <= left:
            out.append(c)
        else:
            out.append(replace(c, end=c.start + left, text=c.text[:left]))
        left -= len(c.text)
    return out


def fit_history(prompt, query: str, chunks: list[Chunk], history: list[dict], budget: int, count) -> tuple[list[dict], int]:
    """(the conversation turns the prompt keeps, how many user turns were cut): the oldest user turn
    (with its assistant reply) is dropped until the prompt with every chunk fits ``budget``, or no
    turn is left (docs/conversations.md: the history is cut before the context)."""
    cut = 0
    while (kept := prompt.recent(history, cut)) and _upper_bound(prompt.render(query, chunks, kept)) > budget:
        if count(prompt.render(query, chunks, kept)) <= budget:
            break
        cut += 1
    return kept, cut


def fit_context(prompt, query: str, chunks: list[Chunk], budget: int, count, history=None) -> tuple[list[Chunk], bool]:
    """(chunks whose rendered prompt fits ``budget`` tokens, whether they were cut); ``history``:
    the conversation turns the prompt shows (already fitted by :func:`fit_history`).

    Starts from the proportional estimate ``chars * budget / tokens`` and shrinks by 10 % until
    the count fits (a few counts per over-long query). Raises ValueError when even the prompt
    without any context does not fit.
    """
    render = (lambda q, cs: prompt.render(q, cs, history)) if history else prompt.render  # noqa: E731
    messages = render(query, chunks)
    if _upper_bound(messages) <= budget:
        return chunks, False
    total = count(messages)
    if total <= budget:
        return chunks, False
    chars = sum(len(c.text) for c in chunks)
    n = int(chars * budget / total)
    while n > 0:
        cut = _cut(chunks, n)
        if count(render(query, cut)) <= budget:
            return cut, True
        n = int(n * 0.9)
    if count(render(query, [])) > budget:
        raise ValueError(
            f"the prompt without any context needs more than {budget} tokens: raise generator.ctx_size "
            "or lower generator.max_tokens"
        )
    return [], True


def fit_contexts(stages, rows: list[dict], subset: list[int], contexts: list[list[Chunk]], cache: StageCache,
                 histories: list[list[dict]] | None = None):  # fmt: skip
    """The top-k ``contexts`` of the ``subset`` items, each fitted by ``fit_context`` to the window
    of ``stages.generator`` (unchanged for a generator without a known window). Sets every per-query
    row's ``context_truncated`` (False outside the subset). ``histories`` (a prompt with
    ``history_turns``): each item's conversation, cut oldest turn first to the window before the
    context is (:func:`fit_history`), in place; the user turns cut are the row's
    ``history_turns_cut``."""
    for row in rows:
        row["context_truncated"] = False
    budget = prompt_budget(stages.generator)
    if budget is None:
        return contexts
    count = _counter(stages.generator, cache)
    fitted = []
    for j, (i, cs) in enumerate(zip(subset, contexts, strict=True)):
        history = None
        if histories is not None and stages.prompt.history_turns:
            histories[j], rows[i]["history_turns_cut"] = fit_history(stages.prompt, rows[i]["query"], cs, histories[j],
                                                                     budget, count)  # fmt: skip
            history = histories[j]
        chunks, cut = fit_context(stages.prompt, rows[i]["query"], cs, budget, count, history)
        rows[i]["context_truncated"] = cut
        fitted.append(chunks)
    n_cut = sum(rows[i]["context_truncated"] for i in subset)
    if n_cut:
        log.warning(
            "context cut to the generator's window (generator.ctx_size minus max_tokens = %d tokens) "
            "for %d of %d queries: see the per-query column context_truncated",
            budget,
            n_cut,
            len(subset),
        )
    return fitted
