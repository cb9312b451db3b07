"""Judge-free generation metrics (docs/metrics.md, "Judge-free generation metrics").

What the eval set's gold data lets us check without a judge:

- **answer overlap** with the gold answer(s): :func:`answer_token_f1`, :func:`answer_exact_match`
  (SQuAD v1.1 normalisation, the maximum over the gold answers);
- **citations** of prompts that ask for them (:func:`asks_for_citations`): :func:`parse_citations`
  reads the ``[n]`` markers, :func:`citation_precision` / :func:`citation_recall` check the cited
  chunks against the gold spans with the retrieval metrics' own relevance and coverage rules,
  :func:`rate_uncited_answer`;
- **abstention**: :func:`rate_over_refusal`, :func:`rate_false_answer` and the run-level
  :func:`abstention_f1`, with the judges' decline detector (``evaluation.declines.is_decline``);
- a lexical grounding proxy, :func:`answer_context_overlap` (:func:`answer_cited_overlap`).

Every metric function is pure and scores one answer (NaN where the metric is undefined for it);
the registry names them and :func:`judge_free_columns` computes them for the pipeline by walking it
over each answer's :func:`answer_inputs`. Nothing here calls a model.

Why this module is long: it is one family, the judge-free answer metrics, with the citation reader
its citation metrics share; split, the reader would sit apart from the only functions that use it.
"""

from __future__ import annotations

import bisect
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from rag_experiments.core.query_table import cell
from rag_experiments.core.types import Chunk, EvalItem, Span
from rag_experiments.evaluation import metrics as M
from rag_experiments.evaluation.answer_scores import key_fact_counts
from rag_experiments.evaluation.assertions import assertion_aggregates
from rag_experiments.evaluation.declines import is_decline, n_nonclaims
from rag_experiments.evaluation.defaults import MIN_COVERAGE
from rag_experiments.evaluation.walk import walk
from rag_experiments.stages.text import STOPWORDS

__all__ = [
    "Citations",
    "abstention_f1",
    "abstention_table",
    "answer_cited_overlap",
    "answer_context_overlap",
    "answer_inputs",
    "answer_exact_match",
    "answer_token_f1",
    "asks_for_citations",
    "citation_precision",
    "citation_recall",
    "content_tokens",
    "final_answer",
    "gold_answers",
    "is_decline",
    "judge_free_columns",
    "normalize_answer",
    "parse_citations",
    "rate_false_answer",
    "rate_over_refusal",
    "rate_uncited_answer",
    "run_aggregates",
    "strip_citations",
]

_NAN = float("nan")

# --------------------------------------------------------------------------- answer overlap

