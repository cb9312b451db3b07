"""Chunkers: the offset/coverage contract as properties, plus behaviour of each chunker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from rag_experiments.core.types import Document  # noqa: E402
from rag_experiments.stages.chunking import (  # noqa: E402
    FixedSizeChunker,
    MarkdownChunker,
    RecursiveChunker,
    SentenceWindowChunker,
    WholeDocumentChunker,
    _char_offsets,
    _minilm_tokenizer,
    chunk_corpus,
    split_sentences,
)

CONF = Path(__file__).resolve().parents[1] / "rag_experiments" / "conf" / "chunking"

# Small sizes so generated texts produce many chunks and exercise every boundary case.
CHUNKERS = {
    "fixed": FixedSizeChunker(size=40, overlap=10),
    "fixed_no_overlap": FixedSizeChunker(size=25, overlap=0),
    "fixed_tokens": FixedSizeChunker(size=12, overlap=4, unit="tokens"),
    "sentence": SentenceWindowChunker(window=3, stride=2),
    "sentence_single": SentenceWindowChunker(window=1, stride=1),
    "recursive": RecursiveChunker(size=50),
    "recursive_overlap": RecursiveChunker(size=50, overlap=15),
    "markdown": MarkdownChunker(max_size=80),
    "markdown_overlap": MarkdownChunker(max_size=60, overlap=10),
    "whole": WholeDocumentChunker(),
}

FRAGMENTS = st.sampled_from(
    [
        "word",
        "Sentence",
        "ends here.",
        "Really?",
        "Yes!",
        "e.g.",
        "i.e.",
        "v2.1",
        "https://example.com/a.b?c=1.",
        "café",
        "résumé",
        "—",
        "naïve",
        "Ünïcödé",
        "中文字符",
        "emoji🙂",
        "e\u0301",  # combining accent: the tokenizer drops the mark
        "zero\u200bwidth",
        "\u00a0",
        "\t",
        " ",
        "\n",
        "\n\n",
        "\r\n",
        "\n# Title\n",
        "\n## Section é\n",
        "\n### Sub — section ###\n",
        "\n```\n# not a heading\ncode();\n```\n",
        "\n~~~~\n## also not\n~~~~\n",
        "\n- item one. Item two\n",
        "\n1. First step.\n",
        "| a | b |\n",
        "1.5",
        "x" * 130,  # longer than every chunk size
        "é" * 70,
    ]
)


@st.composite
def texts(draw) -> str:
    if draw(st.integers(0, 9)) == 0:  # sometimes fully random text over a hostile alphabet
        return draw(st.text(alphabet=" \n\t.#`é—ab-A1!?", max_size=300))
    parts = draw(st.lists(FRAGMENTS, max_size=60))
    seps = draw(st.lists(st.sampled_from([" ", "", "\n", "  "]), min_size=len(parts), max_size=len(parts)))
    return "".join(p + s for p, s in zip(parts, seps, strict=True))


def check_contract(doc: Document, chunks) -> None:
    text = doc.text
    covered = bytearray(len(text))
    prev_start = -1
    for c in chunks:
        assert c.doc_id == doc.doc_id
        assert c.chunk_id == f"{doc.doc_id}#{c.start}-{c.end}"
        assert 0 <= c.start < c.end <= len(text)
        assert text[c.start : c.end] == c.text
        assert c.text.strip() == c.text, "chunks are whitespace-trimmed"
        assert c.start >= prev_start, "ordered by start"
        prev_start = c.start
        covered[c.start : c.end] = b"\x01" * (c.end - c.start)
    missing = [i for i, ch in enumerate(text) if not ch.isspace() and not covered[i]]
    assert not missing, f"uncovered non-whitespace characters at {missing[:10]}"
    ids = [c.chunk_id for c in chunks]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name", list(CHUNKERS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts())
def test_chunker_contract(name: str, text: str) -> None:
    chunker = CHUNKERS[name]
    doc = Document(doc_id="dir/doc.md", title="Doc title", text=text)
    chunks = chunker.split(doc)
    check_contract(doc, chunks)
    assert [c.chunk_id for c in chunker.split(doc)] == [c.chunk_id for c in chunks], "deterministic"


@pytest.mark.parametrize("name", list(CHUNKERS))
@pytest.mark.parametrize("text", ["", " ", "\n\n\t \n", "\u00a0\u3000"])
def test_empty_and_whitespace_docs_give_no_chunks(name: str, text: str) -> None:
    assert CHUNKERS[name].split(Document("d", "t", text)) == []


# --------------------------------------------------------------------------- configs


@pytest.mark.parametrize("path", sorted(CONF.glob("*.yaml")), ids=lambda p: p.stem)
def test_configs_instantiate(path: Path) -> None:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(path)
    assert set(cfg) - {"_target_"} <= {"size", "overlap", "unit", "window", "stride", "max_size"}
    chunker = instantiate(cfg)
    for key, value in cfg.items():
        if key != "_target_":
            assert getattr(chunker, key) == value
    if path.stem != "fixed_tokens":  # tokens mode is exercised below; keep this test cheap
        doc = Document("sample.md", "Sample", "# Sample\n\nOne sentence. Two sentences here.\n")
        check_contract(doc, chunker.split(doc))


def test_config_options_present() -> None:
    assert {p.stem for p in CONF.glob("*.yaml")} >= {
        "fixed",
        "fixed_tokens",
        "sentence",
        "recursive",
        "markdown",
        "whole",
    }


def test_invalid_params_raise() -> None:
    with pytest.raises(ValueError, match="overlap"):
        FixedSizeChunker(size=10, overlap=10)
    with pytest.raises(ValueError, match="unit"):
        FixedSizeChunker(unit="words")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stride"):
        SentenceWindowChunker(window=2, stride=3)
    with pytest.raises(ValueError, match="overlap"):
        RecursiveChunker(size=10, overlap=20)


# --------------------------------------------------------------------------- fixed size

PROSE = " ".join(
    f"Sentence number {i} talks about webhooks, retries and exponential backoff for {i} hours."
    for i in range(40)
)


def test_fixed_chars_overlap_really_overlaps_and_keeps_words() -> None:
    doc = Document("p", "P", PROSE)
    chunks = FixedSizeChunker(size=120, overlap=30).split(doc)
    assert len(chunks) > 10
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert b.start < a.end, "consecutive windows share characters"
        assert 0 < a.end - b.start <= 30
        assert len(a.text) <= 120
    for c in chunks:  # never cut inside a word when whitespace is available
        assert c.start == 0 or PROSE[c.start - 1] == " "
        assert c.end == len(PROSE) or PROSE[c.end] == " "


def test_fixed_chars_cuts_overlong_word_hard() -> None:
    text = "a " + "x" * 100 + " b"
    chunks = FixedSizeChunker(size=30, overlap=5).split(Document("d", "t", text))
    assert max(len(c.text) for c in chunks) == 30
    check_contract(Document("d", "t", text), chunks)


def _n_tokens_in(text: str, start: int, end: int) -> int:
    enc = _minilm_tokenizer().encode(text, add_special_tokens=False)
    return sum(1 for s, e in enc.offsets if start <= s and e <= end and e > s)


def test_tokens_mode_windows_at_most_size_tokens() -> None:
    text = PROSE + " Café — résumé naïve e\u0301 zero\u200bwidth " + "supercalifragilistic" * 5
    doc = Document("p", "P", text)
    chunks = FixedSizeChunker(size=32, overlap=8, unit="tokens").split(doc)
    check_contract(doc, chunks)
    tok = _minilm_tokenizer()
    assert len(chunks) > 10
    for c in chunks:
        assert _n_tokens_in(text, c.start, c.end) <= 32
        # Windows start at word starts, so re-tokenising the chunk alone agrees.
        assert len(tok.encode(c.text, add_special_tokens=False).ids) <= 32
    # On prose (no over-long words shrinking a window below the overlap) windows really overlap.
    prose_chunks = FixedSizeChunker(size=32, overlap=8, unit="tokens").split(Document("p", "P", PROSE))
    for a, b in zip(prose_chunks, prose_chunks[1:], strict=False):
        assert b.start < a.end, "token windows overlap"
        assert 1 <= _n_tokens_in(PROSE, b.start, a.end) <= 8


def test_tokens_mode_offsets_are_characters_on_non_ascii() -> None:
    text = "Été — à Paris. " * 30
    doc = Document("p", "P", text)
    full = _minilm_tokenizer().encode(text, add_special_tokens=False)
    chunks = FixedSizeChunker(size=10, overlap=0, unit="tokens").split(doc)
    assert len(chunks) > 5
    for c in chunks:
        # The tokens the window was cut from are exactly the tokens of the chunk's text.
        inside = [
            t for t, (s, e) in zip(full.tokens, full.offsets, strict=True) if c.start <= s and e <= c.end
        ]
        assert inside == _minilm_tokenizer().encode(c.text, add_special_tokens=False).tokens
        assert len(inside) <= 10


# --------------------------------------------------------------------------- sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One here. Two there! Three? 4 is a digit.", ["One here.", "Two there!", "Three?", "4 is a digit."]),
        ("Use a tool, e.g. The CLI. Then stop.", ["Use a tool, e.g. The CLI.", "Then stop."]),
        ("That is, i.e. Ferrymail. Done.", ["That is, i.e. Ferrymail.", "Done."]),
        (
            "Upgrade to v2.1 now. See https://x.io/a.b.c for more.",
            ["Upgrade to v2.1 now.", "See https://x.io/a.b.c for more."],
        ),
        ("Ask Dr. Who and J. Smith. Ok.", ["Ask Dr. Who and J. Smith.", "Ok."]),
        ("lower. case continues", ["lower. case continues"]),
        (
            "# Heading\nBody line one\nstill one.\n\nNew para.",
            ["# Heading", "Body line one\nstill one.", "New para."],
        ),
        (
            "Steps:\n1. Open it.\n2. Close it.\n- bullet",
            ["Steps:", "1. Open it.", "2. Close it.", "- bullet"],
        ),
        ("Café é. École — ok.", ["Café é.", "École — ok."]),
        ('He said "Stop." Then left.', ['He said "Stop."', "Then left."]),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    spans = split_sentences(text)
    assert [text[s:e] for s, e in spans] == expected


def test_sentence_windows_and_stride() -> None:
    text = "S1 a. S2 b. S3 c. S4 d. S5 e. S6 f."
    doc = Document("d", "t", text)
    chunks = SentenceWindowChunker(window=3, stride=2).split(doc)
    assert [c.text for c in chunks] == ["S1 a. S2 b. S3 c.", "S3 c. S4 d. S5 e.", "S5 e. S6 f."]
    assert [c.metadata["sentences"] for c in chunks] == [[0, 2], [2, 4], [4, 5]]


# --------------------------------------------------------------------------- recursive


def test_semantic_text_splitter_offsets_are_characters() -> None:
    """The finding behind RecursiveChunker: ``chunk_indices`` gives *character* offsets in Python.

    On text where bytes and characters differ ("é" is 2 UTF-8 bytes, "—" is 3), the offsets index
    the str, not its UTF-8 encoding.
    """
    from semantic_text_splitter import TextSplitter

    text = "Café — résumé naïve. " * 20 + "\n\nÉté à Paris — très bien. Fin."
    pieces = TextSplitter(40).chunk_indices(text)
    assert len(pieces) > 5
    assert all(text[off : off + len(chunk)] == chunk for off, chunk in pieces)
    raw = text.encode()
    byte_ok = [raw[off : off + len(chunk.encode())] == chunk.encode() for off, chunk in pieces]
    assert not all(byte_ok), "offsets are not byte offsets"


def test_offset_conversion_handles_byte_offsets() -> None:
    # Guard for a future change of unit upstream: byte offsets are mapped back to characters.
    text = "é—x Paris é."
    pieces = [(0, "é—x"), (len("é—x ".encode()), "Paris é.")]
    assert _char_offsets(text, pieces) == [(0, 3), (4, 12)]


def test_recursive_prefers_paragraphs() -> None:
    para = "Alpha beta gamma. Delta epsilon."
    text = f"{para}\n\n{para}\n\n{para}"
    chunks = RecursiveChunker(size=len(para) + 5).split(Document("d", "t", text))
    assert [c.text for c in chunks] == [para, para, para]


# --------------------------------------------------------------------------- markdown

MD = """Intro before any heading.

