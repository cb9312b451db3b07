"""Every metric is computed by walking the registry (``evaluation/metric_table.py``).

A walk is given named inputs and the placeholder values of one pass (``k=5``, ``B=512`` or none).
It computes every declared metric of one side whose key pattern has exactly those placeholders and
whose function's required parameters are all among the inputs (a placeholder counts as an input),
by calling that function with the inputs its parameters name. A function's signature *is* the
list of what it needs, so adding a metric is one function and one declaration, with no dispatch
code; a metric whose inputs a run does not have (the citation metrics without a citing prompt, the
faithfulness of an answer that was not judged) is simply not computed.

What the inputs are is the caller's choice, per family:

==============================  ================================================  ==============
walk                            inputs                                            caller
==============================  ================================================  ==============
retrieval, ``k`` / none         relevance and coverage arrays over queries        ``metrics``
retrieval, ``B``                the B-token context's arrays over queries         ``budget``
generation, per query           one answer: text, gold answers, context, cites    ``answer_metrics``
generation, per query           one answer's verdicts                             ``run.pipeline``
generation, per run             the declined / answerable columns                 ``answer_metrics``
diagnostic, per query           one answer's claim verdicts / classes             ``diagnostics``
==============================  ================================================  ==============

``answer_relevance`` (the judge's own score, a model call) and the failure-label rates (the
decision table of ``evaluation.labels``) have no function of inputs: their specs carry no
``compute`` and are never walked.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from rag_experiments.evaluation import metric_table
from rag_experiments.evaluation.metric_spec import MetricSpec, Side

__all__ = ["plan", "walk"]


@cache
def _parameters(compute: str, function) -> tuple[tuple[str, ...], frozenset[str]]:
    """(every parameter name, the required ones) of a declared function."""
    params = inspect.signature(function).parameters
    required = frozenset(n for n, p in params.items() if p.default is inspect.Parameter.empty)
    return tuple(params), required


#: Plans by (registry, side, inputs, placeholders, per_query): a per-answer walk repeats one plan.
#: The registry object is kept with its plans, so a replaced registry (a test's) never hits them.
_PLANS: dict[tuple, tuple[tuple, list]] = {}


def _steps(
    side: Side, inputs: frozenset[str], placeholders: frozenset[str], per_query: bool
) -> list[tuple[MetricSpec, Callable, tuple[str, ...]]]:
    registry = metric_table.REGISTRY
    key = (id(registry), side, inputs, placeholders, per_query)
    cached = _PLANS.get(key)
    if cached is not None and cached[0] is registry:
        return cached[1]
    have = inputs | placeholders
    out = []
    for spec in registry:
        if (
            spec.side != side
            or spec.per_query != per_query
            or spec.compute is None
            or set(spec.params) != placeholders
        ):
            continue
        function = spec.function()
        names, required = _parameters(spec.compute, function)
        if required <= have:
            out.append((spec, function, tuple(n for n in names if n in have)))
    _PLANS[key] = (registry, out)
    return out


def plan(
    side: Side, inputs: frozenset[str], placeholders: frozenset[str] = frozenset(), per_query: bool = True
) -> list[tuple[MetricSpec, tuple[str, ...]]]:
    """The specs a walk computes, in registry order, each with the argument names it is called with
    (its parameters that are inputs or placeholders; the others keep their defaults)."""
    return [(spec, names) for spec, _, names in _steps(side, inputs, placeholders, per_query)]


def walk(inputs: Mapping[str, Any], side: Side, per_query: bool = True, **placeholders: Any) -> dict[str, Any]:
    """``{metric key: value}`` for every spec :func:`plan` selects, each computed by its declared
    function called with the inputs (and placeholder values) its parameters name.

    ``walk({"rel": rel}, "retrieval", k=5)`` → ``{"hit_at_5": hit_at_k(rel=rel, k=5), ...}``;
    values are whatever the functions return (an array over queries, or one query's float)."""
    args = {**inputs, **placeholders}
    steps = _steps(side, frozenset(inputs), frozenset(placeholders), per_query)
    return {
        (spec.render(**placeholders) if placeholders else spec.pattern): function(**{n: args[n] for n in names})
        for spec, function, names in steps
    }
