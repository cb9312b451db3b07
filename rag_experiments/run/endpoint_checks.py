"""Config checks of remote endpoints (``config_schema`` calls them on its ``_Group``):

- :func:`limit_problems`: an endpoint's limits, on any group that declares them
  (``max_concurrency`` in [1, 1024], ``rpm`` in (0, 1e6], ``tpm`` in (0, 1e9]);
- :func:`embedding_endpoint_problems`: ``embedding=openai``'s keys, then one probe request
  (``stages.api_embedding.probe``): an endpoint that is unreachable, refuses the key or the model,
  or answers with NaN or wrongly-sized vectors exits 2 naming the key, before any run.
"""

from __future__ import annotations

from typing import Any

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
