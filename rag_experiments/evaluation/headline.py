"""Which metrics lead a comparison, decided from the factors a sweep varies (docs/metrics.md).

Chunk-count metrics (hit@k, MRR, evidence recall@k) favour big chunks: a whole document is one
"chunk" however many tokens it costs the generator. When the chunking varies, the budgeted metrics
(``*_at_{B}tok``: the ranked chunks fill the same B-token context) lead instead.

The rule has one home: :func:`table_metrics` gives the columns of every one-row-per-config table
(the end-of-sweep table of ``multirun``, ``compare --sweep``), :func:`sweep_metrics` the metrics
``compare --sweep`` tests, both led by :func:`headline_metrics` of the swept factors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rag_experiments.core.conf_groups import generation_only
from rag_experiments.evaluation.defaults import TOKEN_BUDGETS
from rag_experiments.evaluation.registry import REGISTRY, parse

__all__ = [
    "CHUNKING_REASON",
    "GENERATION_HEADLINE",
    "headline_metrics",
    "headline_reason",
    "sweep_metrics",
    "table_metrics",
    "varies_chunking",
]

CHUNKING_REASON = "chunkers of different sizes compared at equal context cost"
DEFAULT_BUDGETS = TOKEN_BUDGETS  # the metrics.token_budgets default
_BUDGETED = ("evidence_recall", "hit", "token_precision")
#: The generation columns of a one-row-per-config table: answer quality, then the share of
#: queries with no failure label.
GENERATION_HEADLINE = ("correctness", "faithfulness", "rate_ok")


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


def _plain_keys(keys: Iterable[str]) -> list[str]:
    """The plain per-query metric keys among ``keys``, in registry order (as ``metric_columns``)."""
    out = []
    for key in dict.fromkeys(keys):
        got = parse(key)
        if got is not None and got[1]["form"] == "mean" and got[0].per_query:
            s, params = got
            out.append(((REGISTRY.index(s), tuple(str(params[p]).zfill(8) for p in s.params)), key))
    return [key for _, key in sorted(out)]


def _generation_side(factor: str) -> bool:
    return generation_only(factor) or factor == "generator"


def table_metrics(available: Iterable[str], varying_factors: Iterable[str], k: int = 5) -> list[str]:
    """The metric columns of a one-row-per-config table of a sweep, in order.

    :func:`headline_metrics` of the swept factors (budgeted metrics first when the chunking
    varies), then :data:`GENERATION_HEADLINE`; the generation columns come first when every swept
    factor is a generation setting (``generator``, ``prompt``, ``judge``, …: retrieval is the
    same in every run). Only keys in ``available``.
    """
    factors = list(varying_factors)
    keys = set(available)
    retrieval = headline_metrics(factors, available=sorted(keys), k=k)
    generation = [m for m in GENERATION_HEADLINE if m in keys]
    if factors and all(_generation_side(f) for f in factors):
        return generation + retrieval
    return retrieval + generation


def sweep_metrics(available: Iterable[str], varying_factors: Iterable[str], k: int = 5) -> list[str]:
    """The metrics ``compare --sweep`` tests by default, led by :func:`table_metrics`.

    hit@k (else the largest logged hit@k) plus every per-query metric without a rank cut-off
    (MRR, the budgeted metrics, generation metrics, failure-label rates), in registry order.
    """
    keys = _plain_keys(available)
    hits = sorted((c for c in keys if parse(c)[0].pattern == "hit_at_{k}"), key=lambda c: parse(c)[1]["k"])
    hit = [f"hit_at_{k}"] if f"hit_at_{k}" in hits else hits[-1:]
    default = hit + [c for c in keys if "k" not in parse(c)[0].params]
    lead = table_metrics(default, varying_factors, k)
    return lead + [m for m in default if m not in lead]