_PUNCT = str.maketrans("", "", string.punctuation)  # ASCII punctuation only, as SQuAD v1.1
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 normalisation: lower case, remove ASCII punctuation (``string.punctuation``),
    remove the articles a/an/the as whole words, collapse whitespace (in that order, so "the-end"
    → "theend" and "a.b" → "ab" exactly as the official ``evaluate-v1.1.py``). Non-ASCII
    punctuation ("–", "’") is kept, as there."""
    s = (s or "").lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def gold_answers(item: EvalItem) -> list[str]:
    """The item's reference answers: ``gold_answers`` (every distinct SQuAD answer) when it has
    them, else ``[gold_answer]``; empty for an item without a gold answer."""
    many = [a for a in getattr(item, "gold_answers", None) or [] if a and a.strip()]
    if many:
        return many
    return [item.gold_answer] if item.gold_answer and item.gold_answer.strip() else []


_FINAL = re.compile(r"^\s*(?:\*\*)?(?:final answer|answer)\s*:(?:\*\*)?", re.I | re.M)


def final_answer(answer: str) -> str:
    """The part of the answer that answers: the text after the last line-initial "Answer:" (or
    "Final answer:") when there is one — ``prompt=quote_then_answer`` writes "Quote: ... Answer: ..."
    and the quote is not the answer — else the whole text; citation markers removed
    (:func:`strip_citations`) so a citing prompt is not charged for its ``[1]``."""
    text = strip_citations(answer)
    labels = list(_FINAL.finditer(text))
    return text[labels[-1].end() :] if labels else text


def _f1(pred: list[str], gold: list[str]) -> float:
    same = sum((Counter(pred) & Counter(gold)).values())
    if same == 0:
        return 0.0
    p, r = same / len(pred), same / len(gold)
    return 2 * p * r / (p + r)


def answer_token_f1(answer: str | None, golds: Sequence[str]) -> float:
    """SQuAD v1.1 token F1: ``max_g 2PR / (P + R)`` over the gold answers g, with P (R) the share of
    the answer's (g's) tokens in the bag intersection (multiset: a token counts as often as it
    occurs in both). Tokens: whitespace split after :func:`normalize_answer` of
    :func:`final_answer` (no citation markers, no "Quote: ..." before "Answer:").

    No common token (incl. either side empty after normalisation): 0, as v1.1 (v2.0 gives 1 when
    both are empty). No gold answer, or no answer (a failed generation, ``None``): NaN.
    """
    golds = [g for g in golds if g is not None]
    if answer is None or not golds:
        return _NAN
    pred = normalize_answer(final_answer(answer)).split()
    return max(_f1(pred, normalize_answer(g).split()) for g in golds)


def answer_exact_match(answer: str | None, golds: Sequence[str]) -> float:
    """SQuAD v1.1 exact match: 1.0 if the answer equals some gold answer after
    :func:`normalize_answer` of :func:`final_answer`, else 0.0. No gold answer, or no
    answer (``None``): NaN. A long answer that contains the gold answer scores 0 (that is F1's job)."""
    golds = [g for g in golds if g is not None]
    if answer is None or not golds:
        return _NAN
    pred = normalize_answer(final_answer(answer))
    return float(any(pred == normalize_answer(g) for g in golds))


# --------------------------------------------------------------------------- citations

#: A prompt asks for citations when its wording shows a bracketed number, e.g. "for example [2]"
#: (conf/prompt/cite.yaml; a registry prompt with the same marker rule qualifies the same way).
_ASKS = re.compile(r"\[\d+\]")

_NUM_LIST = r"\d{1,3}(?:\s*(?:[-–,;&]|and)\s*\d{1,3})*"
_WORD = r"(?:doc(?:ument)?|passage|source|context|chunk|ref(?:erence)?)s?\.?\s*#?\s*"
#: Square-bracket markers: [1] [1, 2] [1-3] [1][3] [Doc 2] [Passage 2] [^1] [#2]; full-width 【1】.
_SQUARE = re.compile(rf"[\[【]\s*(?:\^|#)?\s*(?:{_WORD})?(?P<nums>{_NUM_LIST})\s*[\]】]", re.I)
#: Parenthesised markers: (1) (1, 2) (Doc 2) (Passage 3). Bare numbers only up to 2 digits, so a
#: year "(2019)" or a count "(100)" is prose, not a citation.
_PAREN = re.compile(
    rf"\(\s*(?:(?:{_WORD})(?P<wnums>{_NUM_LIST})|(?P<nums>\d{{1,2}}(?:\s*,\s*\d{{1,2}})*))\s*\)", re.I
)
#: Any other short square-bracket group: a citation attempt we cannot read ("[Doc A]", "[source]",
#: "[1.2]"); not a Markdown link "[text](url)". Counted as unparseable.
_OTHER = re.compile(r"\[(?P<body>[^\[\]\n]{1,40})\](?!\()")


#: Code in an answer: fenced blocks (``` or ~~~, to the closing fence or the end) and inline
#: backtick spans. A marker inside code is code ("x = a[1]"), not a citation.
_CODE = re.compile(r"^ {0,3}(`{3,}|~{3,})[^\n]*\n?.*?(?:^ {0,3}\1[^\n]*$|\Z)|`[^`\n]+`", re.M | re.S)


def _mask_code(text: str) -> str:
    """``text`` with every code span (:data:`_CODE`) blanked to spaces of the same length, so
    offsets stay those of the answer."""
    return _CODE.sub(lambda m: " " * len(m.group(0)), text)


def asks_for_citations(prompt_text: str) -> bool:
    """Does the prompt ask for ``[n]`` citations? True when its text (system + template) contains a
    bracketed number such as "[2]" — the marker rule of conf/prompt/cite.yaml."""
    return bool(_ASKS.search(prompt_text or ""))


@dataclass(frozen=True)
class Citations:
    """The citation markers of one answer.

    ``cited``: the distinct in-range passage numbers (1-based, the ``[n]`` of
    ``stages.prompts.format_context``) in order of first mention; ``out_of_range``: distinct numbers
    cited that name no passage (0 or > the passages given); ``unparseable``: bracket groups that look
    like a citation but give no number, e.g. "[Doc A]"; ``n_markers``: marker occurrences read.
    """

    cited: tuple[int, ...] = ()
    out_of_range: tuple[int, ...] = ()
    unparseable: tuple[str, ...] = ()
    n_markers: int = 0

    @property
    def any_marker(self) -> bool:
        return bool(self.cited or self.out_of_range or self.unparseable)


def _numbers(group: str) -> list[int]:
    """ "1-3" → 1, 2, 3; "1, 2 and 4" → 1, 2, 4 (a range longer than 20 is read as its two ends)."""
    out: list[int] = []
    for part in re.split(r"\s*(?:[,;&]|and)\s*", group):
        ends = [int(x) for x in re.split(r"\s*[-–]\s*", part) if x.strip().isdigit()]
        if len(ends) == 2 and 0 <= ends[1] - ends[0] <= 20:
            out += range(ends[0], ends[1] + 1)
        else:
            out += ends
    return out


def parse_citations(answer: str | None, n_passages: int) -> Citations:
    """Read the citation markers of ``answer`` given ``n_passages`` numbered passages.

    Recognised: ``[1]``, ``[1, 2]``, ``[1,2]``, ``[1-3]``, ``[1][3]``, ``[Doc 2]``, ``[Passage 2]``,
    ``[^1]``, ``【1】`` and, in parentheses, ``(1)``, ``(1, 2)``, ``(Doc 2)`` (bare parenthesised
    numbers only up to two digits: "(2019)" is prose). A number outside 1..n_passages is kept in
    ``out_of_range``; any other short ``[...]`` group (not a Markdown link) in ``unparseable`` —
    nothing is dropped silently. Brackets inside code (a fenced block or an inline backtick span:
    ``x = a[1]``) are code, not citations.
    """
    text = _mask_code(unicodedata.normalize("NFKC", answer or ""))
    cited: list[int] = []
    oor: list[int] = []
    n_markers = 0
    starts: list[int] = []  # the markers read: sorted, non-overlapping spans (linear, not quadratic)
    ends: list[int] = []
    found = sorted((m for rx in (_SQUARE, _PAREN) for m in rx.finditer(text)), key=lambda m: m.start())
    for m in found:  # in reading order: "cited" lists passages in order of first mention
        if ends and m.start() < ends[-1]:  # inside the last marker read (they start in order)
            continue
        starts.append(m.start())
        ends.append(m.end())
        n_markers += 1
        for n in _numbers(m.group("nums") or m.groupdict().get("wnums") or ""):
            (cited if 1 <= n <= n_passages else oor).append(n)

    def inside(pos: int) -> bool:
        i = bisect.bisect_right(starts, pos) - 1
        return i >= 0 and pos < ends[i]

    bad = [m.group("body").strip() for m in _OTHER.finditer(text) if not inside(m.start())]
    return Citations(tuple(dict.fromkeys(cited)), tuple(dict.fromkeys(oor)), tuple(bad), n_markers + len(bad))


def strip_citations(answer: str) -> str:
    """The answer without its citation markers (those :func:`parse_citations` reads; code keeps
    its brackets)."""
    text = unicodedata.normalize("NFKC", answer or "")
    out, pos = [], 0
    for m in [*_CODE.finditer(text), None]:  # code kept as it is
        out.append(_PAREN.sub("", _SQUARE.sub("", text[pos : m.start() if m else len(text)])))
        if m:
            out.append(m.group(0))
            pos = m.end()
    return "".join(out)


def citation_precision(
    cited: Sequence[Chunk],
    n_out_of_range: int,
    gold_spans: Sequence[Span],
    answered: bool = True,
    min_coverage: float = MIN_COVERAGE,
) -> float:
    """One answer's cited chunks relevant to a gold span / cited chunks, counting a number that
    names no passage (``n_out_of_range``) as a cited chunk that is not relevant.

    ``precision = |{c ∈ cited : ∃ s ∈ gold, relevance(c, s)}| / (|cited| + oor)`` with
    :func:`~rag_experiments.evaluation.metrics.relevance` — the rule hit@k uses (through
    ``metrics.span_hits``). Nothing cited, a decline or no answer (``answered`` False): NaN
    (``rate_uncited_answer`` counts uncited answers). An unanswerable item (no gold span): 0 when it
    cites anything. Unparseable markers are left out (counted in ``n_citations_unparseable``), as
    unparseable verdicts are left out of faithfulness.
    """
    n = len(cited) + n_out_of_range
    if not answered or n == 0:
        return _NAN
    rel = M.span_hits(M.ranked_arrays([cited], [gold_spans]), min_coverage).any(axis=2).sum()
    return float(rel) / n


def citation_recall(
    cited: Sequence[Chunk], gold_spans: Sequence[Span], answered: bool = True, min_coverage: float = MIN_COVERAGE
) -> float:
    """Share of one item's gold spans covered by the cited chunks together — the rule of
    ``evidence_recall_at_k`` with the cited chunks in place of the top k: span s counts when the
    union of the cited chunks covers at least ``min_coverage`` of its characters (and one).
    Nothing cited: 0. Unanswerable item (no gold span), a decline or no answer: NaN.
    """
    if not answered or not gold_spans:
        return _NAN
    if not cited:
        return 0.0
    a = M.ranked_arrays([cited], [gold_spans])
    cov = M.coverage_arrays(a)
    return float(M.evidence_recall_at_k(cov.span_new, cov.span_len, a.n_spans, len(cited), min_coverage)[0])


def rate_uncited_answer(answered: bool, citations: Citations) -> float:
    """1.0 for an answer that is not a decline yet carries no citation marker at all (not even an
    out-of-range or unparseable one), 0.0 for an answer with one; NaN for a decline or no answer
    (``answered`` False: a decline needs no citation)."""
    return (0.0 if citations.any_marker else 1.0) if answered else _NAN


# --------------------------------------------------------------------------- abstention


def rate_over_refusal(answer: str | None, declined: bool, answerable: bool) -> float:
    """Answerable items: 1.0 if the answer declines (``evaluation.declines.is_decline``), else 0.0 —
    the mean is P(declined | answerable). Unanswerable items and no answer (``None``): NaN."""
    return float(declined) if answer is not None and answerable else _NAN


def rate_false_answer(answer: str | None, declined: bool, answerable: bool) -> float:
    """Unanswerable items: 1.0 if the answer does not decline, else 0.0 — the mean is
    P(answered | unanswerable). Answerable items and no answer (``None``): NaN."""
    return float(not declined) if answer is not None and not answerable else _NAN


def abstention_table(declined: Sequence[bool], answerable: Sequence[bool]) -> dict[str, int]:
    """The answerable/unanswerable × answered/declined counts (keys ``abstention/<row>_<column>``)."""
    d = np.asarray(declined, dtype=bool)
    a = np.asarray(answerable, dtype=bool)
    return {
        "abstention/answerable_answered": int((a & ~d).sum()),
        "abstention/answerable_declined": int((a & d).sum()),
        "abstention/unanswerable_answered": int((~a & ~d).sum()),
        "abstention/unanswerable_declined": int((~a & d).sum()),
    }


def abstention_f1(declined: Sequence[bool], answerable: Sequence[bool]) -> float:
    """F1 of declining as a detector of unanswerable items: ``2 TP / (2 TP + FP + FN)`` with TP =
    unanswerable and declined, FP = answerable and declined (over-refusal), FN = unanswerable and
    answered (false answer). No unanswerable item: NaN (nothing to detect). Unanswerable items but
    no decline at all: 0. A run-level figure (no per-query value, so no CI or paired test); the two
    rates above carry the per-query view."""
    d = np.asarray(declined, dtype=bool)
    a = np.asarray(answerable, dtype=bool)
    if (~a).sum() == 0:
        return _NAN
    tp, fp, fn = int((~a & d).sum()), int((a & d).sum()), int((~a & ~d).sum())
    return 2 * tp / (2 * tp + fp + fn)


# --------------------------------------------------------------------------- grounding proxy

_STOPWORDS = STOPWORDS  # NLTK's English list (stages.text)
_TOKEN = re.compile(r"\w+")


def content_tokens(text: str) -> list[str]:
    """Lower-cased word tokens (NFKC; apostrophes dropped so "don't" → "dont") without stopwords
    and without citation markers."""
    t = unicodedata.normalize("NFKC", strip_citations(text)).lower().replace("'", "").replace("’", "")
    return [w for w in _TOKEN.findall(t) if w not in _STOPWORDS]


def answer_context_overlap(answer: str | None, context: str | None, answered: bool = True) -> float:
    """Share of the answer's content tokens (token occurrences, :func:`content_tokens`) that occur
    anywhere in ``context``: ``|{i : a_i ∈ tokens(context)}| / |a|``.

    NaN: no answer (``None``), a decline (``answered`` False), or no content token (e.g. "I don't
    know" is all stopwords and markers).

    Limits — a *lexical* proxy for grounding, not faithfulness: copying the context scores 1 whether
    or not it answers the question; a correct paraphrase or a synonym scores low; negation and
    numbers' roles are invisible ("not", "no" are stopwords: "retries are not capped" against "retries
    are capped" scores 1); a claim assembled from words scattered over several passages scores 1;
    English stopwords only; no stemming ("retry" ≠ "retries").
    """
    if answer is None or not answered:
        return _NAN
    toks = content_tokens(answer)
    if not toks:
        return _NAN
    have = set(content_tokens(context or ""))
    return sum(t in have for t in toks) / len(toks)


def answer_cited_overlap(answer: str | None, cited: Sequence[Chunk], answered: bool = True) -> float:
    """:func:`answer_context_overlap` against the cited chunks' text only (joined as the context
    is); nothing cited, a decline or no answer: NaN."""
    if not cited:
        return _NAN
    return answer_context_overlap(answer, "\n\n".join(c.text for c in cited), answered)


# --------------------------------------------------------------------------- the pipeline's columns


def answer_inputs(
    item: EvalItem, answer: str | None, context: str, context_chunks: Sequence[Chunk], cites: bool,
    min_coverage: float = MIN_COVERAGE,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One generated answer's inputs to the registry walk, and its bookkeeping columns.

    Inputs (the names the judge-free metric functions' parameters use): ``answer`` (None: the
    generation failed), ``golds`` (:func:`gold_answers` of an answerable item), ``key_facts`` (the
    item's strong ones: weak facts, ``evalset.weak_facts``, are left out of correctness),
    ``answerable``, ``gold_spans``, ``declined``, ``answered`` (an answer that does not decline),
    ``context``, ``min_coverage``; with ``cites`` also ``cited`` (the cited chunks), ``citations``
    (:func:`parse_citations`) and ``n_out_of_range``. Columns: ``declined`` (None without an answer),
    ``n_weak_key_facts`` (the key facts left out), ``n_negated_key_facts`` /
    ``n_contradicted_key_facts`` (strong facts the answer negates / contradicts:
    ``evaluation.answer_scores.key_fact_counts``), ``n_nonclaims`` (the answer's code, filler,
    questions and headings, which the claim splitter drops: ``evaluation.declines.n_nonclaims``),
    with ``cites`` ``cited_chunk_ids``, ``n_citations_out_of_range``, ``n_citations_unparseable``.
    """
    declined = answer is not None and is_decline(answer)
    inputs: dict[str, Any] = dict(
        answer=answer, golds=gold_answers(item) if item.answerable else [], key_facts=item.strong_key_facts,
        answerable=item.answerable, gold_spans=list(item.gold_spans), declined=declined,
        answered=answer is not None and not declined, context=context, min_coverage=min_coverage,
    )  # fmt: skip
    columns: dict[str, Any] = {
        "declined": declined if answer is not None else None,
        "n_weak_key_facts": len(item.weak_key_facts),
        **key_fact_counts(answer, item.strong_key_facts, item.answerable),
        "n_nonclaims": n_nonclaims(answer) if answer is not None else 0,
    }
    if cites:
        parsed = parse_citations(answer, len(context_chunks))
        cited = [context_chunks[j - 1] for j in parsed.cited]
        inputs.update(cited=cited, citations=parsed, n_out_of_range=len(parsed.out_of_range))
        columns.update(
            cited_chunk_ids=[c.chunk_id for c in cited],
            n_citations_out_of_range=len(parsed.out_of_range),
            n_citations_unparseable=len(parsed.unparseable),
        )
    return inputs, columns


def judge_free_columns(
    items: Sequence[EvalItem],
    answers: Sequence[str | None],
    contexts: Sequence[str],
    context_chunks: Sequence[Sequence[Chunk]],
    cites: bool,
    min_coverage: float = MIN_COVERAGE,
) -> list[dict]:
    """Every judge-free per-query column of the generated queries (``answers[i] None``: the
    generation failed, every metric NaN): the generation metrics of the registry that one answer's
    :func:`answer_inputs` can feed, computed by walking it (:mod:`rag_experiments.evaluation.walk`),
    plus the bookkeeping columns.

    Metrics: ``correctness``, ``answer_token_f1``, ``answer_exact_match``, ``rate_over_refusal`` (only
    when some item is answerable), ``rate_false_answer`` (only when some item is unanswerable),
    ``answer_context_overlap``, and with ``cites`` (:func:`asks_for_citations` of the prompt)
    ``citation_precision``, ``citation_recall``, ``rate_uncited_answer``, ``answer_cited_overlap``;
    without ``cites`` there are no citation columns at all (a prompt that asks for none is not scored
    on them, and its trace carries no empty feedback for them).
    """
    rows = []
    for it, a, ctx, cs in zip(items, answers, contexts, context_chunks, strict=True):
        inputs, columns = answer_inputs(it, a, ctx, cs, cites, min_coverage)
        rows.append(walk(inputs, "generation") | columns)
    answerable = {it.answerable for it in items}
    for key, kind in (("rate_over_refusal", True), ("rate_false_answer", False)):
        if kind not in answerable:  # e.g. XQuAD: no unanswerable item, no rate_false_answer column
            for r in rows:
                r.pop(key, None)
    return rows


#: The run tag ``failure_label_evidence`` of a ``judge=none`` run.
JUDGE_FREE_LABEL_EVIDENCE = (
    "judge-free: hit@k and correctness (key facts in the answer; unanswerable: declined); "
    "no judge, so faithfulness does not enter the label"
)


def run_aggregates(per_query: pd.DataFrame) -> dict[str, float]:
    """Run-level judge-free figures over the generated answers (every replicate's row): the
    :func:`abstention_table`, :func:`abstention_f1` (only with unanswerable items),
    ``n_weak_key_facts`` (the generated items' weak key facts, each item once), ``n_nonclaims``,
    ``n_negated_key_facts`` and ``n_contradicted_key_facts`` (summed over the generated answers,
    every replicate), the assertion counts (``evaluation.assertions``) and the citation
    marker counts ``n_out_of_range_citations`` / ``n_unparseable_citations`` (cite prompts)."""
    if "declined" not in per_query:
        return {}
    got = per_query["declined"].notna()
    declined = per_query.loc[got, "declined"].astype(bool).to_numpy()
    answerable = np.array([bool(cell("gold_spans", v)) for v in per_query.loc[got, "gold_spans"]], dtype=bool)
    out: dict[str, float] = dict(abstention_table(declined, answerable))
    run_level = walk({"declined": declined, "answerable": answerable}, "generation", per_query=False)
    out |= {k: v for k, v in run_level.items() if not np.isnan(v)}  # abstention_f1: NaN without unanswerable items
    if "n_weak_key_facts" in per_query:  # once per item, not per replicate
        out["n_weak_key_facts"] = int(per_query.loc[got].drop_duplicates("id")["n_weak_key_facts"].fillna(0).sum())
    for col in ("n_nonclaims", "n_negated_key_facts", "n_contradicted_key_facts"):
        if col in per_query:
            out[col] = int(per_query.loc[got, col].fillna(0).sum())
    out |= assertion_aggregates(per_query)
    for col, key in (
        ("n_citations_out_of_range", "n_out_of_range_citations"),
        ("n_citations_unparseable", "n_unparseable_citations"),
    ):
        if col in per_query:
            out[key] = int(per_query[col].fillna(0).sum())
    return out
