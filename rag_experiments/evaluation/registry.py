"""The metric registry: every key the pipeline logs, declared once (see ``docs/metrics.md``).

A :class:`MetricSpec` carries a key pattern (``hit_at_{k}``), the side it measures, its direction,
its per-query value type, the function that computes it and its definition text. Summaries,
aggregation, compare, gate and the report read these instead of guessing from the name.

Logged keys are a base key (``hit_at_5``) in one of a few *forms*, each a fixed prefix/suffix
(:data:`FORMS`): the mean itself, ``{key}_ci_low`` / ``{key}_ci_high``, ``n_scored/{key}``,
``by_tag/{tag}/{key}`` and the ``compare/{key}/{stat}`` metrics ``compare --log`` writes.
:func:`parse` undoes a form, then matches the base key against the registered patterns;
:func:`render_key` builds a key from a pattern, its parameters and a form.

The declarations live in :mod:`~rag_experiments.evaluation.metric_table` (the table) and
:mod:`~rag_experiments.evaluation.metric_spec` (their type); this module re-exports both and holds
the forms and the lookups by logged key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rag_experiments.evaluation.labels import FAILURE_LABELS, RATE_LABELS
from rag_experiments.evaluation.metric_spec import MetricSpec
from rag_experiments.evaluation.metric_table import REGISTRY

__all__ = [
    "FORMS",
    "DIAGNOSTIC_METRICS",
    "GENERATION_METRICS",
    "REGISTRY",
    "Form",
    "MetricSpec",
    "higher_is_better",
    "metric_keys",
    "parse",
    "render_key",
    "spec",
    "wrap",
]


@dataclass(frozen=True)
class Form:
    """How a base key is wrapped in a logged key: ``prefix + key + suffix`` (``{tag}`` in by_tag)."""

    name: str
    prefix: str = ""
    suffix: str = ""


#: The logged forms of a base key, tried in this order by :func:`parse`.
FORMS: tuple[Form, ...] = (
    Form("ci_low", suffix="_ci_low"),
    Form("ci_high", suffix="_ci_high"),
    Form("n_scored", prefix="n_scored/"),
    Form("by_tag", prefix="by_tag/{tag}/"),
    Form("first_stage", prefix="first_stage/"),  # the retriever's list before the reranker
    Form("compare_delta", prefix="compare/", suffix="/delta"),
    Form("compare_ci_low", prefix="compare/", suffix="/ci_low"),
    Form("compare_ci_high", prefix="compare/", suffix="/ci_high"),
    Form("compare_p_value", prefix="compare/", suffix="/p_value"),
    Form("mean"),
)
_FORMS = {f.name: f for f in FORMS}
#: Forms only per-query metrics have (a count or a latency has no CI, n_scored or per-tag value).
_AGGREGATE_FORMS = frozenset({"ci_low", "ci_high", "n_scored", "by_tag"})

#: Direction of each failure-label rate. correct_without_evidence is lower-is-better: the
#: retriever missed and the answer was right anyway (parametric knowledge, or evidence the
#: gold set does not name), so a rise hides retrieval regressions behind correct answers.
_LABEL_DIRECTION: dict[str, bool] = {
    "ok": True,
    "retrieval_failure": False,
    "generation_failure": False,
    "correct_without_evidence": False,
    "retrieved": True,  # retrieval-only runs: the evidence reached the context
    "error": False,
}
#: Generation metrics: the judge's (faithfulness, answer_relevance), key-fact correctness and the
#: judge-free ones of evaluation.answer_metrics (NaN when a query has no answer to score).
GENERATION_METRICS = tuple(s.pattern for s in REGISTRY if s.side == "generation")
#: Per-query claim-level diagnostics (evaluation.diagnostics; NaN outside the judged answers).
DIAGNOSTIC_METRICS = tuple(s.pattern for s in REGISTRY if s.side == "diagnostic")

assert set(_LABEL_DIRECTION) == set(FAILURE_LABELS), "every failure label needs a direction"


def _base(key: str) -> tuple[MetricSpec, dict[str, Any]] | None:
    for s in REGISTRY:
        params = s.match(key)
        if params is not None:
            return s, params
    return None


def _unwrap(key: str, form: Form) -> tuple[str, dict[str, Any]] | None:
    """The base key inside ``key`` when it has the shape of ``form`` (plus the tag of by_tag)."""
    if not key.endswith(form.suffix) or len(key) <= len(form.suffix):
        return None
    inner = key[: len(key) - len(form.suffix)] if form.suffix else key
    if form.name == "by_tag":
        head, _, base = inner.rpartition("/")  # metric keys have no "/", tags may
        if not head.startswith("by_tag/") or len(head) <= len("by_tag/"):
            return None
        return base, {"tag": head[len("by_tag/") :]}
    if not inner.startswith(form.prefix):
        return None
    return inner[len(form.prefix) :], {}


def parse(key: str) -> tuple[MetricSpec, dict[str, Any]] | None:
    """``(spec, params)`` for a logged key, or None when no registered pattern matches.

    ``params`` holds the pattern's placeholder values (``k`` as int), ``form`` (a :data:`FORMS`
    name, ``"mean"`` for the plain key), ``base`` (the key without its form) and ``tag`` for
    ``by_tag/{tag}/{key}``. ``hit_at_5_ci_low`` → ``(hit_at_{k}, {k: 5, form: ci_low, base: hit_at_5})``.
    """
    for form in FORMS:
        got = _unwrap(key, form)
        if got is None:
            continue
        base, extra = got
        found = _base(base)
        if found is not None and (found[0].per_query or form.name not in _AGGREGATE_FORMS):
            s, params = found
            return s, {**params, **extra, "form": form.name, "base": base}
    return None


def spec(key: str) -> MetricSpec:
    """The spec of a logged key; ``KeyError`` naming the key when it is not registered."""
    got = parse(key)
    if got is None:
        raise KeyError(f"metric key {key!r} is not registered in rag_experiments.evaluation.registry")
    return got[0]


def higher_is_better(key: str) -> bool | None:
    """Direction of a key's base metric (None: a descriptive count with no better side)."""
    s, params = parse(key) or (None, {})
    if s is None:
        raise KeyError(f"metric key {key!r} is not registered in rag_experiments.evaluation.registry")
    if "label" in params:
        return _LABEL_DIRECTION[params["label"]]
    return s.higher_is_better


