"""Every metric the pipeline logs, declared once as a :class:`MetricSpec` (docs/metrics.md).

One declaration per metric (pattern, side, direction, value type, definition text, the dotted path
of the pure function that computes it); :mod:`rag_experiments.evaluation.registry` reads this table
to parse, render, order and judge the direction of logged keys.

The table is split along what it declares: the quality metrics here (retrieval, generation, the
judge-free and claim-level ones, the failure labels), the bookkeeping in
:mod:`rag_experiments.evaluation.metric_table_bookkeeping` (cost, noise, counts, the judge's
card); ``REGISTRY`` is both, in that order.
"""

from __future__ import annotations

from rag_experiments.evaluation.metric_spec import MetricSpec
from rag_experiments.evaluation.metric_table_bookkeeping import BOOKKEEPING

_M = "rag_experiments.evaluation.metrics."
_S = "rag_experiments.evaluation.answer_scores."
_B = "rag_experiments.evaluation.budget."
_D = "rag_experiments.evaluation.diagnostics."
_A = "rag_experiments.evaluation.answer_metrics."
#: What makes a metric incomparable across configs (metric_spec.BREAKS; analysis.comparability).
_CHUNKS, _JUDGE, _KEY_FACTS = ("chunks",), ("judge",), ("key_facts",)
_CITE = "prompts that ask for [n] citations (prompt=cite; NaN for other prompts)"
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
        columns=("retrieved", "gold_spans"),
        breaks=_CHUNKS,
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
        columns=("retrieved", "gold_spans"),
        breaks=_CHUNKS,
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
        columns=("retrieved", "gold_spans"),
        breaks=_CHUNKS,
    ),
    MetricSpec(
        "context_precision_at_{k}",
        "retrieval",
        True,
        "proportion",
        "relevant chunks in the top k / k (missing ranks count as not relevant)",
        _M + "context_precision_at_k",
        headline=4,
        columns=("retrieved", "gold_spans"),
        breaks=_CHUNKS,
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
        columns=("retrieved", "gold_spans"),
        breaks=_CHUNKS,
    ),
    MetricSpec(
        "token_recall_at_{k}",
        "retrieval",
        True,
        "proportion",
        f"share of the gold-evidence characters covered by {_TOKEN_UNION}",
        _M + "token_recall_at_k",
        columns=("retrieved", "gold_spans"),
        breaks=_CHUNKS,
    ),
    MetricSpec(
        "token_precision_at_{k}",
        "retrieval",
        True,
        "proportion",
        f"share of the characters of {_TOKEN_UNION} that are gold evidence (nothing retrieved: 0)",
        _M + "token_precision_at_k",
        columns=("retrieved", "gold_spans"),
        breaks=_CHUNKS,
    ),
    MetricSpec(
        "token_iou_at_{k}",
        "retrieval",
        True,
        "proportion",
        f"characters in gold ∩ retrieved / characters in gold ∪ retrieved, retrieved = {_TOKEN_UNION}",
        _M + "token_iou_at_k",
        columns=("retrieved", "gold_spans"),
        breaks=_CHUNKS,
    ),
    MetricSpec(
        "evidence_recall_at_{B}tok",
        "retrieval",
        True,
        "proportion",
        f"share of the query's evidence spans of which {_BUDGET} covers at least "
        "metrics.min_coverage of the characters",
        _B + "evidence_recall_in_budget",
    ),
    MetricSpec(
        "hit_at_{B}tok",
        "retrieval",
        True,
        "binary",
        f"1 if a chunk (or the cut part of one) of {_BUDGET} is relevant to a gold span (covers "
        "metrics.min_coverage of it or lies inside it; a cut chunk only when the whole chunk is too), else 0",
        _B + "hit_in_budget",
    ),
    MetricSpec(
        "token_precision_at_{B}tok",
        "retrieval",
        True,
        "proportion",
        f"share of the characters of {_BUDGET} that are gold evidence (overlaps counted once)",
        _B + "token_precision_in_budget",
    ),
    # -- generation
    MetricSpec(
        "faithfulness",
        "generation",
        True,
        "proportion",
        "supported claims / judged claims; unparseable verdicts are counted (n_unparseable_verdicts) "
        'and excluded, never read as "no"; NaN when no claim is scorable',
        _S + "faithfulness_score",
        headline=10,
        columns=("verdicts",), breaks=_JUDGE,
    ),
    MetricSpec(
        "answer_relevance",
        "generation",
        True,
        "continuous",
        "heuristic judge: cosine(answer, query); LLM judge: mean cosine of N generated questions to "
        "the query; always with the fixed MiniLM metric embedder",
        None,  # a judge method (HeuristicJudge / LLMJudge .answer_relevance), not a free function
        headline=11, breaks=_JUDGE,
    ),
    MetricSpec(
        "correctness_judged",
        "generation",
        True,
        "proportion",
        "judge models only (judge=openai, local, mlflow): share of the item's strong key_facts (else its reference "
        "answer, as one fact) that the judge reads as stated by the answer, of those it read as supported, "
        "contradicted or absent (unparseable verdicts excluded and counted: n_unparseable_fact_verdicts); "
        "unanswerable: 1 if the answer declines",
        "rag_experiments.evaluation.fact_scores.correctness_judged",
        columns=("answer",), breaks=(*_JUDGE, *_KEY_FACTS),
    ),
    MetricSpec(
        "correctness",
        "generation",
        True,
        "proportion",
        "share of the item's strong key_facts (weak ones left out: n_weak_key_facts) the answer asserts: present as "
        "whole tokens (normalised match, numbers as numbers in any spelling) outside a negation; a negated or "
        "contradicted fact counts 0 (n_negated_key_facts, n_contradicted_key_facts); unanswerable: 1 if the answer "
        "declines",
        _S + "correctness",
        headline=12,
        columns=("answer",), breaks=_KEY_FACTS,
    ),
    # -- judge-free generation metrics (docs/metrics.md, "Judge-free generation metrics")
    MetricSpec(
        "answer_token_f1",
        "generation",
        True,
        "continuous",
        "SQuAD v1.1 token F1 of the answer (after 'Answer:' if it has one; citation markers removed) against the gold answer(s), the "
        "best over gold_answers; normalised: lower case, no punctuation, no a/an/the, whitespace "
        "collapsed; unanswerable items and items without a gold answer: NaN",
        _A + "answer_token_f1",
        headline=13,
        columns=("answer",),
    ),
    MetricSpec(
        "answer_exact_match",
        "generation",
        True,
        "binary",
        "1 if the normalised answer (SQuAD v1.1; after 'Answer:' if it has one; citation markers removed) equals a normalised gold "
        "answer, else 0; unanswerable items and items without a gold answer: NaN",
        _A + "answer_exact_match",
        headline=14,
        columns=("answer",),
    ),
    MetricSpec(
        "citation_precision",
        "generation",
        True,
        "proportion",
        "cited passages relevant to a gold span (the retrieval relevance rule) / cited passages, a "
        f"number naming no passage counted as not relevant; nothing cited or a decline: NaN; {_CITE}",
        _A + "citation_precision",
        headline=15,
        columns=("cited_chunk_ids", "gold_spans"), breaks=_CHUNKS,
    ),
    MetricSpec(
        "citation_recall",
        "generation",
        True,
        "proportion",
        "share of the gold spans the cited passages together cover (metrics.min_coverage of the "
        f"characters, the evidence-recall rule); nothing cited: 0; unanswerable or a decline: NaN; {_CITE}",
        _A + "citation_recall",
        headline=16,
        columns=("cited_chunk_ids", "gold_spans"), breaks=_CHUNKS,
    ),
    MetricSpec(
        "rate_uncited_answer",
        "generation",
        False,
        "binary",
        f"1 if an answer that does not decline carries no citation marker, else 0; declines: NaN; {_CITE}",
        _A + "rate_uncited_answer",
        headline=17,
        columns=("answer", "declined"),
    ),
    MetricSpec(
        "rate_over_refusal",
        "generation",
        False,
        "binary",
        "answerable items: 1 if the answer declines (judge.claims.is_decline), else 0; unanswerable: NaN",
        _A + "rate_over_refusal",
        headline=18,
        columns=("declined", "gold_spans"),
    ),
    MetricSpec(
        "rate_false_answer",
        "generation",
        False,
        "binary",
        "unanswerable items: 1 if the answer does not decline (judge.claims.is_decline), else 0; "
        "answerable: NaN",
        _A + "rate_false_answer",
        headline=19,
        columns=("declined", "gold_spans"),
    ),
    MetricSpec(
        "abstention_f1",
        "generation",
        True,
        "proportion",
        "F1 of declining as a detector of unanswerable items over the generated answers: 2TP / (2TP + "
        "FP + FN), TP unanswerable and declined, FP answerable and declined, FN unanswerable and "
        "answered; logged only when the run has unanswerable items; run-level (no CI)",
        _A + "abstention_f1",
        per_query=False,
        columns=("declined", "gold_spans"),
    ),
    MetricSpec(
        "answer_context_overlap",
        "generation",
        True,
        "proportion",
        "share of the answer's content tokens (stopwords and citation markers removed) found in the "
        "context given to the model; a lexical grounding proxy (paraphrases score low, copied "
        "context scores 1, negation is invisible); declines: NaN",
        _A + "answer_context_overlap",
        headline=21,
        columns=("answer", "context"),
    ),
    MetricSpec(
        "answer_cited_overlap",
        "generation",
        True,
        "proportion",
        "answer_context_overlap against the cited passages only; nothing cited or a decline: NaN; " + _CITE,
        _A + "answer_cited_overlap",
        columns=("answer", "cited_chunk_ids"),
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
        columns=("gold_claims", "context"), breaks=_JUDGE,
    ),
    MetricSpec(
        "context_utilization",
        "diagnostic",
        True,
        "proportion",
        "of the gold claims the retrieved context entails, the share the answer entails (a declining "
        "answer: 0); NaN when the context entails no gold claim",
        _D + "context_utilization",
        columns=("gold_claims", "context", "answer"), breaks=_JUDGE,
    ),
    MetricSpec(
        "noise_sensitivity_relevant",
        "diagnostic",
        False,
        "proportion",
        "share of the answer claims that are incorrect (not entailed by the gold answer) yet entailed "
        "by a relevant retrieved chunk (one relevant to a gold span)",
        _D + "noise_sensitivity_relevant",
        columns=("answer_claim_classes",), breaks=_JUDGE,
    ),
    MetricSpec(
        "noise_sensitivity_irrelevant",
        "diagnostic",
        False,
        "proportion",
        "share of the answer claims that are incorrect and entailed only by irrelevant retrieved chunks",
        _D + "noise_sensitivity_irrelevant",
        columns=("answer_claim_classes",), breaks=_JUDGE,
    ),
    MetricSpec(
        "hallucination",
        "diagnostic",
        False,
        "proportion",
        "share of the answer claims that no retrieved chunk entails and that are incorrect",
        _D + "hallucination",
        columns=("answer_claim_classes",), breaks=_JUDGE,
    ),
    MetricSpec(
        "self_knowledge",
        "diagnostic",
        False,  # as in RAGChecker: a RAG answer should rest on the context, not on the model
        "proportion",
        "share of the answer claims that no retrieved chunk entails but that are correct (entailed by "
        "the gold answer)",
        _D + "self_knowledge",
        columns=("answer_claim_classes",), breaks=_JUDGE,
    ),
    # -- failure labels: one indicator column per label, its mean the rate
    MetricSpec(
        "rate_{label}",
        "label",
        None,  # per label: see _LABEL_DIRECTION
        "binary",
        "share of queries with that failure label (decision table in evaluation.labels.failure_label)",
        None,
        headline=30, breaks=_JUDGE,
    ),
    *BOOKKEEPING,
)
