"""Weak key facts: facts an answer can contain without answering (docs/metrics.md, "Key-fact
correctness"). A weak fact is left out of ``correctness``; ``evalset validate`` lists each with its
item id and reason, and a run logs how many the generated items had (``n_weak_key_facts``).

A fact (after ``stages.text.normalise_text``) is weak when it is

- **short**: 3 characters or fewer ("GET", "one", "2xx"), unless it is a number ("15", "429"):
  a number matches only as that number, and the corpus-share rule catches the common ones;
- **a stop word**: every token is one (``stages.text.STOPWORDS``: "not", "can", "do not");
- **in the question**: an answer that repeats the question contains it;
- **common in the corpus**: found in more than :data:`WEAK_SHARE` of the corpus's chunks (and in
  at least :data:`WEAK_MIN_CHUNKS` of them; only in a corpus of at least :data:`WEAK_MIN_CORPUS`
  chunks, since in a few topical pages the share cannot tell a generic fact from the topic), cut by
  :data:`WEAK_CHUNKING` (800-character windows, no overlap, whatever the run's chunker is, so
  every config of a sweep leaves out the same facts). With the default k = 3 chunks of context, a
  fact in 10 % of the chunks is in the context of about 27 % (1 − 0.9³) of unrelated questions;
- **common across the corpus's documents**: found in more than :data:`WEAK_DOC_SHARE` of its
  documents (and in at least :data:`WEAK_MIN_DOCS`; only in a corpus of at least
  :data:`WEAK_MIN_DOC_CORPUS` documents), a phrase of several words as much as one word. A phrase
  mentioned once on many long pages ("environment variable" across a framework's docs) is in few
  of the chunks yet part of the corpus's vocabulary: a wrong answer about the framework holds it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rag_experiments.core.types import Document, EvalItem
from rag_experiments.stages.chunking import FixedSizeChunker, chunk_corpus
from rag_experiments.stages.text import STOPWORDS, normalise_text

__all__ = [
    "WEAK_CHUNKING",
    "WEAK_MIN_CHUNKS",
    "WEAK_DOC_SHARE",
    "WEAK_MIN_DOCS",
    "WEAK_MIN_DOC_CORPUS",
    "WEAK_SHARE",
    "WeakFact",
    "chunk_counts",
    "doc_counts",
    "chunk_shares",
    "mark_weak",
    "weak_key_facts",
    "weak_reason",
]

#: A fact found in more than this share of the corpus's chunks is weak.
WEAK_SHARE = 0.10
#: ... and in at least this many chunks.
WEAK_MIN_CHUNKS = 3
#: The corpus rule needs at least this many chunks: in a few topical documents every fact of the
#: topic is "common" ("24 hours" is in 5 of the 27 chunks of four webhook and billing pages).
WEAK_MIN_CORPUS = 100
#: A fact found in more than this share of the corpus's documents is weak ...
WEAK_DOC_SHARE = 0.25
#: ... and in at least this many documents ...
WEAK_MIN_DOCS = 5
#: ... in a corpus of at least this many documents (the sample's 26 topical pages are below it:
#: "24 hours" is on 7 of them, and it is the answer).
WEAK_MIN_DOC_CORPUS = 40
#: The fixed chunking the share is counted on (independent of the run's chunker).
WEAK_CHUNKING = FixedSizeChunker(size=800, overlap=0, unit="chars")

_NUMBER = re.compile(r"^(?:\d+(?:[.,]\d+)*|%)$")


@dataclass(frozen=True)
class WeakFact:
    """One weak key fact of one eval item, with why (``reason``)."""

    item_id: str
    line: int
    fact: str
    reason: str

    def __str__(self) -> str:
        return f"{self.item_id}: key fact {self.fact!r}: {self.reason}"


def is_number(fact: str) -> bool:
    """True when every token of the fact's matching form is a number or "%" ("15", "$1,791", "25%")."""
    toks = normalise_text(fact).split()
    return bool(toks) and all(_NUMBER.match(t) for t in toks)


