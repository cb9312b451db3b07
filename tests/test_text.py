"""The one sentence splitter (stages/text.py), as the chunker and the judges use it."""

from __future__ import annotations

import pytest

from rag_experiments.core.types import Document
from rag_experiments.judge import HeuristicJudge, split_claims
from rag_experiments.stages.chunking import SentenceWindowChunker
from rag_experiments.stages.text import ABBREVIATIONS, sentence_texts, split_sentences, token_ends


def test_abbreviations_are_the_union_of_both_former_lists() -> None:
    chunker_list = "e.g. i.e. etc. vs. cf. mr. mrs. ms. dr. prof. st. no. fig. approx. al. inc. ltd. jr. sr."
    judge_list = "e.g. i.e. al. etc. vs. approx. fig. no. dr. mr. mrs. ms. inc. ltd. st. cf. ca."
    assert set(chunker_list.split()) | set(judge_list.split()) <= ABBREVIATIONS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Built ca. 1990 by Prof. Lee. Then sold.", ["Built ca. 1990 by Prof. Lee.", "Then sold."]),
        ("Shown by Smith et al. In 2020 it grew.", ["Shown by Smith et al. In 2020 it grew."]),
        ("It costs 2.5 dollars. Cheap!", ["It costs 2.5 dollars.", "Cheap!"]),
        ("Items:\n• one\n• two", ["Items:", "• one", "• two"]),
        ("", []),
        ("   \n\n  ", []),
    ],
)
def test_split_sentences_offsets_are_exact(text: str, expected: list[str]) -> None:
    spans = split_sentences(text)
    assert [text[s:e] for s, e in spans] == expected
    assert all(0 <= s < e <= len(text) for s, e in spans)
    assert [s for s, _ in spans] == sorted(s for s, _ in spans)


def test_chunker_use_windows_follow_the_spans() -> None:
    text = "Intro, e.g. Dr. Who said so. Second one!\n\n# Head\nThird? Fourth."
    doc = Document("d", "t", text)
    spans = split_sentences(text)
    assert [text[s:e] for s, e in spans] == [
        "Intro, e.g. Dr. Who said so.",
        "Second one!",
        "# Head",
        "Third?",
        "Fourth.",
    ]
    chunks = SentenceWindowChunker(window=2, stride=2).split(doc)
    assert [(c.start, c.end) for c in chunks] == [
        (spans[0][0], spans[1][1]),
        (spans[2][0], spans[3][1]),
        (spans[4][0], spans[4][1]),
    ]


def test_judge_use_collapses_whitespace_and_splits_structure() -> None:
    context = "| Plan | Keys |\n|---|---|\n| Free | 1 |\n\nSteps:\n1. Open the  dashboard.\n2. Click it."
    assert sentence_texts(context) == [
        "| Plan | Keys |",
        "|---|---|",
        "| Free | 1 |",
        "Steps:",
        "1. Open the dashboard.",
        "2. Click it.",
    ]
    # candidates = sentences + adjacent pairs, built from the same splitter
    cands = HeuristicJudge.candidates("A first one. A second one.")
    assert cands == ["A first one.", "A second one.", "A first one. A second one."]
    # claims: an ordered-list marker stays with its item (it is no longer a "sentence" of its own)
    assert split_claims("1. Webhooks retry for 24 hours.\n2. Keys rotate every 90 days.") == [
        "Webhooks retry for 24 hours.",
        "Keys rotate every 90 days.",
    ]


def test_token_ends_give_prefixes() -> None:
    texts = ["Webhooks retry for 24 hours.", "", "naïve café"]
    ends, ptr = token_ends(texts)
    assert ptr[0] == 0 and len(ptr) == 4 and ptr[2] == ptr[1]  # the empty text has no token
    first = ends[ptr[0] : ptr[1]]
    assert first[-1] == len(texts[0]) and list(first) == sorted(first)
    assert texts[0][: first[0]] == "Webhooks"[: first[0]]
    assert ends[ptr[3] - 1] == len(texts[2])
