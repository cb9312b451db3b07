"""A sweep's budget (``budget.max_calls``, ``budget.max_usd``), counted where every remote call
passes: the endpoint client (``stages.endpoint``) asks :func:`reserve` before a call and tells
:func:`settle` its reply.

- ``max_calls``: a call (its retries included) is refused when ``max_calls`` calls were made;
- ``max_usd``: a call is refused when the cost so far, plus the calls in flight, plus this call's
  bound would pass ``max_usd``. The bound is what the call can cost at most at the endpoint's
  prices (:func:`set_price`): ``in · chars(body)/4 + out · max_tokens``, per 1000 tokens; once
  its reply arrives the reply's own ``usage`` replaces it.

The budget is per process (one sweep invocation): raising it and running the same command resumes
the configs it stopped (their ``budget`` key is a place key, not in ``config_hash``). A refused call
is never sent; the run it belonged to is FAILED with a ``failure_reason`` starting ``budget``
(:func:`stop_reason`, read by ``run.steps.failure_reason``).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

CHARS_PER_TOKEN = 4  # a request's input tokens, bounded from its JSON size (English text: ~4 chars a token)


@dataclass
class _Budget:
    max_calls: int | None = None
    max_usd: float | None = None
    calls: int = 0
    usd: float = 0.0
    reserved: float = 0.0  # the bounds of the calls in flight
    refused: int = 0
    reason: str = ""


_B = _Budget()
_PRICES: dict[str, tuple[float, float]] = {}  # endpoint key → USD per 1000 tokens (in, out)
_LOCK = threading.Lock()


def set_budget(max_calls: int | None = None, max_usd: float | None = None) -> None:
    """The limits of this process's calls (None: none); what was spent so far is kept, so each
    job of a multirun (which calls this again) shares one budget. A stop the new limits no longer
    justify is lifted (a later run's failures are then its own, not the budget's)."""
    with _LOCK:
        _B.max_calls = int(max_calls) if max_calls is not None else None
        _B.max_usd = float(max_usd) if max_usd is not None else None
        over_calls = _B.max_calls is not None and _B.calls >= _B.max_calls
        over_usd = _B.max_usd is not None and _B.usd >= _B.max_usd
        if not (over_calls or over_usd):
            _B.reason = ""


def reset() -> None:
    """A fresh budget with no limits (tests; a new process starts so)."""
    global _B
    with _LOCK:
        _B = _Budget()
        _PRICES.clear()


def set_price(key: str, per_1k_in: float, per_1k_out: float) -> None:
    """USD per 1000 tokens in and out at the endpoint ``key`` (``endpoint.endpoint_key``)."""
    with _LOCK:
        _PRICES[key] = (float(per_1k_in), float(per_1k_out))


def priced(key: str) -> bool:
    """True when the endpoint ``key`` has a price in or out."""
    with _LOCK:
        return any(_PRICES.get(key, (0.0, 0.0)))


def call_bound(key: str, body: dict) -> float:
    """The most one call of ``body`` can cost at ``key``'s prices:
    ``(p_in · len(json(body))/4 + p_out · max_tokens) / 1000`` (0 without prices)."""
    p_in, p_out = _PRICES.get(key, (0.0, 0.0))
    if not (p_in or p_out):
        return 0.0
    size = len(json.dumps(body, ensure_ascii=False))
    out = body.get("max_tokens") or body.get("max_completion_tokens") or 0
    return (p_in * size / CHARS_PER_TOKEN + p_out * float(out)) / 1000


def reply_cost(key: str, usage: dict | None) -> float:
    """The cost of a reply's ``usage`` (prompt and completion tokens) at ``key``'s prices."""
    p_in, p_out = _PRICES.get(key, (0.0, 0.0))
    u = usage or {}
    tin = u.get("prompt_tokens", u.get("total_tokens", 0)) or 0
    tout = u.get("completion_tokens", 0) or 0
    return (p_in * float(tin) + p_out * float(tout)) / 1000


def reserve(key: str, body: dict) -> tuple[float, str]:
    """(the call's bound, "") when the budget allows the call, else (0, why it is refused)."""
    bound = call_bound(key, body)
    with _LOCK:
        if _B.max_calls is not None and _B.calls >= _B.max_calls:
            why = f"budget: budget.max_calls={_B.max_calls} reached ({_B.calls} calls made)"
        elif _B.max_usd is not None and _B.usd + _B.reserved + bound > _B.max_usd:
            why = (f"budget: budget.max_usd={_B.max_usd:g} would be exceeded (spent {_B.usd:.6f} USD, "
                   f"{_B.reserved:.6f} in flight, this call up to {bound:.6f})")  # fmt: skip
        else:
            _B.calls += 1
            _B.reserved += bound
            return bound, ""
        _B.refused += 1
        _B.reason = _B.reason or why + "; raise it and run the same command to resume"
        return 0.0, why


def settle(key: str, bound: float, usage: dict | None) -> float:
    """A reserved call ended: its bound is released and its reply's cost spent; returns the cost."""
    cost = reply_cost(key, usage)
    with _LOCK:
        _B.reserved = max(0.0, _B.reserved - bound)
        _B.usd += cost
    return cost


def stop_reason() -> str:
    """Why the budget stopped calls in this process ("" while it has refused none)."""
    with _LOCK:
        return _B.reason


def spent() -> dict[str, float]:
    with _LOCK:
        return {"calls": _B.calls, "usd": round(_B.usd, 6), "refused": _B.refused}
