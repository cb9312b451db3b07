"""Config checks of remote endpoints (``config_schema`` calls them on its ``_Group``):

- :func:`limit_problems`: an endpoint's limits, on any group that declares them
  (``max_concurrency`` in [1, 1024], ``rpm`` in (0, 1e6], ``tpm`` in (0, 1e9]);
- :func:`embedding_endpoint_problems`: ``embedding=openai``'s keys, then one probe request
  (``stages.api_embedding.probe``): an endpoint that is unreachable, refuses the key or the model,
  or answers with NaN or wrongly-sized vectors exits 2 naming the key, before any run;
- :func:`budget_problems`: ``budget.max_calls`` >= 1, ``budget.max_usd`` > 0 and not smaller than
  the first call can cost; :func:`apply_budget` hands the budget and the prices to
  ``stages.call_budget`` when the stages are built.
"""

from __future__ import annotations

import math
from typing import Any

from rag_experiments.stages.call_budget import CHARS_PER_TOKEN

#: key → (low, high, low excluded?, integer?): the ranges a limit may take
LIMITS = {
    "max_concurrency": (1, 1024, False, True),
    "rpm": (0, 1_000_000, True, False),
    "tpm": (0, 1_000_000_000, True, False),
}


def limit_problems(g: Any) -> None:
    """Each limit key ``g`` holds, in its range (None: no limit)."""
    from rag_experiments.run.config_types import is_int, is_num

    for key, (low, high, open_low, integer) in LIMITS.items():
        g.checked.add(key)
        if not g.has(key):
            continue
        v = g.node[key]
        fits = is_int(v) if integer else is_num(v)
        if not fits or not (v > low if open_low else v >= low) or v > high:
            kind = "an integer" if integer else "a number"
            g.bad(key, f"must be {kind} in {'(' if open_low else '['}{low}, {high}] or null (no limit)", v)


def embedding_endpoint_problems(g: Any) -> bool:
    """``embedding=openai``: URL, key name, sizes, limits; then the probe when they are sound.
    False (nothing checked) for another embedder."""
    if not str(g.node.get("_target_") or "").endswith(".OpenAIEmbedder"):
        return False
    g.url("base_url")
    g.api_key_env()
    if not str(g.node.get("model") or "").strip():
        g.bad("model", "must be the embedding model name the endpoint serves", g.node.get("model"))
    for key in ("dimensions", "batch_size", "max_request_chars", "concurrency"):
        g.int_at_least(key, 1)
    g.int_at_least("max_retries", 0)
    g.num_at_least("timeout_s", 0, strict=True)
    g.num_at_least("backoff_s", 0)
    g.num_at_least("price_per_1k_tokens", 0)
    limit_problems(g)
    if g.problems:
        return True
    from rag_experiments.stages.api_embedding import probe
    from rag_experiments.stages.endpoint import Endpoint

    n = g.node
    endpoint = Endpoint(
        n["base_url"], n["model"], n.get("api_key_env"), float(n.get("timeout_s") or 60),
        int(n.get("max_retries") or 0), float(n.get("backoff_s") or 0.5), what=f"{g.name}.timeout_s",
    )  # fmt: skip
    try:
        found = probe(endpoint, n.get("dimensions"), n.get("api_key_env"), where=f"conf/{g.name}")
    finally:
        endpoint.close()
    g.problems += list(found.problems)
    return True


def _llm_nodes(cfg: dict) -> list[dict]:
    """The config nodes that call a priced chat endpoint: generator, judge, query.llm."""
    nodes = [cfg.get("generator"), cfg.get("judge"), (cfg.get("query") or {}).get("llm")]
    return [n for n in nodes if isinstance(n, dict) and n.get("base_url") and n.get("_target_")]


def budget_problems(cfg: dict) -> list[str]:
    """``budget``: known keys, ``max_calls`` an integer >= 1, ``max_usd`` a number > 0 and at least
    what the budget reserves for the first generation at the least (``stages.call_budget``): its
    input, the prompt's own text (:func:`prompt_chars`) / 4 at ``price_per_1k_in``, and its output,
    ``max_tokens`` at ``price_per_1k_out`` (a budget smaller than one call would stop the sweep
    before it measured anything)."""
    from rag_experiments.evaluation.cost import price
    from rag_experiments.run.config_types import is_int, is_num

    node = cfg.get("budget")
    if node is None:
        return []
    if not isinstance(node, dict):
        return [f"conf/config: budget: must be a mapping with max_calls and/or max_usd (got {node!r})"]
    out = [f"conf/config: budget.{k}: unknown key (max_calls, max_usd)" for k in sorted(set(node) - {"max_calls", "max_usd"})]
    calls, usd = node.get("max_calls"), node.get("max_usd")
    if calls is not None and (not is_int(calls) or calls < 1):
        out.append(f"conf/config: budget.max_calls: must be an integer >= 1 or null (got {calls!r})")
    if usd is not None and (not is_num(usd) or not usd > 0):
        out.append(f"conf/config: budget.max_usd: must be a number > 0 or null (got {usd!r})")
    elif usd is not None and (gen := cfg.get("generator") or {}).get("pricing"):
        tokens_in = math.ceil(prompt_chars(cfg.get("prompt")) / CHARS_PER_TOKEN)
        try:
            p_in, p_out = price(gen["pricing"])
            first = (p_in * tokens_in + p_out * float(gen.get("max_tokens") or 0)) / 1000
        except (TypeError, ValueError):
            first = 0.0  # a bad price is the pricing check's to report
        if usd < first:
            out.append(f"conf/config: budget.max_usd: {usd:g} USD is less than the first generation can cost "
                       f"({first:.6f} USD: at least {tokens_in} tokens in, the prompt's text, at price_per_1k_in, "
                       f"generator.max_tokens={gen.get('max_tokens')} at price_per_1k_out)")  # fmt: skip
    return out


def prompt_chars(node: Any) -> int:
    """The fewest characters a generation request carries: the prompt's system and template text
    without the question and the context (``{decline_text}`` filled in); 0 for a prompt given by
    reference (``prompt=registry``)."""
    if not isinstance(node, dict):
        return 0
    text = f"{str(node.get('system') or '').strip()}{str(node.get('template') or '').strip()}"
    text = text.replace("{decline_text}", str(node.get("decline_text") or ""))
    return len(text.replace("{context}", "").replace("{question}", ""))


def apply_budget(c: dict) -> None:
    """The resolved config's ``budget`` and its chat endpoints' prices, into ``stages.call_budget`` (per
    process: each job of a multirun sets the same, and what was spent is kept)."""
    from rag_experiments.evaluation.cost import price
    from rag_experiments.stages import call_budget
    from rag_experiments.stages.endpoint import endpoint_key

    node = c.get("budget") or {}
    call_budget.set_budget(node.get("max_calls"), node.get("max_usd"))
    for n in _llm_nodes(c):
        if n.get("pricing"):
            call_budget.set_price(endpoint_key(str(n["base_url"]).rstrip("/"), str(n.get("model") or "")), *price(n["pricing"]))