def _phrase_counts(facts: Sequence[str], texts: Sequence[str]) -> dict[str, int]:
    """How many of ``texts`` contain each fact as whole tokens of the matching form,
    ``|{t : " fact " ⊂ " t "}|``. An inverted index over the texts' tokens narrows each fact to the
    texts holding all of its tokens before the substring test, so a large corpus costs one pass."""
    norm = [f" {normalise_text(t)} " for t in texts]
    postings: dict[str, set[int]] = defaultdict(set)
    for i, c in enumerate(norm):
        for tok in set(c.split()):
            postings[tok].add(i)
    out = {}
    for fact in facts:
        toks = normalise_text(fact).split()
        if not toks:
            out[fact] = 0
            continue
        cand = set.intersection(*(postings.get(t, set()) for t in toks))
        needle = f" {' '.join(toks)} "
        out[fact] = sum(needle in norm[i] for i in cand)
    return out


def chunk_counts(facts: Sequence[str], docs: Sequence[Document]) -> tuple[dict[str, int], int]:
    """How many of the corpus's :data:`WEAK_CHUNKING` chunks contain each fact as whole tokens of
    the matching form, ``|{c : " fact " ⊂ " c "}|``, and the number of chunks."""
    chunks = [c.text for c in chunk_corpus(WEAK_CHUNKING, docs)]
    return _phrase_counts(facts, chunks), len(chunks)


def doc_counts(facts: Sequence[str], docs: Sequence[Document]) -> tuple[dict[str, int], int]:
    """How many of the corpus's documents contain each fact (whole tokens of the matching form,
    a phrase of several words as one), and the number of documents."""
    return _phrase_counts(facts, [d.text for d in docs]), len(docs)


def chunk_shares(facts: Sequence[str], docs: Sequence[Document]) -> dict[str, float]:
    """:func:`chunk_counts` as shares of the chunks (0 for an empty corpus)."""
    counts, n = chunk_counts(facts, docs)
    return {f: c / n if n else 0.0 for f, c in counts.items()}


def weak_reason(
    fact: str,
    question: str,
    n_in: int,
    n_chunks: int,
    max_share: float = WEAK_SHARE,
    n_docs_in: int = 0,
    n_docs: int = 0,
) -> str | None:
    """Why ``fact`` is weak for an item asking ``question`` (in ``n_in`` of ``n_chunks`` chunks:
    :func:`chunk_counts`; in ``n_docs_in`` of ``n_docs`` documents: :func:`doc_counts`), the first
    rule that applies in the module's order; None when not weak."""
    norm = normalise_text(fact)
    if len(fact.strip()) <= 3 and not is_number(fact):
        return "3 characters or fewer"
    if norm and all(t in STOPWORDS for t in norm.split()):
        return "a stop word"
    if norm and f" {norm} " in f" {normalise_text(question)} ":
        return "found in the question"
    if n_chunks >= WEAK_MIN_CORPUS and n_in >= WEAK_MIN_CHUNKS and n_in > max_share * n_chunks:
        return f"in {n_in / n_chunks:.0%} of the corpus's chunks ({n_in} of {n_chunks}; more than {max_share:.0%})"
    if n_docs >= WEAK_MIN_DOC_CORPUS and n_docs_in >= WEAK_MIN_DOCS and n_docs_in > WEAK_DOC_SHARE * n_docs:
        return (
            f"in {n_docs_in / n_docs:.0%} of the corpus's documents ({n_docs_in} of {n_docs}; "
            f"more than {WEAK_DOC_SHARE:.0%})"
        )
    return None


def weak_key_facts(
    items: Sequence[EvalItem], docs: Sequence[Document], max_share: float = WEAK_SHARE
) -> list[WeakFact]:
    """Every weak key fact of ``items`` against the corpus ``docs``, in file order."""
    facts = sorted({f for it in items for f in it.key_facts if f and f.strip()})
    counts, n_chunks = chunk_counts(facts, docs)
    in_docs, n_docs = doc_counts(facts, docs)
    out = []
    for it in items:
        for f in it.key_facts:
            if (
                f
                and f.strip()
                and (why := weak_reason(f, it.query, counts[f], n_chunks, max_share, in_docs[f], n_docs))
            ):
                out.append(WeakFact(it.id, it.line, f, why))
    return out


def mark_weak(items: Sequence[EvalItem], docs: Sequence[Document]) -> tuple[list[EvalItem], list[WeakFact]]:
    """``items`` with ``weak_key_facts`` set (what correctness leaves out), and the weak facts."""
    weak = weak_key_facts(items, docs)
    by_item: dict[str, list[str]] = defaultdict(list)
    for w in weak:
        by_item[w.item_id].append(w.fact)
    return [replace(it, weak_key_facts=by_item.get(it.id, [])) for it in items], weak
