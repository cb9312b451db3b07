"""Defaults of the ``metrics`` config (conf/config.yaml), one home for code and config checks.

``config_schema`` validates the ``metrics`` group against these; ``RunSettings`` and every metric
function that takes ``min_coverage`` default to them (docs/metrics.md defines each).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

#: a chunk is relevant when it covers >= this share of a gold span (or lies inside it)
MIN_COVERAGE = 0.5
#: MRR and the token budgets read the ranking this deep, whatever ``ks`` and ``retriever.k`` are
RANK_DEPTH = 100
#: budgeted metrics: ranked chunks fill B MiniLM tokens of context
TOKEN_BUDGETS: tuple[int, ...] = (256, 512, 1024)
#: bootstrap resamples behind every 95 % CI
BOOTSTRAP_RESAMPLES = 1000


def _positive_int(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | np.integer) and v >= 1


def metrics_problems(
    ks: Iterable[int] = (1,), k: int = 1, rank_depth: Any = RANK_DEPTH, token_budgets: Any = TOKEN_BUDGETS
) -> list[str]:
    """``metrics.<key>: every value must be an integer >= 1, got v`` for each bad depth, k or budget
    (the one check of these keys: ``config_schema`` reports them, ``check_metrics_config`` raises)."""
    if not isinstance(token_budgets, list | tuple):
        return [f"metrics.token_budgets: must be a list of integers >= 1, got {token_budgets!r}"]
    out = []
    for key, values in (
        ("metrics.ks", ks),
        ("retriever.k", [k]),
        ("metrics.rank_depth", [rank_depth]),
        ("metrics.token_budgets", token_budgets),
    ):
        out += [
            f"{key}: every value must be an integer >= 1, got {v!r}" for v in values if not _positive_int(v)
        ]
    return out


def check_metrics_config(ks: Iterable[int], k: int, rank_depth: int, token_budgets: Iterable[int]) -> None:
    """Raise ValueError naming the config key when a depth, k or budget is not a positive integer."""
    if problems := metrics_problems(ks, k, rank_depth, list(token_budgets)):
        raise ValueError(problems[0])
