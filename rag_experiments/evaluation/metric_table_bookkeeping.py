"""The bookkeeping half of the metric table (``evaluation.metric_table``): cost and latency, noise
(replicates), counts and the judge's card, each declared once as a :class:`MetricSpec`
(docs/metrics.md)."""

from __future__ import annotations

from rag_experiments.evaluation.metric_spec import MetricSpec

_A = "rag_experiments.evaluation.answer_metrics."
_JUDGE = ("judge",)  # what breaks comparability (metric_table: _CHUNKS, _JUDGE, _KEY_FACTS)

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

BOOKKEEPING: tuple[MetricSpec, ...] = (
    # -- cost (per-query columns, not aggregated; compared only when asked for by name)
    MetricSpec(
        "latency_{stage}_s",
        "cost",
        False,
        "continuous",
        "a step's wall time for the query, seconds: generation its call, judge judging its answer (claims, "
        "verdicts, relevance), query the transform's model call, history the rewrite's (0 for window and "
        "oracle), app the application's answer, rerank its "
        "batch's time divided by the batch's queries (NaN where it failed), each as measured when made (kept "
        "with the result in the cache); retrieval and any step that measures none: its batch's time divided "
        "by the batch's queries (the run loop)",
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
        "n_unparseable_fact_verdicts",
        "count",
        False,
        "count",
        "number of the judge's key-fact verdicts (correctness_judged) that could not be parsed: per query, "
        "and summed over queries as a run metric",
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
        "n_query_errors",
        "count",
        False,
        "count",
        "number of queries whose query transform failed (a failed call, an empty or unparseable reply): "
        "they searched the question as it is (per-query column query_error)",
        per_query=False,
    ),
    MetricSpec(
        "history_turns_cut",
        "count",
        False,
        "count",
        "earlier user turns of the conversation (with their replies) left out of the generator's prompt to fit "
        "its window, oldest first (prompt.history_turns > 0 and a generator with a known window)",
        per_query=False,
    ),
    MetricSpec(
        "n_history_errors",
        "count",
        False,
        "count",
        "number of conversation turns whose history rewrite failed (a failed call, an empty or unparseable "
        "reply): they searched the last question as it is (per-query column history_error)",
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
    # every other step's errors metric (after the ones declared above, which match first)
    MetricSpec(
        "n_{stage}_errors",
        "count",
        False,
        "count",
        "number of items the step of that column failed on (its slot's errors metric, core.slots: "
        "n_rerank_errors counts the queries the reranker failed on, which kept their first-stage order); "
        "the same command redoes only those",
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
        "in the question, in more than 10 % of the corpus's 800-character chunks, in a corpus of 100 chunks or "
        "more, or in more than 25 % of its documents, in a corpus of 40 documents or more; evalset.weak_facts) "
        "and left out of correctness, per query and summed over the generated items",
        None,  # a bookkeeping column of evaluation.answer_metrics.answer_inputs, summed by run_aggregates
        per_query=False,
    ),
    MetricSpec(
        "n_negated_key_facts",
        "count",
        None,
        "count",
        "number of the item's strong key facts the answer holds only inside a negation scope (not, never, no, "
        "without, n't, rather than … to the end of the clause) and so does not assert; they count 0 in "
        "correctness (evaluation.answer_scores.fact_status), per query and summed over the generated answers",
        "rag_experiments.evaluation.answer_scores.key_fact_counts",
        per_query=False,
        columns=("answer",),
    ),
    MetricSpec(
        "n_contradicted_key_facts",
        "count",
        False,
        "count",
        "number of the item's strong key facts the answer contradicts: denies them ('never 307') or asserts "
        "another value in their place ('48 hours' for '24 hours'; '1000 …, not 403'); they count 0 in "
        "correctness and the answer's failure label is not ok, per query and summed over the generated answers",
        "rag_experiments.evaluation.answer_scores.key_fact_counts",
        per_query=False,
        columns=("answer",),
    ),
    MetricSpec(
        "n_assertions",
        "count",
        None,
        "count",
        "number of per-item checks (the eval items' assert lists) evaluated on the generated answers, every "
        "replicate",
        "rag_experiments.evaluation.assertions.assertion_aggregates",
        per_query=False,
    ),
    MetricSpec(
        "n_assertions_failed",
        "count",
        False,
        "count",
        "number of the item's checks (its assert list: contains, not_contains, regex, not_regex, declines, answers, "
        "cites, max_latency_s) the answer fails, per query and summed over the generated answers",
        "rag_experiments.evaluation.assertions.assertion_columns",
        per_query=False,
    ),
    MetricSpec(
        "n_critical_failed",
        "count",
        False,
        "count",
        "number of the item's critical checks (critical: true) the answer fails, per query and summed over the "
        "generated answers; gate fails a candidate with any",
        "rag_experiments.evaluation.assertions.assertion_columns",
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
