"""Config checks of remote endpoints (``config_schema`` calls them on its ``_Group``):

- :func:`endpoint_problems`: the endpoint settings (``stages.endpoint_settings``) a group's node
  holds, in any group: each number in the range declared once there (``concurrency`` >= 1,
  ``timeout_s`` > 0, ``max_concurrency`` in [1, 1024], ``rpm`` in (0, 1e6] …), an http(s)
  ``base_url``/``url``, ``api_key_env`` the NAME of a set variable, a non-empty ``model``, a
  ``pricing`` table;
- :func:`embedding_endpoint_problems`: ``embedding=openai``'s own keys, then one probe request
  (``stages.api_embedding.probe``): an endpoint that is unreachable, refuses the key or the model,
  or answers with NaN or wrongly-sized vectors exits 2 naming the key, before any run;
- :func:`budget_problems`: ``budget.max_calls`` >= 1, ``budget.max_usd`` > 0 and not smaller than
  the first call can cost; :func:`apply_budget` hands the budget and the prices to
  ``stages.call_budget`` when the stages are built.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any
from urllib.parse import urlparse

from rag_experiments.stages.call_budget import CHARS_PER_TOKEN
from rag_experiments.stages.endpoint_settings import RANGES, Takes, setting_problems

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LOOPBACK = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


def declared(node: dict) -> Takes | None:
    """The endpoint settings the node's ``_target_`` declares (its ``ENDPOINT``), else None."""
    target = node.get("_target_")
    if not target:
        return None
    from hydra.utils import get_class

    try:
        return getattr(get_class(str(target)), "ENDPOINT", None)
    except Exception:  # noqa: BLE001 - an unimportable target is reported by known_keys
        return None


def endpoint_problems(g: Any) -> None:
    """Every endpoint setting ``g`` holds, whatever its group, unless a rule of the group checked
    the key already: one rule per key, the same for the seven users (module docstring)."""
    takes = declared(g.node)
    aliases = takes.aliases if takes else {}
    keys = [k for k in g.node if k not in g.checked and (k in RANGES or k in aliases)]
    for key, what in setting_problems({k: g.node[k] for k in keys}, aliases):
        g.bad(key, what, show=False)
    g.checked.update(keys)
    for key in ("url", "base_url"):
        if key in g.node and key not in g.checked:
            url(g, key)
    if "api_key_env" in g.node and "api_key_env" not in g.checked:
        api_key_env(g)
    model = g.node.get("model")
    if takes and takes.model_required and "model" in g.node and "model" not in g.checked and not str(model or "").strip():
        g.bad("model", "must be a non-empty model name", model)
    if "pricing" in g.node:
        _pricing(g)


def url(g: Any, key: str) -> None:
    """An http(s) URL with a host and a valid port."""
    g.checked.add(key)
    if not g.has(key):
        return
    v = g.node[key]
    parsed = urlparse(str(v))
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        g.bad(key, "must be an http(s) URL with a host, e.g. http://localhost:8000/v1", v)
        return
    try:
        parsed.port  # noqa: B018 - raises on a non-numeric or out-of-range port
    except ValueError:
        g.bad(key, "has an invalid port", v)


def api_key_env(g: Any, key: str = "api_key_env") -> None:
    """The *name* of a variable; a pasted key is rejected without echoing it."""
    g.checked.add(key)
    if key not in g.node or g.node[key] is None:
        return
    v = str(g.node[key])
    if not _ENV_NAME.match(v) or len(v) > 64 or v.startswith(("sk-", "sk_")):
        g.bad(
            key,
            f"must be the NAME of an environment variable holding the key, not the key "
            f"(got a {len(v)}-character value that is not a variable name; not shown)",
            show=False,
        )
        return
    host = urlparse(str(g.node.get("base_url") or g.node.get("url") or "")).hostname or ""
    if not os.environ.get(v) and host not in _LOOPBACK:
        g.bad(
            key,
            f"environment variable {v} is not set; set it, or use {key}=null for an endpoint "
            "without authentication",
            show=False,
        )


def _pricing(g: Any) -> None:
    """``pricing``: USD per 1000 tokens in / out for cost_usd and the budget (evaluation.cost.price)."""
    from rag_experiments.evaluation.cost import price

    g.checked.add("pricing")
    node = g.node.get("pricing")
    if node is None:
        return
    if not isinstance(node, dict) or set(node) - {"price_per_1k_in", "price_per_1k_out"}:
        g.bad("pricing", "must be a mapping with price_per_1k_in and/or price_per_1k_out", node)
        return
    try:
        price(node)
    except ValueError as e:
        g.bad("pricing", str(e), node)


def embedding_endpoint_problems(g: Any) -> bool:
    """``embedding=openai``: its own keys and the endpoint settings; then the probe when they are
    sound. False (nothing checked) for another embedder."""
    if not str(g.node.get("_target_") or "").endswith(".OpenAIEmbedder"):
        return False
    if not str(g.node.get("model") or "").strip():
        g.bad("model", "must be the embedding model name the endpoint serves", g.node.get("model"))
    for key in ("dimensions", "batch_size", "max_request_chars"):
        g.int_at_least(key, 1)
    g.num_at_least("price_per_1k_tokens", 0)
    endpoint_problems(g)
    if g.problems:
        return True
    from rag_experiments.stages.api_embedding import OpenAIEmbedder, probe
    from rag_experiments.stages.endpoint import Endpoint

    takes = OpenAIEmbedder.ENDPOINT
    settings = takes.settings({k: v for k, v in g.node.items() if k in takes.keys and k not in ("base_url", "model")},
                              base_url=g.node["base_url"], model=g.node["model"])  # fmt: skip
    endpoint = Endpoint.of(settings, f"{g.name}.timeout_s")
    try:
        found = probe(endpoint, g.node.get("dimensions"), settings.api_key_env, where=f"conf/{g.name}")
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
