"""Our per-query metrics as MLflow scorers, for ``mlflow.genai.evaluate`` on your own traced app.

    import mlflow
    from rag_experiments.tracking import scorers

    results = mlflow.genai.evaluate(
        data=[{"inputs": {"query": q}, "expectations": {"expected_retrieved_context": gold}} ...],
        predict_fn=my_app,                    # traced, with a RETRIEVER span
        scorers=scorers.default_scorers(k=5), # hit@5, reciprocal rank, evidence recall@5, ...
    )

The retrieval scorers read the app's last RETRIEVER span (its outputs are MLflow Documents, ranked)
and ``expectations["expected_retrieved_context"]``: a list of gold evidence spans
``{"doc_uri", "content"}``, optionally with character offsets ``"start"``/``"end"`` (the traces
``rag_experiments`` logs carry them). Relevance is ``evaluation.metrics.relevance`` when both the
document (metadata ``doc_id``/``doc_uri``, ``start``, ``end``) and the span have offsets; without
offsets it is the same rule decided on text: the document contains the whole span's text (coverage
1) or its text lies wholly inside the span's (after whitespace/case normalisation). Definitions of
each metric: ``docs/metrics.md`` and ``evaluation.registry``. A metric that does not apply (no gold
evidence: an unanswerable item; no RETRIEVER span) is returned as a feedback error, never as 0.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np
from mlflow.entities import AssessmentError, AssessmentSource, AssessmentSourceType, Feedback, SpanType
from mlflow.genai.scorers import scorer

from rag_experiments.core.types import Chunk, Span
from rag_experiments.evaluation import metrics as M
from rag_experiments.evaluation.answer_scores import key_fact_counts
from rag_experiments.evaluation.defaults import MIN_COVERAGE
from rag_experiments.evaluation.labels import failure_label as label_of
from rag_experiments.judge import correctness
from rag_experiments.judge import faithfulness as faith_of

SOURCE = AssessmentSource(AssessmentSourceType.CODE, "rag_experiments.tracking.scorers")
GOLD_KEY = "expected_retrieved_context"


def _not_scored(name: str, why: str) -> Feedback:
    return Feedback(name, None, error=AssessmentError("NOT_SCORED", why), source=SOURCE)


def retrieved_documents(trace) -> list[dict] | None:
    """The ranked documents of the trace's last RETRIEVER span as dicts, or None without one."""
    spans = trace.search_spans(span_type=SpanType.RETRIEVER) if trace is not None else []
    if not spans:
        return None
    out = []
    for d in spans[-1].outputs or []:
        d = d if isinstance(d, dict) else getattr(d, "to_dict", lambda d=d: {"page_content": str(d)})()
        out.append({"page_content": d.get("page_content") or "", "metadata": d.get("metadata") or {}})
    return out


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s or "").strip().casefold()


def _relevant(doc: dict, gold: dict, min_coverage: float) -> bool:
    """Relevance of one retrieved document to one gold span (module docstring)."""
    m = doc["metadata"]
    d_id = m.get("doc_id") or m.get("doc_uri")
    g_id = gold.get("doc_uri") or gold.get("doc_id")
    if None not in (m.get("start"), m.get("end"), gold.get("start"), gold.get("end")) and d_id and g_id:
        chunk = Chunk("", str(d_id), int(m["start"]), int(m["end"]), doc["page_content"])
        return M.relevance(chunk, Span(str(g_id), int(gold["start"]), int(gold["end"])), min_coverage)
    if d_id and g_id and str(d_id) != str(g_id):
        return False
    text, span = _norm(doc["page_content"]), _norm(gold.get("content", ""))
    return bool(text and span) and (span in text or text in span)


def _recalled(top: list[dict], gold: dict, min_coverage: float) -> bool:
    """Coverage-based recall of one gold span, as ``evaluation.metrics.evidence_recall_at_k``: the
    union of the top documents' character ranges covers at least ``min_coverage`` of it. Without
    offsets on both sides: recalled when some top document is relevant (text containment)."""
    g_id, gs, ge = gold.get("doc_uri") or gold.get("doc_id"), gold.get("start"), gold.get("end")
    ranges = []
    for d in top:
        m = d["metadata"]
        if None in (gs, ge, m.get("start"), m.get("end")):
            return any(_relevant(x, gold, min_coverage) for x in top)
        if str(m.get("doc_id") or m.get("doc_uri")) == str(g_id):
            ranges.append((int(m["start"]), int(m["end"])))
    covered = M.covered_chars(ranges, int(gs), int(ge))
    return bool(M.span_recalled(covered, int(ge) - int(gs), min_coverage))


def span_hits(trace, expectations: dict | None, min_coverage: float = MIN_COVERAGE) -> np.ndarray | str:
    """Bool (n_retrieved, n_spans): document r is relevant to gold span s; a reason string when the
    retrieval metrics do not apply to this row."""
    docs = retrieved_documents(trace)
    if docs is None:
        return "the trace has no RETRIEVER span"
    gold = (expectations or {}).get(GOLD_KEY)
    if gold is None:
        return f"no expectations[{GOLD_KEY!r}]"
    if not gold:
        return "no gold evidence (unanswerable item): retrieval metrics do not apply"
    return np.array([[_relevant(d, g, min_coverage) for g in gold] for d in docs], dtype=bool).reshape(
        len(docs), len(gold)
    )


