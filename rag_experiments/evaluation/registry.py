"""The metric registry: every key the pipeline logs, declared once (see ``docs/metrics.md``).

A :class:`MetricSpec` carries a key pattern (``hit_at_{k}``), the side it measures, its direction,
its per-query value type, the function that computes it and its definition text. Summaries,
aggregation, compare, gate and the report read these instead of guessing from the name.

Logged keys are a base key (``hit_at_5``) in one of a few *forms*, each a fixed prefix/suffix
(:data:`FORMS`): the mean itself, ``{key}_ci_low`` / ``{key}_ci_high``, ``n_scored/{key}``,
``by_tag/{tag}/{key}`` and the ``compare/{key}/{stat}`` metrics ``compare --log`` writes.
:func:`parse` undoes a form, then matches the base key against the registered patterns;
:func:`render_key` builds a key from a pattern, its parameters and a form.

Why this module is long (~540 lines): most of it is :data:`REGISTRY`, one declaration per metric
(pattern, side, direction, function, definition text). Kept in one table so that every key is
defined once and read by everyone; the code that parses and renders keys is ~100 lines.
"""

from __future__ import annotations

import importlib
import re
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from rag_experiments.evaluation.labels import FAILURE_LABELS, RATE_LABELS

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

Side = Literal["retrieval", "generation", "diagnostic", "label", "cost", "count"]
ValueType = Literal["binary", "proportion", "continuous", "count"]

#: What each pattern placeholder may be; anything else in a pattern is literal text.
_PLACEHOLDERS: dict[str, str] = {
    "k": r"[1-9]\d*",  # rank cut-off
    "B": r"[1-9]\d*",  # token budget of the context
    "label": "|".join(FAILURE_LABELS),
    "stage": "retrieval|generation|judge",  # a pipeline stage with its own latency / tokens
}
_INT_PLACEHOLDERS = frozenset({"k", "B"})


@dataclass(frozen=True)
class MetricSpec:
    """One metric key pattern and everything a consumer needs to know about it.

    ``higher_is_better`` is None for descriptive counts (``n_queries``) that have no better side.
    ``per_query``: a per-query column whose mean (with a bootstrap CI, ``n_scored/`` and
    ``by_tag/``) is the logged aggregate; otherwise the key is logged as is (counts) or not
    aggregated at all (latencies: compared only when asked for by name).
    ``headline``: position in the run summary (None = not shown there); ``every_k``: the summary
    also lists it at every ``metrics.ks``, not only at the context k.
    ``compute``: dotted path of the pure function that computes the per-query value (resolved
    lazily by :meth:`function`, so importing the registry loads no judge or model code).
    """

    pattern: str
    side: Side
    higher_is_better: bool | None
    value_type: ValueType
    definition: str
    compute: str | None = None
    per_query: bool = True
    headline: int | None = None
    every_k: bool = False
    params: tuple[str, ...] = field(init=False)
    _regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [f for _, f, _, _ in string.Formatter().parse(self.pattern) if f]
        unknown = set(names) - set(_PLACEHOLDERS)
        if unknown:
            raise ValueError(f"{self.pattern}: unknown placeholder(s) {sorted(unknown)}")
        rx = "".join(
            re.escape(lit) + (f"(?P<{name}>{_PLACEHOLDERS[name]})" if name else "")
            for lit, name, _, _ in string.Formatter().parse(self.pattern)
        )
        object.__setattr__(self, "params", tuple(names))
        object.__setattr__(self, "_regex", re.compile(rx))

    def match(self, key: str) -> dict[str, Any] | None:
        """The placeholder values when ``key`` is an instance of this pattern (ints for k and B)."""
        m = self._regex.fullmatch(key)
        if m is None:
            return None
        return {n: (int(v) if n in _INT_PLACEHOLDERS else v) for n, v in m.groupdict().items()}

    def render(self, **params: Any) -> str:
        missing = set(self.params) - set(params)
        if missing:
            raise ValueError(f"{self.pattern}: missing parameter(s) {sorted(missing)}")
        key = self.pattern.format(**{n: params[n] for n in self.params})
        if self.match(key) is None:
            raise ValueError(f"{self.pattern}: {params} does not give a valid key ({key!r})")
        return key

    def function(self) -> Callable | None:
        if self.compute is None:
            return None
        module, _, name = self.compute.rpartition(".")
        return getattr(importlib.import_module(module), name)


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
    Form("compare_delta", prefix="compare/", suffix="/delta"),
    Form("compare_ci_low", prefix="compare/", suffix="/ci_low"),
    Form("compare_ci_high", prefix="compare/", suffix="/ci_high"),
    Form("compare_p_value", prefix="compare/", suffix="/p_value"),
    Form("mean"),
)
_FORMS = {f.name: f for f in FORMS}
#: Forms only per-query metrics have (a count or a latency has no CI, n_scored or per-tag value).
_AGGREGATE_FORMS = frozenset({"ci_low", "ci_high", "n_scored", "by_tag"})

