"""Our scorers in ``mlflow.genai.evaluate`` on a tiny traced app, against a sqlite store in tmp_path."""

from __future__ import annotations

import math

import mlflow
import pytest
from mlflow.entities import Document

from rag_experiments.tracking import scorers

DOCS = {
    "retries.md": "Webhooks are retried with exponential backoff for 24 hours. After that the event is dropped.",
    "limits.md": "The API allows 100 requests per second per key. Bursts above that get HTTP 429.",
    "refunds.md": "Refunds are issued to the original payment method within 5 business days. Partial refunds are allowed.",
}


def _chunks():
    """Two chunks per document with exact offsets, as our chunkers make them."""
    out = []
    for doc_id, text in DOCS.items():
        cut = text.index(". ") + 2
        out += [(doc_id, 0, cut), (doc_id, cut, len(text))]
    return out


def _rank(query: str) -> list[tuple[str, int, int]]:
    """A deterministic toy retriever: chunks sorted by shared words with the query."""
    q = set(query.lower().split())
    return sorted(_chunks(), key=lambda c: -len(q & set(DOCS[c[0]][c[1] : c[2]].lower().split())))


@mlflow.trace(span_type="RETRIEVER")
def retrieve(query: str) -> list[Document]:
    return [
        Document(page_content=DOCS[d][s:e], metadata={"doc_id": d, "start": s, "end": e}, id=f"{d}#{s}-{e}")
        for d, s, e in _rank(query)
    ]


@mlflow.trace
def app(query: str) -> str:
    docs = retrieve(query)
    return docs[0].page_content  # "generation": quote the top chunk


def _gold(doc_id: str, quote: str, offsets: bool = True) -> dict:
    start = DOCS[doc_id].index(quote)
    g = {"doc_uri": doc_id, "content": quote}
    if offsets:
        g.update(start=start, end=start + len(quote))
    return g


@pytest.fixture
def store(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    mlflow.set_experiment("scorers")
    yield tmp_path
    mlflow.set_tracking_uri(None)


def test_evaluate_with_our_scorers_on_a_traced_app(store):
    data = [
        {  # top chunk is the evidence: hit, rank 1
            "inputs": {"query": "how long are webhooks retried with backoff"},
            "expectations": {
                "expected_retrieved_context": [
                    _gold("retries.md", "retried with exponential backoff for 24 hours")
                ],
                "expected_facts": ["24 hours"],
            },
        },
        {  # evidence is in limits.md's second chunk; the query's words rank refunds first
            "inputs": {"query": "refunds original payment method HTTP 429 bursts"},
            "expectations": {
                "expected_retrieved_context": [_gold("limits.md", "Bursts above that get HTTP 429", False)]
            },
        },
        {  # unanswerable: retrieval metrics do not apply
            "inputs": {"query": "does it support sqs"},
            "expectations": {"expected_retrieved_context": []},
        },
    ]
    result = mlflow.genai.evaluate(data=data, predict_fn=app, scorers=scorers.default_scorers(k=1))
    traces = mlflow.search_traces(run_id=result.run_id, return_type="list")
    assert len(traces) == 3
    by_query = {t.data._get_root_span().inputs["query"]: t for t in traces}

    def fb(query, name):
        (a,) = [a for a in by_query[query].info.assessments if a.name == name and a.feedback is not None]
        return a

    q1, q2, q3 = (d["inputs"]["query"] for d in data)
    assert fb(q1, "hit_at_1").value == 1.0 and fb(q1, "reciprocal_rank").value == 1.0
    assert fb(q1, "evidence_recall_at_1").value == 1.0
    assert fb(q1, "faithfulness").value == 1.0  # the answer is the context itself
    assert fb(q1, "failure_label").value == "ok"
    # q2: text-only gold (no offsets) matched by containment, found below rank 1
    ranked = [d for d, *_ in _rank(q2)]
    rank = next(i for i, (d, s, e) in enumerate(_rank(q2), 1) if d == "limits.md" and s > 0)
    assert ranked[0] != "limits.md" and rank > 1
    assert fb(q2, "hit_at_1").value == 0.0
    assert fb(q2, "reciprocal_rank").value == pytest.approx(1 / rank)
    assert fb(q2, "failure_label").value in ("retrieval_failure", "correct_without_evidence")
    for name in ("hit_at_1", "reciprocal_rank", "evidence_recall_at_1"):
        a = fb(q3, name)
        assert a.value is None and a.error is not None and "unanswerable" in a.error.error_message
    assert math.isclose(result.metrics["hit_at_1/mean"], 0.5)


def test_offsets_use_the_pipelines_relevance_rule():
    doc = {"page_content": "x" * 40, "metadata": {"doc_id": "a.md", "start": 0, "end": 40}}
    # the chunk covers 30 of the span's 60 characters: relevant at min_coverage 0.5, not at 0.6
    gold = {"doc_uri": "a.md", "start": 10, "end": 70, "content": ""}
    assert scorers._relevant(doc, gold, 0.5) and not scorers._relevant(doc, gold, 0.6)
    assert not scorers._relevant(doc, {**gold, "doc_uri": "b.md"}, 0.5)
