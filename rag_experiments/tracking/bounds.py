"""Every tracking call bounded: MLflow's HTTP timeout and retries derived from one budget.

MLflow 3.17's defaults (120 s timeout, 7 retries, backoff factor 2, Retry-After honoured) let one
call to a stopped server retry for ≈ 4 min. The sweep (``tracking.timeout_s``) and every CLI
(``cli.errors.cli_main``) set MLflow's own environment variables from one budget instead,
default :data:`DEFAULT_TIMEOUT_S`; one of those variables the user exported wins.
Cleanup after an error or a signal runs under :func:`best_effort` (one try, short timeout), so a
SIGTERM while the server is away ends the process in seconds; a run that could not be marked is
left RUNNING and healed by the next start (``writer.heal_stale_runs``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 60.0
TIMEOUT = "MLFLOW_HTTP_REQUEST_TIMEOUT"
RETRIES = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
BACKOFF = "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"
JITTER = "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER"
RETRY_AFTER = "MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER"  # a server's Retry-After is unbounded
_KEYS = (TIMEOUT, RETRIES, BACKOFF, JITTER, RETRY_AFTER)
_written: dict[str, str] = {}  # what this module set last: any other value was set by the user
_plan: list[HttpBudget] = []  # the budget planned for this process (cleanup does not change it)
MAX_RETRIES = 3
MIN_REQUEST_TIMEOUT_S = 5
QUICK_TIMEOUT_S = 2


@dataclass(frozen=True)
class HttpBudget:
    """MLflow's per-request timeout (s), retry count and backoff factor for one call."""

    timeout_s: int
    max_retries: int
    backoff_factor: int = 1

    def backoff_s(self) -> float:
        """Σ sleeps between tries: urllib3 sleeps 0 after the first failure, then f·2^(n−1)
        after the n-th consecutive one (n = 2 … R)."""
        return float(sum(self.backoff_factor * 2 ** (n - 1) for n in range(2, self.max_retries + 1)))

    def worst_case_s(self) -> float:
        """Longest one call can take: (R + 1)·T + backoff (no jitter, Retry-After ignored)."""
        return (self.max_retries + 1) * self.timeout_s + self.backoff_s()

    def env(self) -> dict[str, str]:
        return {
            TIMEOUT: str(self.timeout_s),
            RETRIES: str(self.max_retries),
            BACKOFF: str(self.backoff_factor),
            JITTER: "0",
            RETRY_AFTER: "false",
        }


def plan_budget(total_s: float = DEFAULT_TIMEOUT_S) -> HttpBudget:
    """The most retries R ≤ 3 whose per-request timeout T = ⌊(total − backoff(R)) / (R + 1)⌋ is
    still ≥ 5 s, so ``worst_case_s() ≤ total``; below that budget one try of ⌊total⌋ s (≥ 1).

    60 s → T = 13 s, R = 3 (4 tries, 6 s of backoff: 58 s at worst); 20 s → T = 6 s, R = 2.
    """
    if not total_s > 0:
        raise ValueError(f"tracking.timeout_s must be > 0 (got {total_s!r})")
    for retries in range(MAX_RETRIES, 0, -1):
        b = HttpBudget(0, retries)
        timeout = int((total_s - b.backoff_s()) // (retries + 1))
        if timeout >= MIN_REQUEST_TIMEOUT_S:
            return HttpBudget(timeout, retries)
    return HttpBudget(max(1, int(total_s)), 0)


def _apply(env: dict[str, str], force: bool = False) -> None:
    for key, value in env.items():
        if force or os.environ.get(key, _written.get(key)) == _written.get(key):  # not the user's
            os.environ[key] = _written[key] = value


def bound_tracking_calls(total_s: float | None = None) -> HttpBudget:
    """Set MLflow's HTTP settings for this process from ``total_s`` (default 60 s); returns the plan.

    MLflow reads these variables on every request, so this holds from the next call on.
    """
    budget = plan_budget(DEFAULT_TIMEOUT_S if total_s is None else float(total_s))
    _apply(budget.env())
    _plan[:] = [budget]
    return budget


def request_timeout_s() -> int:
    """The per-request timeout in force: MLflow's variable as exported by the user or set by
    :func:`bound_tracking_calls`, else the default plan's (13 s). A PostgreSQL store's connect
    timeout is this (``tracking.uri.tracking_uri``)."""
    try:
        return max(1, int(float(os.environ[TIMEOUT])))
    except (KeyError, ValueError):
        return (_plan[0] if _plan else plan_budget()).timeout_s


def current_budget_s() -> float:
    """The worst case of one call: the planned budget, with any variable the user exported."""
    b = _plan[0] if _plan else plan_budget()
    user = {
        k: os.environ[k]
        for k in (TIMEOUT, RETRIES, BACKOFF)
        if os.environ.get(k, _written.get(k)) != _written.get(k)
    }
    try:
        b = HttpBudget(
            int(user.get(TIMEOUT, b.timeout_s)),
            int(user.get(RETRIES, b.max_retries)),
            int(user.get(BACKOFF, b.backoff_factor)),
        )
    except ValueError:
        pass
    return b.worst_case_s()


@contextlib.contextmanager
def best_effort(what: str) -> Iterator[None]:
    """Cleanup on the way out (after an error or a signal) with the quick budget from then on; a
    failure is noted on stderr, never raised (the store may be what failed): a run it could not
    mark stays RUNNING until the next start heals it."""
    _apply(HttpBudget(QUICK_TIMEOUT_S, 0).env(), force=True)  # kept: the process is ending, and
    try:  # MLflow's own exit hooks must not wait a full budget on a store that is away either
        yield
    except Exception as e:  # noqa: BLE001 - cleanup must not hide the error being handled
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        print(f"note: could not {what} ({why}); the next start of this config heals it", file=sys.stderr)
