"""Which metrics lead a comparison, decided from the factors a sweep varies (docs/metrics.md).

The rule: lead with the metrics **every swept factor can move**, so the primary metric is never one
the sweep cannot change. Each factor has a side (:func:`factor_side`):

- ``generation``: the generator, prompt, judge and the other keys only generation reads
  (``conf_groups.generation_only``), and ``retriever.k`` when the runs generate: the ranking is
  computed once at the largest k, so k only sets how many chunks the generator reads (context size)
  and no retrieval metric at a fixed cut-off depends on it;
- ``chunking``: ``chunking`` and its keys;
- ``retrieval``: everything else (retriever, embedding, rerank, query rewriting, ``retriever.k``
  without generation).

A generation factor moves only the generation metrics, while every factor moves them (the answer
depends on what was retrieved), so one generation factor among the swept ones makes the generation
metrics lead (:data:`GENERATION_HEADLINE`: correctness, faithfulness, rate_ok). Otherwise, when the
chunking varies, the budgeted metrics lead: chunk-count metrics (hit@k, MRR, evidence recall@k)
favour big chunks, a whole document being one "chunk" however many tokens it costs the generator,
while ``*_at_{B}tok`` fill the same B-token context for every chunker. Otherwise the retrieval
metrics at the context k lead.

The rule has one home: :func:`lead_side` names the side, :func:`primary_metric` the report's
primary metric, :func:`table_metrics` the columns of every one-row-per-config table (the
end-of-sweep table of ``multirun``, ``compare --sweep``, ``compare A B``'s headline family),
:func:`sweep_metrics` the metrics ``compare --sweep`` tests, :func:`change_family` those
``compare A B`` tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rag_experiments.core.conf_groups import generation_only
from rag_experiments.evaluation.defaults import TOKEN_BUDGETS
from rag_experiments.evaluation.registry import REGISTRY, parse

__all__ = [
    "CHUNKING_REASON",
    "GENERATION_HEADLINE",
    "change_family",
    "GENERATION_REASON",
    "factor_side",
    "generates",
    "headline_metrics",
    "headline_reason",
    "lead_side",
    "primary_metric",
    "sweep_metrics",
    "table_metrics",
    "varies_chunking",
]

CHUNKING_REASON = "chunkers of different sizes compared at equal context cost"
GENERATION_REASON = "a generation setting is swept: only the generation metrics move with every swept factor"
#: The context-size key: a generation factor when the runs generate (module docstring).
CONTEXT_K = "retriever.k"
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


def headline_reason(varying_factors: Iterable[str], generated: bool = False) -> str:
    """One line saying why the headline starts where it does ("" when nothing special applies)."""
    side = lead_side(varying_factors, generated)
    return {"generation": GENERATION_REASON, "chunking": CHUNKING_REASON}.get(side, "")


def _plain_keys(keys: Iterable[str]) -> list[str]:
    """The plain per-query metric keys among ``keys``, in registry order (as ``metric_columns``)."""
    out = []
    for key in dict.fromkeys(keys):
        got = parse(key)
        if got is not None and got[1]["form"] == "mean" and got[0].per_query:
            s, params = got
            out.append(((REGISTRY.index(s), tuple(str(params[p]).zfill(8) for p in s.params)), key))
    return [key for _, key in sorted(out)]


def generates(available: Iterable[str]) -> bool:
    """True when a generation headline metric is among the ``available`` keys (the runs generated)."""
    return not set(GENERATION_HEADLINE).isdisjoint(available)


def factor_side(factor: str, generated: bool) -> str:
    """``generation``, ``chunking`` or ``retrieval``: which metrics ``factor`` can move (module
    docstring). ``generated``: the runs generate answers (``retriever.k`` is then context size)."""
    if generation_only(factor) or factor == "generator" or (generated and factor == CONTEXT_K):
        return "generation"
    return "chunking" if varies_chunking([factor]) else "retrieval"


def lead_side(varying_factors: Iterable[str], generated: bool) -> str:
    """The side whose metrics lead: ``generation`` when the runs generate and a swept factor is a
    generation setting; else ``chunking`` when the chunking varies; else ``retrieval``."""
    sides = {factor_side(f, generated) for f in varying_factors}
    if generated and "generation" in sides:
        return "generation"
    return "chunking" if "chunking" in sides else "retrieval"


def table_metrics(available: Iterable[str], varying_factors: Iterable[str], k: int = 5) -> list[str]:
    """The metric columns of a one-row-per-config table of a sweep, in order.

    :func:`headline_metrics` of the swept factors (budgeted metrics first when the chunking
    varies) and :data:`GENERATION_HEADLINE`; the generation columns come first when
    :func:`lead_side` is ``generation`` (the runs generate and a generation setting is swept:
    ``generator``, ``prompt``, ``judge``, ``retriever.k`` as context size …). Only keys in
    ``available``.
    """
    factors = list(varying_factors)
    keys = set(available)
    retrieval = headline_metrics(factors, available=sorted(keys), k=k)
    generation = [m for m in GENERATION_HEADLINE if m in keys]
    if lead_side(factors, generates(keys)) == "generation":
        return generation + retrieval
    return retrieval + generation


def primary_metric(varying_factors: Iterable[str], available: Iterable[str], k: int = 5) -> str:
    """The one metric a comparison of the swept factors is read on: the first of
    :func:`table_metrics` (a generation metric when a generation setting is swept and the runs
    generate, ``evidence_recall_at_{B}tok`` at the smallest budget when the chunking varies, else
    ``hit_at_{k}``); ``hit_at_{k}`` when none of them is available."""
    lead = table_metrics(available, varying_factors, k)
    return lead[0] if lead else f"hit_at_{k}"


def planned_primary(varying_factors: Iterable[str], k: int = 5, generates: bool = False, judged: bool = False) -> str:
    """:func:`primary_metric` before any run exists (racing decides on it from the first batch):
    over the keys the runs will log, i.e. :func:`headline_metrics` at the default budgets plus, when
    they generate, :data:`GENERATION_HEADLINE` (``correctness`` and ``faithfulness`` need a judge,
    ``rate_ok`` does not). A prompt sweep thus races on ``correctness``, not on ``hit_at_{k}``,
    which no prompt can move."""
    factors = list(varying_factors)
    available = headline_metrics(factors, k=k)
    if generates:
        available += [m for m in GENERATION_HEADLINE if judged or m == "rate_ok"]
    return primary_metric(factors, available, k)


def change_family(changed: Sequence[str], available: Sequence[str], k: int = 5) -> tuple[list[str], str]:
    """The metrics ``compare A B`` tests by default (its Holm family), and a line saying which:
    :func:`table_metrics` of the ``changed`` config keys (every ``available`` metric when none of
    them is available). Holm over the few metrics the change can move keeps the power that a
    ~40-metric family, most of them copies of one another, would bury; ``--all`` widens it."""
    chosen = table_metrics(available, changed, k=k) or list(available)
    reason = headline_reason(changed, generates(available))
    more = len(available) - len(chosen)
    return chosen, (
        f"Metrics: the headline family of what differs ({len(chosen)}"
        + (f"; {reason}" if reason else "")
        + ")"
        + (f"; {more} more with --all (Holm then over all {len(available)})" if more > 0 else "")
        + "."
    )


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