def wrap(key: str, form: str, tag: str | None = None) -> str:
    """A plain metric key in one of the :data:`FORMS`: ``wrap("mrr", "n_scored") == "n_scored/mrr"``;
    ``form="by_tag"`` needs ``tag``."""
    got = parse(key)
    if got is None or got[1]["form"] != "mean":
        raise KeyError(f"{key!r} is not a registered plain metric key")
    f = _FORMS[form]
    if form in _AGGREGATE_FORMS and not got[0].per_query:
        raise ValueError(f"{key!r} is not a per-query metric: it has no {form} form")
    if form == "by_tag" and not tag:
        raise ValueError("form='by_tag' needs a tag")
    return f.prefix.replace("{tag}", tag or "") + key + f.suffix


def render_key(pattern: str, form: str = "mean", tag: str | None = None, **params: Any) -> str:
    """The logged key of ``pattern`` at ``params`` in ``form``: ``render_key("hit_at_{k}", k=5,
    form="ci_low") == "hit_at_5_ci_low"``; ``form="by_tag"`` needs ``tag``."""
    s = next((x for x in REGISTRY if x.pattern == pattern), None)
    if s is None:
        raise KeyError(f"metric pattern {pattern!r} is not registered")
    return wrap(s.render(**params), form, tag)


def metric_keys(ks: Iterable[int], k: int, generation: bool) -> list[str]:
    """The ordered keys a run summary shows: headline metrics at the context k, hit@k at every
    other k, generation metrics when ``generation``, then the failure-label rates (only
    ``rate_retrieval_failure`` without generation: the other labels need an answer)."""
    out: list[str] = []
    other_ks = [x for x in dict.fromkeys(int(x) for x in ks) if x != k]
    heads = sorted((s for s in REGISTRY if s.headline is not None), key=lambda s: s.headline)
    for s in heads:
        if s.side == "generation" and not generation:
            continue
        if "label" in s.params:
            labels = RATE_LABELS if generation else ("retrieval_failure",)
            out += [s.render(label=lab) for lab in labels]
        elif "k" in s.params:
            out.append(s.render(k=k))
        else:
            out.append(s.render())
    every = [s for s in heads if s.every_k and s.side == "retrieval"]
    last_retrieval = max((i for i, key in enumerate(out) if spec(key).side == "retrieval"), default=-1)
    extra = [s.render(k=x) for s in every for x in other_ks]
    return out[: last_retrieval + 1] + extra + out[last_retrieval + 1 :]