def hit_at(k: int, min_coverage: float = MIN_COVERAGE):
    """Scorer ``hit_at_{k}``: 1 if any of the top k retrieved documents is relevant, else 0."""

    def fn(trace, expectations) -> Feedback:
        hits = span_hits(trace, expectations, min_coverage)
        if isinstance(hits, str):
            return _not_scored(f"hit_at_{k}", hits)
        v = float(M.hit_at_k(hits.any(axis=1)[None, :], k)[0])
        return Feedback(f"hit_at_{k}", v, source=SOURCE, rationale=M.hit_at_k.__doc__.split("\n")[0])

    return scorer(fn, name=f"hit_at_{k}")


def evidence_recall_at(k: int, min_coverage: float = MIN_COVERAGE):
    """Scorer ``evidence_recall_at_{k}``: share of the gold spans covered by some top-k document."""

    def fn(trace, expectations) -> Feedback:
        hits = span_hits(trace, expectations, min_coverage)
        if isinstance(hits, str):
            return _not_scored(f"evidence_recall_at_{k}", hits)
        gold = (expectations or {}).get(GOLD_KEY) or []
        top = (retrieved_documents(trace) or [])[:k]
        v = float(np.mean([_recalled(top, g, min_coverage) for g in gold]))
        return Feedback(
            f"evidence_recall_at_{k}",
            v,
            source=SOURCE,
            rationale=f"{v * hits.shape[1]:.0f} of {hits.shape[1]} gold spans in the top {k}",
        )

    return scorer(fn, name=f"evidence_recall_at_{k}")


@scorer(name="reciprocal_rank")
def reciprocal_rank(trace, expectations) -> Feedback:
    """1 / rank of the first relevant document (0 if none); its mean over queries is MRR."""
    hits = span_hits(trace, expectations)
    if isinstance(hits, str):
        return _not_scored("reciprocal_rank", hits)
    rel = hits.any(axis=1)
    v = float(M.reciprocal_rank(rel[None, :])[0])
    why = (
        f"first relevant document at rank {int(np.argmax(rel)) + 1}"
        if rel.any()
        else "no relevant document retrieved"
    )
    return Feedback("reciprocal_rank", v, source=SOURCE, rationale=why)


@functools.lru_cache(maxsize=1)
def heuristic_judge():
    """The offline judge with the shipped calibration (``conf/judge/heuristic.yaml``)."""
    from rag_experiments.judge.validity import build_judge  # the one way to build a judge

    return build_judge("heuristic")


def _context(trace, k: int | None) -> str | None:
    docs = retrieved_documents(trace)
    return None if docs is None else "\n\n".join(d["page_content"] for d in docs[:k])


def _faithfulness(outputs: Any, trace, k: int | None) -> tuple[float, list[str]] | str:
    if not isinstance(outputs, str):
        return "the app's output is not an answer string"
    context = _context(trace, k)
    if context is None:
        return "the trace has no RETRIEVER span"
    judge = heuristic_judge()
    verdicts = judge.verdicts(judge.split(outputs), context)
    value, _, _ = faith_of(verdicts)
    return value, [v.claim for v in verdicts if v.label != "supported"]


def faithfulness(k: int | None = None):
    """Scorer ``faithfulness`` (heuristic judge): supported claims / judged claims of the answer
    against the top-k retrieved documents (all of them when ``k`` is None)."""

    def fn(outputs, trace) -> Feedback:
        got = _faithfulness(outputs, trace, k)
        if isinstance(got, str):
            return _not_scored("faithfulness", got)
        value, bad = got
        if value != value:  # NaN: no scorable claim
            return _not_scored("faithfulness", "no scorable claim in the answer")
        why = "unsupported claims: " + " | ".join(bad) if bad else "every claim supported by the context"
        return Feedback(
            "faithfulness",
            value,
            source=AssessmentSource(AssessmentSourceType.CODE, "HeuristicJudge"),
            rationale=why,
        )

    return scorer(fn, name="faithfulness")


def failure_label(k: int, min_coverage: float = MIN_COVERAGE, thresholds: Any = None):
    """Scorer ``failure_label``: the decision table of ``evaluation.labels.failure_label`` on
    hit@k, correctness (``expected_facts`` found in the answer; declining for unanswerable items)
    and heuristic faithfulness."""

    def fn(outputs, trace, expectations) -> Feedback:
        gold = (expectations or {}).get(GOLD_KEY)
        if gold is None or retrieved_documents(trace) is None:
            return _not_scored("failure_label", f"needs a RETRIEVER span and expectations[{GOLD_KEY!r}]")
        answerable = bool(gold)
        hit = False
        if answerable:
            hits = span_hits(trace, expectations, min_coverage)
            hit = bool(hits[:k].any())
        generated = isinstance(outputs, str)
        corr = faith = float("nan")
        contradicted = False
        if generated:
            facts = list((expectations or {}).get("expected_facts") or [])
            corr = correctness(outputs, facts, answerable)
            contradicted = key_fact_counts(outputs, facts, answerable)["n_contradicted_key_facts"] > 0
            got = _faithfulness(outputs, trace, k)
            faith = got[0] if not isinstance(got, str) else float("nan")
        label = label_of(answerable, hit, corr, faith, generated, None, thresholds, contradicted)
        why = f"hit_at_{k}={float(hit)}, correctness={corr}, faithfulness={faith}"
        return Feedback("failure_label", label, source=SOURCE, rationale=why)

    return scorer(fn, name="failure_label")


def default_scorers(k: int = 5, judge: bool = True) -> list:
    """hit@k, evidence recall@k, reciprocal rank and, with ``judge``, faithfulness and the label."""
    out = [hit_at(k), evidence_recall_at(k), reciprocal_rank]
    if judge:
        out += [faithfulness(k), failure_label(k)]
    return out