# Webhooks

Webhooks notify you.

## Retries

Retry for 24 hours.

```python
# this is a comment, not a heading
x = 1
```

### Backoff

Exponential.

## Security ##

Sign payloads.
#nospace is not a heading
"""


def test_markdown_heading_paths() -> None:
    doc = Document("webhooks.md", "Webhooks page", MD)
    chunks = MarkdownChunker(max_size=1200).split(doc)
    check_contract(doc, chunks)
    got = [(c.text.splitlines()[0], c.metadata["heading_path"]) for c in chunks]
    assert got == [
        ("Intro before any heading.", ["Webhooks page"]),
        ("# Webhooks", ["Webhooks"]),
        ("## Retries", ["Webhooks", "Retries"]),
        ("### Backoff", ["Webhooks", "Retries", "Backoff"]),
        ("## Security ##", ["Webhooks", "Security"]),
    ]
    assert "# this is a comment" in chunks[2].text
    assert chunks[-1].text.endswith("#nospace is not a heading")


def test_markdown_without_h1_uses_title() -> None:
    doc = Document("d.md", "Doc title", "## A\n\ntext a\n\n### B\n\ntext b\n\n## C\ntext c")
    paths = [c.metadata["heading_path"] for c in MarkdownChunker().split(doc)]
    assert paths == [["Doc title", "A"], ["Doc title", "A", "B"], ["Doc title", "C"]]


def test_markdown_long_section_is_subsplit_keeping_path() -> None:
    body = "\n\n".join(f"Paragraph {i} says something about retries." for i in range(30))
    doc = Document("d.md", "T", f"# Top\n\n## Long\n\n{body}\n\n## Short\n\nend.")
    chunks = MarkdownChunker(max_size=200).split(doc)
    check_contract(doc, chunks)
    long_chunks = [c for c in chunks if c.metadata["heading_path"] == ["Top", "Long"]]
    assert len(long_chunks) > 3
    assert all(len(c.text) <= 200 for c in chunks)
    assert chunks[-1].metadata["heading_path"] == ["Top", "Short"]


def test_markdown_on_sample_corpus() -> None:
    docs_dir = Path(__file__).resolve().parents[1] / "rag_experiments" / "data" / "sample" / "docs"
    docs = [Document(p.name, p.stem, p.read_text(encoding="utf-8")) for p in sorted(docs_dir.glob("*.md"))]
    assert len(docs) >= 25, f"the bundled sample is package data and must be present in {docs_dir}"
    for chunker in (MarkdownChunker(), RecursiveChunker(), SentenceWindowChunker(), FixedSizeChunker()):
        chunks = chunk_corpus(chunker, docs)
        assert len({c.chunk_id for c in chunks}) == len(chunks)
        for doc in docs:
            check_contract(doc, [c for c in chunks if c.doc_id == doc.doc_id])


# --------------------------------------------------------------------------- whole / corpus


def test_whole_document_and_chunk_corpus() -> None:
    docs = [Document("a", "A", "  alpha beta \n"), Document("b", "B", "gamma"), Document("c", "C", " \n")]
    chunks = chunk_corpus(WholeDocumentChunker(), docs)
    assert [(c.chunk_id, c.text) for c in chunks] == [("a#2-12", "alpha beta"), ("b#0-5", "gamma")]
