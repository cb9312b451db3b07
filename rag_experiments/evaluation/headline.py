"""Which metrics lead a comparison, decided from the factors a sweep varies (docs/metrics.md).

Chunk-count metrics (hit@k, MRR, evidence recall@k) favour big chunks: a whole document is one
"chunk" however many tokens it costs the generator. When the chunking varies, the budgeted metrics
(``*_at_{B}tok``: the ranked chunks fill the same B-token context) lead instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rag_experiments.evaluation.registry import parse

__all__ = ["CHUNKING_REASON", "headline_metrics", "headline_reason", "varies_chunking"]

CHUNKING_REASON = "chunkers of different sizes compared at equal context cost"
DEFAULT_BUDGETS = (256, 512, 1024)
_BUDGETED = ("evidence_recall", "hit", "token_precision")


def _budget_of(key: str) -> int | None:
    """B of a plain budgeted key (``hit_at_512tok`` → 512), read from the metric registry."""
    got = parse(key)
    if got is None or got[1].get("form") != "mean":
        return None
    spec, params = got
    return int(params["B"]) if spec.pattern.startswith(_BUDGETED) and "B" in params else None


def varies_chunking(varying_factors: Iterable[str]) -> bool:
    """True when ``chunking`` or one of its keys (``chunking.size`` ...) is among the factors."""
    return any(f == "chunking" or f.startswith("chunking.") for f in varying_factors)


def headline_metrics(
    varying_factors: Iterable[str], available: Sequence[str] | None = None, k: int = 5
) -> list[str]:
    """The metric keys to show first, in order.

    Always ``hit_at_{k}``, ``mrr``, ``evidence_recall_at_{k}``; when the chunking varies the budgeted
    metrics come before them: ``evidence_recall_at_{B}tok``, then ``hit_at_{B}tok``, then
    ``token_precision_at_{B}tok``, each for every budget B in increasing order. ``available``: the
    keys that exist (budgets are read from it and the result is limited to it); None = the default
    budgets (256, 512, 1024) and no filtering.
    """
    factors = list(varying_factors)
    if available is None:
        budgets = list(DEFAULT_BUDGETS)
    else:
        budgets = sorted({b for a in available if (b := _budget_of(a)) is not None})
    out = [f"hit_at_{k}", "mrr", f"evidence_recall_at_{k}"]
    if varies_chunking(factors):
        out = [f"{name}_at_{b}tok" for name in _BUDGETED for b in budgets] + out
    return out if available is None else [m for m in out if m in set(available)]


def headline_reason(varying_factors: Iterable[str]) -> str:
    """One line saying why the headline starts where it does ("" when nothing special applies)."""
    return CHUNKING_REASON if varies_chunking(varying_factors) else ""
