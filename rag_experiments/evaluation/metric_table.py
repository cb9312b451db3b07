"""Every metric the pipeline logs, declared once as a :class:`MetricSpec` (docs/metrics.md).

One declaration per metric (pattern, side, direction, value type, definition text, the dotted path
of the pure function that computes it); :mod:`rag_experiments.evaluation.registry` reads this table
to parse, render, order and judge the direction of logged keys.

Why this module is long: it is one table, a declaration per metric with its definition text
(docs/metrics.md repeats those verbatim); split across files, the registry order and the one place
to look for a metric would be lost.
"""

from __future__ import annotations

from rag_experiments.evaluation.metric_spec import MetricSpec

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

#: The judge card's figures (judge.card): name, higher is better, definition.
_CARD = (
    ("kappa", True, "Cohen's kappa of the judge's label vs the gold label, unparseable a third class"),
    ("balanced_accuracy", True, "mean over the two gold labels of the share the judge got right"),
    ("accuracy", True, "share of pairs where the judge's label equals the gold label"),
    ("precision_supported", True, "share of the pairs judged supported whose gold label is supported"),
    ("recall_supported", True, "share of the gold-supported pairs the judge judged supported"),
    ("unparseable_rate", False, "share of pairs whose verdict could not be parsed"),
    ("seconds_per_verdict", False, "mean wall seconds per verdict"),
    ("flip_rate", False, "with judge.repeats > 1, share of pairs whose repeated verdicts differ"),
    ("accept/{ptype}", None, "share of the pairs of type ptype judged supported"),
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
        "correctness",
        "generation",
        True,
        "proportion",
        "share of the item's strong key_facts (weak ones left out: n_weak_key_facts) present in the answer as "
        "whole tokens (normalised match, numbers as numbers); unanswerable: 1 if the answer declines",
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
        "latency_rerank_s",
        "cost",
        False,
        "continuous",
        "the reranker's wall time for the query (its batch's time divided by the batch's queries), "
        "seconds, as measured when its scores were computed (kept with them in the cache); NaN when the "
        "reranker failed on the query",
        per_query=False,
    ),
    MetricSpec(
        "latency_query_s",
        "cost",
        False,
        "continuous",
        "the query transform's model call for the query (query=rewrite, hyde or multi_query), seconds, as "
        "measured when it was made (kept with its reply in the cache); a failed call counts its time too",
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
        "sum over query transform, generation and judge of tokens_in/1000 x pricing.price_per_1k_in + tokens_out/1000 x "
        "pricing.price_per_1k_out (the stage's generator/judge config, the query transform's model's; absent: 0 USD); NaN when a priced "
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
    # -- noise (replicates: R > 1; docs/metrics.md, "Replicates")
    MetricSpec(
        "replicate_flip/failure_label",
        "noise",
        False,
        "proportion",
        "share of the generated queries (with >= 2 successful replicates) whose failure label is not "
        "the same in every replicate",
        "rag_experiments.evaluation.replicates.flip_rates",
        per_query=False,
        columns=("replicate", "failure_label"),
    ),
    MetricSpec(
        "replicate_flip/correctness",
        "noise",
        False,
        "proportion",
        "share of the generated queries (with >= 2 successful replicates) that are correct (correctness "
        ">= attribution.correct) in some replicates and not in others",
        "rag_experiments.evaluation.replicates.flip_rates",
        per_query=False,
        columns=("replicate", "correctness"),
    ),
    MetricSpec(
        "var_share/{metric}/{component}",
        "noise",
        None,
        "proportion",
        "share of the metric's variance due to queries, generation samples (replicates) or judge "
        "repeats: nested random-effects method-of-moments components over their sum (judge only with "
        "judge repeats)",
        "rag_experiments.analysis.variance.variance_metrics",
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
        "n_context_truncated",
        "count",
        False,
        "count",
        "number of generated queries whose top-k context was cut to fit the generator's window "
        "(generator.ctx_size - max_tokens; per-query column context_truncated)",
        per_query=False,
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
        "n_answer_truncated",
        "count",
        False,
        "count",
        "number of generated answers cut at generator.max_answer_chars (default max_tokens * 16 characters: "
        "an endpoint that ignores max_tokens; per-query column answer_truncated)",
        per_query=False,
    ),
    MetricSpec(
        "n_app_errors",
        "count",
        False,
        "count",
        "number of questions the application (app=python or app=http) failed on: no answer and no contexts "
        "(per-query column app_error); a re-run asks only those",
        per_query=False,
    ),
    MetricSpec(
        "n_unmapped_contexts",
        "count",
        False,
        "count",
        "number of the application's contexts (app=python or app=http) that could not be mapped onto a corpus "
        "span (neither at the given offsets nor as text in the named document or the corpus); they are "
        "shown, not scored",
        per_query=False,
    ),
    MetricSpec(
        "n_contexts",
        "count",
        None,
        "count",
        "number of contexts the application (app=python or app=http) returned for the query",
        per_query=False,
    ),
    MetricSpec(
        "latency_app_s",
        "cost",
        False,
        "continuous",
        "the application's wall time for the query (app=python or app=http), seconds, as measured when it "
        "answered (kept with its reply in the cache)",
        per_query=False,
    ),
    MetricSpec(
        "n_query_errors",
        "count",
        False,
        "count",
        "number of queries whose query transform failed (a failed call, an empty or unparseable reply): "
        "they searched the question as it is (per-query column query_error)",
        per_query=False,
    ),
    MetricSpec(
        "n_judge_errors",
        "count",
        False,
        "count",
        "number of judge calls (claims, verdicts, answer relevance) that failed on transport (connection, "
        "timeout, HTTP error, a body that is not JSON) after retries, per query and summed over queries; "
        "apart from n_unparseable_verdicts (replies that were read but not understood)",
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
        "abstention/{cell}",
        "count",
        None,
        "count",
        "the abstention table over the generated answers (every replicate): answerable or "
        "unanswerable item × answer answered or declined (judge.claims.is_decline)",
        _A + "abstention_table",
        per_query=False,
        columns=("declined", "gold_spans"),
    ),
    MetricSpec(
        "n_citations_out_of_range",
        "count",
        False,
        "count",
        "number of distinct passage numbers the query's answer cites that name no passage given",
        _A + "parse_citations",
        per_query=False,
        columns=("answer",),
    ),
    MetricSpec(
        "n_citations_unparseable",
        "count",
        False,
        "count",
        'number of bracket groups in the query\'s answer that look like citations but give no number ("[Doc A]")',
        _A + "parse_citations",
        per_query=False,
        columns=("answer",),
    ),
    MetricSpec(
        "n_out_of_range_citations",
        "count",
        False,
        "count",
        "n_citations_out_of_range summed over the generated queries",
        per_query=False,
    ),
    MetricSpec(
        "n_unparseable_citations",
        "count",
        False,
        "count",
        "n_citations_unparseable summed over the generated queries",
        per_query=False,
    ),
    MetricSpec(
        "n_weak_key_facts",
        "count",
        None,
        "count",
        "number of the item's key facts that are weak (3 characters or fewer and not a number, a stop word, "
        "in the question, or in more than 10 % of the corpus's 800-character chunks, in a corpus of 100 chunks or "
        "more; evalset.weak_facts) "
        "and left out of correctness, per query and summed over the generated items",
        None,  # a bookkeeping column of evaluation.answer_metrics.answer_inputs, summed by run_aggregates
        per_query=False,
    ),
    MetricSpec(
        "n_claims", "count", None, "count", "number of claims the answer was split into", per_query=False
    ),
    MetricSpec(
        "n_nonclaims",
        "count",
        None,
        "count",
        "number of the answer's sentences the claim splitter drops as not factual claims (code blocks and "
        "fragments, filler and meta sentences, questions, bare headings; evaluation.declines), per query and "
        "summed over the generated answers",
        "rag_experiments.evaluation.declines.n_nonclaims",
        per_query=False,
        columns=("answer",),
    ),
    MetricSpec(
        "n_unparseable",
        "count",
        False,
        "count",
        "number of the query's claim verdicts that could not be parsed",
        per_query=False,
    ),
    # -- the judge (docs/judges.md)
    MetricSpec(
        "judge_flip_rate",
        "judge",
        False,
        "proportion",
        "with judge.repeats = N > 1 on a stochastic judge: share of the query's claims whose N verdicts "
        "are not all equal (repeat r asks with seed + r); the run's value is the mean over queries",
        "rag_experiments.judge.repeats.query_flip_rate",
        columns=("judge_repeat_labels",), breaks=_JUDGE,
    ),
    *(
        MetricSpec(
            f"judge_card/{name}{{ci}}",
            "judge",
            better,
            "proportion" if name != "seconds_per_verdict" else "continuous",
            f"the judge's validity card on labelled pairs: {what}; /ci_low, /ci_high: 95 % cluster "
            "bootstrap CI (claim groups resampled)",
            "rag_experiments.judge.card.judge_card",
            per_query=False,
        )
        for name, better, what in _CARD
    ),
    MetricSpec(
        "judge_card/n_pairs",
        "judge",
        None,
        "count",
        "number of labelled pairs the judge card was measured on (judge_card.max_pairs of them at most)",
        "rag_experiments.judge.card.card_metrics",
        per_query=False,
    ),
    MetricSpec(
        "n_escalated",
        "count",
        None,
        "count",
        "judge=cascade: number of the query's claim verdicts decided by the LLM stage (verifier unsure)",
        per_query=False,
    ),
    MetricSpec(
        "n_escalated_verdicts",
        "count",
        None,
        "count",
        "judge=cascade: claim verdicts decided by the LLM stage, summed over queries (0 for other judges)",
        per_query=False,
    ),
)