_M = "rag_experiments.evaluation.metrics."
_J = "rag_experiments.stages.judging."
_B = "rag_experiments.evaluation.budget."
_D = "rag_experiments.evaluation.diagnostics."
_TOKEN_UNION = "the union of the top-k chunks' character ranges (overlaps counted once)"
_BUDGET = (
    "the B-token context (the ranked chunks in order up to B tokens of the fixed MiniLM tokenizer "
    "named in the run tag token_budget_tokenizer, the last one cut at B)"
)

REGISTRY: tuple[MetricSpec, ...] = (
    # -- retrieval
    MetricSpec(
        "hit_at_{k}",
        "retrieval",
        True,
        "binary",
        "1 if any relevant chunk is in the top k, else 0 (the seed article's recall@k)",
        _M + "hit_at_k",
        headline=1,
        every_k=True,
    ),
    MetricSpec(
        "evidence_recall_at_{k}",
        "retrieval",
        True,
        "proportion",
        "share of the query's evidence spans of which the union of the top-k chunks covers at least "
        "metrics.min_coverage of the characters (a chunk credits only the characters it covers)",
        _M + "evidence_recall_at_k",
        headline=2,
    ),
    MetricSpec(
        "mrr",
        "retrieval",
        True,
        "continuous",
        "per query 1/rank of the first relevant chunk within the top metrics.rank_depth (default 100, "
        "independent of metrics.ks and retriever.k; 0 if none); the mean is MRR",
        _M + "reciprocal_rank",
        headline=3,
    ),
    MetricSpec(
        "context_precision_at_{k}",
        "retrieval",
        True,
        "proportion",
        "relevant chunks in the top k / k (missing ranks count as not relevant)",
        _M + "context_precision_at_k",
        headline=4,
    ),
    MetricSpec(
        "ndcg_at_{k}",
        "retrieval",
        True,
        "continuous",
        "DCG@k / ideal DCG@k with binary gains and log2(rank + 1) discount; the ideal ranking puts "
        "every relevant chunk of the chunk set first",
        _M + "ndcg_at_k",
        headline=5,
    ),
    MetricSpec(
        "token_recall_at_{k}",
        "retrieval",
        True,
        "proportion",
        f"share of the gold-evidence characters covered by {_TOKEN_UNION}",
        _M + "token_recall_at_k",
    ),
    MetricSpec(
        "token_precision_at_{k}",
        "retrieval",
        True,
        "proportion",
        f"share of the characters of {_TOKEN_UNION} that are gold evidence (nothing retrieved: 0)",
        _M + "token_precision_at_k",
    ),
    MetricSpec(
        "token_iou_at_{k}",
        "retrieval",
        True,
        "proportion",
        f"characters in gold ∩ retrieved / characters in gold ∪ retrieved, retrieved = {_TOKEN_UNION}",
        _M + "token_iou_at_k",
    ),
    MetricSpec(
        "evidence_recall_at_{B}tok",
        "retrieval",
        True,
        "proportion",
        f"share of the query's evidence spans of which {_BUDGET} covers at least "
        "metrics.min_coverage of the characters",
        _B + "budgeted_metrics",
    ),
    MetricSpec(
        "hit_at_{B}tok",
        "retrieval",
        True,
        "binary",
        f"1 if a chunk (or the cut part of one) of {_BUDGET} is relevant to a gold span (covers "
        "metrics.min_coverage of it or lies inside it), else 0",
        _B + "budgeted_metrics",
    ),
    MetricSpec(
        "token_precision_at_{B}tok",
        "retrieval",
        True,
        "proportion",
        f"share of the characters of {_BUDGET} that are gold evidence (overlaps counted once)",
        _B + "budgeted_metrics",
    ),
    # -- generation
    MetricSpec(
        "faithfulness",
        "generation",
        True,
        "proportion",
        "supported claims / judged claims; unparseable verdicts are counted (n_unparseable_verdicts) "
        'and excluded, never read as "no"; NaN when no claim is scorable',
        _J + "faithfulness",
        headline=10,
    ),
    MetricSpec(
        "answer_relevance",
        "generation",
        True,
        "continuous",
        "heuristic judge: cosine(answer, query); LLM judge: mean cosine of N generated questions to "
        "the query; always with the fixed MiniLM metric embedder",
        None,  # a judge method (HeuristicJudge / LLMJudge .answer_relevance), not a free function
        headline=11,
    ),
    MetricSpec(
        "correctness",
        "generation",
        True,
        "proportion",
        "share of key_facts present in the answer (normalised match); unanswerable: 1 if the answer declines",
        _J + "correctness",
        headline=12,
    ),
    # -- claim-level diagnostics (docs/metrics.md, "Claim-level diagnostics")
    MetricSpec(
        "claim_recall",
        "diagnostic",
        True,
        "proportion",
        "share of the gold claims (the judge's claims of gold_answer, else key_facts) the judge finds "
        "entailed by the retrieved top-k context; unanswerable items: NaN",
        _D + "claim_recall",
    ),
    MetricSpec(
        "context_utilization",
        "diagnostic",
        True,
        "proportion",
        "of the gold claims the retrieved context entails, the share the answer entails (a declining "
        "answer: 0); NaN when the context entails no gold claim",
        _D + "context_utilization",
    ),
    MetricSpec(
        "noise_sensitivity_relevant",
        "diagnostic",
        False,
        "proportion",
        "share of the answer claims that are incorrect (not entailed by the gold answer) yet entailed "
        "by a relevant retrieved chunk (one relevant to a gold span)",
        _D + "answer_claim_shares",
    ),
    MetricSpec(
        "noise_sensitivity_irrelevant",
        "diagnostic",
        False,
        "proportion",
        "share of the answer claims that are incorrect and entailed only by irrelevant retrieved chunks",
        _D + "answer_claim_shares",
    ),
    MetricSpec(
        "hallucination",
        "diagnostic",
        False,
        "proportion",
        "share of the answer claims that no retrieved chunk entails and that are incorrect",
        _D + "answer_claim_shares",
    ),
    MetricSpec(
        "self_knowledge",
        "diagnostic",
        False,  # as in RAGChecker: a RAG answer should rest on the context, not on the model
        "proportion",
        "share of the answer claims that no retrieved chunk entails but that are correct (entailed by "
        "the gold answer)",
        _D + "answer_claim_shares",
    ),
    # -- failure labels: one indicator column per label, its mean the rate
    MetricSpec(
        "rate_{label}",
        "label",
        None,  # per label: see _LABEL_DIRECTION
        "binary",
        "share of queries with that failure label (decision table in evaluation.labels.failure_label)",
        None,
        headline=20,
    ),
    # -- cost (per-query columns, not aggregated; compared only when asked for by name)
    MetricSpec(
        "latency_retrieval_s",
        "cost",
        False,
        "continuous",
        "retrieval wall time of the whole eval set divided by its number of queries, seconds",
        per_query=False,
    ),
    MetricSpec(
        "latency_generation_s",
        "cost",
        False,
        "continuous",
        "wall time of the query's generation call, seconds",
        per_query=False,
    ),
    MetricSpec(
        "latency_judge_s",
        "cost",
        False,
        "continuous",
        "wall time of judging the query's answer (claims, verdicts, relevance), seconds",
        per_query=False,
    ),
    MetricSpec(
        "tokens_in_{stage}",
        "cost",
        False,
        "count",
        "prompt tokens the endpoint reported (usage.prompt_tokens) for the query's stage calls; NaN when "
        "it reported none",
        "rag_experiments.evaluation.cost.usage_columns",
        per_query=False,
    ),
    MetricSpec(
        "tokens_out_{stage}",
        "cost",
        False,
        "count",
        "completion tokens the endpoint reported (usage.completion_tokens) for the query's stage calls; "
        "NaN when it reported none",
        "rag_experiments.evaluation.cost.usage_columns",
        per_query=False,
    ),
    MetricSpec(
        "tokens_in/{stage}",
        "cost",
        False,
        "count",
        "sum over queries of tokens_in_{stage} (queries without a count left out)",
        "rag_experiments.evaluation.cost.cost_metrics",
        per_query=False,
    ),
    MetricSpec(
        "tokens_out/{stage}",
        "cost",
        False,
        "count",
        "sum over queries of tokens_out_{stage} (queries without a count left out)",
        "rag_experiments.evaluation.cost.cost_metrics",
        per_query=False,
    ),
    MetricSpec(
        "cost_usd",
        "cost",
        False,
        "continuous",
        "sum over generation and judge of tokens_in/1000 x pricing.price_per_1k_in + tokens_out/1000 x "
        "pricing.price_per_1k_out (the stage's generator/judge config; absent: 0 USD); NaN when a priced "
        "stage lacks token counts",
        "rag_experiments.evaluation.cost.cost_metrics",
        per_query=False,
    ),
    MetricSpec(
        "latency_p50_ms/{stage}",
        "cost",
        False,
        "continuous",
        "median over queries of latency_{stage}_s, in milliseconds",
        "rag_experiments.evaluation.cost.cost_metrics",
        per_query=False,
    ),
    MetricSpec(
        "latency_p95_ms/{stage}",
        "cost",
        False,
        "continuous",
        "95th percentile (linear interpolation) over queries of latency_{stage}_s, in milliseconds",
        "rag_experiments.evaluation.cost.cost_metrics",
        per_query=False,
    ),
    # -- counts
    MetricSpec("n_queries", "count", None, "count", "number of eval items in the run", per_query=False),
    MetricSpec(
        "n_unanswerable",
        "count",
        None,
        "count",
        "number of eval items without gold evidence (excluded from retrieval means)",
        per_query=False,
    ),
    MetricSpec(
        "n_generated",
        "count",
        None,
        "count",
        "number of eval items generated and judged (generation_subset; generation means cover these)",
        per_query=False,
    ),
    MetricSpec(
        "n_errors", "count", False, "count", "number of queries whose generation failed", per_query=False
    ),
    MetricSpec(
        "n_unparseable_verdicts",
        "count",
        False,
        "count",
        "number of judge verdicts that could not be parsed, summed over queries",
        per_query=False,
    ),
    MetricSpec(
        "n_unparseable_diagnostic_verdicts",
        "count",
        False,
        "count",
        "number of claim-level diagnostic verdicts that could not be parsed (left out of the diagnostics), "
        "summed over queries",
        per_query=False,
    ),
    MetricSpec(
        "n_unparseable_diagnostics",
        "count",
        False,
        "count",
        "number of the query's claim-level diagnostic verdicts that could not be parsed",
        per_query=False,
    ),
    MetricSpec(
        "n_claims", "count", None, "count", "number of claims the answer was split into", per_query=False
    ),
    MetricSpec(
        "n_unparseable",
        "count",
        False,
        "count",
        "number of the query's claim verdicts that could not be parsed",
        per_query=False,
    ),
)

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
#: Per-query columns the judge fills (NaN when a query has no answer to judge).
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
