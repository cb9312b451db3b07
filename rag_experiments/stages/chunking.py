"""Chunkers: split a Document into Chunks with exact character offsets (docs/architecture.md, "Data contracts").

Contract kept by every chunker here (and checked by property tests):

- ``chunk_id == f"{doc_id}#{start}-{end}"`` and ``doc.text[start:end] == chunk.text``;
- chunks are ordered by ``start``, none is empty, none starts or ends with whitespace;
- together they cover every non-whitespace character of the document;
- the output is a pure function of (chunker params, document): ids are deterministic.

Options (``conf/chunking/*.yaml``): ``fixed`` / ``fixed_tokens`` (FixedSizeChunker),
``sentence`` (SentenceWindowChunker), ``recursive`` (RecursiveChunker, backed by the Rust
``semantic-text-splitter``), ``markdown`` (MarkdownChunker), ``whole`` (WholeDocumentChunker).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any, Literal, Protocol

from rag_experiments.core.types import Chunk, Document
from rag_experiments.stages.text import FENCE_RE as _FENCE_RE
from rag_experiments.stages.text import line_spans as _lines
from rag_experiments.stages.text import minilm_tokenizer as _minilm_tokenizer
from rag_experiments.stages.text import split_sentences
from rag_experiments.stages.text import trim as _trim


class Chunker(Protocol):
    def split(self, doc: Document) -> list[Chunk]: ...


def chunk_corpus(chunker: Chunker, docs: Iterable[Document]) -> list[Chunk]:
    """All chunks of all documents, in document order then offset order."""
    out: list[Chunk] = []
    for doc in docs:
        out.extend(chunker.split(doc))
    return out


# --------------------------------------------------------------------------- helpers


def _make_chunk(doc: Document, start: int, end: int, metadata: dict[str, Any] | None = None) -> Chunk:
    return Chunk(
        chunk_id=f"{doc.doc_id}#{start}-{end}",
        doc_id=doc.doc_id,
        start=start,
        end=end,
        text=doc.text[start:end],
        metadata=dict(metadata or {}),
    )


def _chunks_from_spans(
    doc: Document, spans: Iterable[tuple[int, int]], metadata: dict[str, Any] | None = None
) -> list[Chunk]:
    """Trim, drop empties and duplicates, sort by (start, end), build Chunks."""
    seen: set[tuple[int, int]] = set()
    for s, e in spans:
        t = _trim(doc.text, s, e)
        if t is not None:
            seen.add(t)
    return [_make_chunk(doc, s, e, metadata) for s, e in sorted(seen)]


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


# --------------------------------------------------------------------------- fixed size


class FixedSizeChunker:
    """Windows of ``size`` characters or MiniLM tokens, consecutive windows sharing ``overlap``.

    ``unit="chars"``: a window ends at the last whitespace before ``start + size`` (so words are not
    cut) unless the window holds a single over-long word, which is then cut hard; the next window
    starts ``overlap`` characters before the end, moved forward to the next word start.
    ``unit="tokens"``: windows of ``size`` tokens of the MiniLM tokenizer, cut at word starts where
    possible; the tokenizer's offset mapping gives exact character offsets. Characters the tokenizer
    drops (control / zero-width / combining marks) are attributed to the preceding token, so no
    non-whitespace character is ever lost.
    """

    def __init__(
        self, size: int = 800, overlap: int = 100, unit: Literal["chars", "tokens"] = "chars"
    ) -> None:
        if size <= 0:
            raise ValueError(f"chunking.size must be > 0, got {size}")
        if not 0 <= overlap < size:
            raise ValueError(f"chunking.overlap must be in [0, size), got {overlap} with size {size}")
        if unit not in ("chars", "tokens"):
            raise ValueError(f"chunking.unit must be 'chars' or 'tokens', got {unit!r}")
        self.size = size
        self.overlap = overlap
        self.unit = unit

    def split(self, doc: Document) -> list[Chunk]:
        spans = self._char_spans(doc.text) if self.unit == "chars" else self._token_spans(doc.text)
        return _chunks_from_spans(doc, spans)

    def _char_spans(self, text: str) -> list[tuple[int, int]]:
        n = len(text)
        spans: list[tuple[int, int]] = []
        start = _skip_space(text, 0)
        while start < n:
            end = min(start + self.size, n)
            if end < n and not text[end].isspace() and not text[end - 1].isspace():
                # Mid-word: back off to the last whitespace inside the window, if there is one.
                cut = max((i for i in range(end - 1, start, -1) if text[i].isspace()), default=None)
                if cut is not None:
                    end = cut
            spans.append((start, end))
            if end >= n:
                break
            nxt = end - self.overlap
            if nxt <= start:  # the window shrank below the overlap: no overlap this time
                nxt = end
            elif nxt > 0 and not text[nxt - 1].isspace() and not text[nxt].isspace():
                # Start the overlap at a word start; stay within the previous window (coverage).
                ws = next((i for i in range(nxt, end) if text[i].isspace()), None)
                if ws is not None:
                    nxt = ws
            start = _skip_space(text, nxt)
        return spans

    def _token_spans(self, text: str) -> list[tuple[int, int]]:
        if not text.strip():
            return []
        enc = _minilm_tokenizer().encode(text, add_special_tokens=False)
        offsets, word_ids = enc.offsets, enc.word_ids
        n_tok = len(offsets)
        if n_tok == 0:  # only characters the tokenizer drops: keep them as one chunk
            return [(0, len(text))]
        # Token t owns the characters from its start to the next token's start, so characters the
        # tokenizer dropped still belong to a chunk. bounds[t] = character where token t starts.
        bounds = [0] + [offsets[t][0] for t in range(1, n_tok)] + [len(text)]

        def word_start(t: int, lo: int) -> int:
            # Move a cut at token t back to the first token of its word, but not to or before lo.
            s = t
            while s > lo and word_ids[s] is not None and word_ids[s - 1] == word_ids[s]:
                s -= 1
            return s if s > lo else t

        spans: list[tuple[int, int]] = []
        i = 0
        while True:
            j = min(i + self.size, n_tok)
            if j < n_tok:
                j = word_start(j, i)
            spans.append((bounds[i], bounds[j]))
            if j >= n_tok:
                break
            nxt = j - self.overlap
            if nxt <= i:  # the window shrank below the overlap: no overlap this time
                nxt = j
            # Start the overlap at a word start, moving forward so it never exceeds `overlap`.
            while nxt < j and word_ids[nxt] is not None and word_ids[nxt - 1] == word_ids[nxt]:
                nxt += 1
            i = nxt
        return spans


# --------------------------------------------------------------------------- sentences


class SentenceWindowChunker:
    """Windows of ``window`` consecutive sentences, advancing ``stride`` sentences each time.

    The last window always ends at the last sentence. ``stride <= window`` so that no sentence is
    skipped. ``metadata["sentences"] = [first, last]`` (sentence indices, inclusive).
    """

    def __init__(self, window: int = 3, stride: int = 2) -> None:
        if window <= 0:
            raise ValueError(f"chunking.window must be > 0, got {window}")
        if not 0 < stride <= window:
            raise ValueError(f"chunking.stride must be in [1, window], got {stride} with window {window}")
        self.window = window
        self.stride = stride

    def split(self, doc: Document) -> list[Chunk]:
        sents = split_sentences(doc.text)
        chunks: list[Chunk] = []
        i = 0
        while i < len(sents):
            last = min(i + self.window, len(sents)) - 1
            chunks.append(_make_chunk(doc, sents[i][0], sents[last][1], {"sentences": [i, last]}))
            if last == len(sents) - 1:
                break
            i += self.stride
        return chunks


# --------------------------------------------------------------------------- recursive


def _char_offsets(text: str, pieces: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """Turn ``chunk_indices`` output into character spans, whatever unit its offsets are in.

    semantic-text-splitter 0.33 returns character offsets from Python (tests/test_chunking.py proves
    it on non-ASCII text); byte offsets (the Rust crate's unit) are converted, and as a last resort
    the piece is located by search, so a change of unit upstream can never break the contract.
    """
    spans: list[tuple[int, int]] = []
    byte_to_char: dict[int, int] | None = None
    cursor = 0
    for off, piece in pieces:
        if text.startswith(piece, off):
            start = off
        else:
            if byte_to_char is None:
                byte_to_char, b = {}, 0
                for ci, ch in enumerate(text):
                    byte_to_char[b] = ci
                    b += len(ch.encode("utf-8"))
                byte_to_char[b] = len(text)
            start = byte_to_char.get(off, -1)
            if start < 0 or not text.startswith(piece, start):
                start = text.find(piece, cursor)
                if start < 0:
                    start = text.find(piece)
                if start < 0:
                    raise RuntimeError(f"semantic-text-splitter returned a chunk not in the text: {piece!r}")
        spans.append((start, start + len(piece)))
        cursor = start
    return spans


@functools.lru_cache(maxsize=16)
def _text_splitter(capacity: int, overlap: int):
    from semantic_text_splitter import TextSplitter

    return TextSplitter(capacity, overlap=overlap)


def _recursive_spans(text: str, size: int, overlap: int) -> list[tuple[int, int]]:
    if not text.strip():
        return []
    return _char_offsets(text, _text_splitter(size, overlap).chunk_indices(text))


class RecursiveChunker:
    """Paragraph → sentence → word → character splitting up to ``size`` characters.

    Backed by ``semantic-text-splitter`` (Rust ``text-splitter``): it splits at the largest semantic
    level (blank lines, newlines, sentences by Unicode segmentation, words, graphemes) that fits and
    merges neighbours up to the capacity. Its chunks are whitespace-trimmed; ``overlap`` is the
    maximum number of characters shared by neighbouring chunks.
    """

    def __init__(self, size: int = 800, overlap: int = 0) -> None:
        if size <= 0:
            raise ValueError(f"chunking.size must be > 0, got {size}")
        if not 0 <= overlap < size:
            raise ValueError(f"chunking.overlap must be in [0, size), got {overlap} with size {size}")
        self.size = size
        self.overlap = overlap

    def split(self, doc: Document) -> list[Chunk]:
        return _chunks_from_spans(doc, _recursive_spans(doc.text, self.size, self.overlap))


# --------------------------------------------------------------------------- markdown

_ATX_RE = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")


def markdown_sections(text: str) -> list[tuple[int, int, int, str]]:
    """ATX headings outside code fences: ``(line_start, line_end, level, heading_text)``."""
    out: list[tuple[int, int, int, str]] = []
    fence: str | None = None
    for s, e in _lines(text):
        line = text[s:e]
        fm = _FENCE_RE.match(line)
        if fence is not None:
            # A fence closes with the same character, at least as long, and nothing else on the line.
            if (
                fm
                and fm.group(1)[0] == fence[0]
                and len(fm.group(1)) >= len(fence)
                and not line[fm.end() :].strip()
            ):
                fence = None
            continue
        if fm:
            fence = fm.group(1)
            continue
        m = _ATX_RE.match(line)
        if m:
            out.append((s, e, len(m.group(1)), (m.group(2) or "").strip()))
    return out


class MarkdownChunker:
    """One chunk per markdown section (an ATX heading line plus its body, up to the next heading).

    ``metadata["heading_path"]``: the chain of enclosing headings, e.g. ``["Refunds", "Monthly
    plans", "What counts as a billing error"]``. A top-level ``#`` heading is the page title; when
    the document has none, ``doc.title`` heads the path. Text before the first heading gets
    ``[doc.title]``. ``#`` lines inside code fences are not headings. Sections longer than
    ``max_size`` characters are sub-split like RecursiveChunker (``overlap`` applies there), keeping
    the section's heading_path.
    """

    def __init__(self, max_size: int = 1200, overlap: int = 0) -> None:
        if max_size <= 0:
            raise ValueError(f"chunking.max_size must be > 0, got {max_size}")
        if not 0 <= overlap < max_size:
            raise ValueError(f"chunking.overlap must be in [0, max_size), got {overlap}")
        self.max_size = max_size
        self.overlap = overlap

    def split(self, doc: Document) -> list[Chunk]:
        text = doc.text
        headings = markdown_sections(text)
        root = [doc.title] if doc.title else []
        sections: list[tuple[int, int, list[str]]] = []
        first = headings[0][0] if headings else len(text)
        sections.append((0, first, list(root)))
        stack: list[tuple[int, str]] = []
        for idx, (s, _e, level, title) in enumerate(headings):
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
            end = headings[idx + 1][0] if idx + 1 < len(headings) else len(text)
            names = [t for _, t in stack]
            path = names if stack[0][0] == 1 else root + names
            sections.append((s, end, path))

        chunks: list[Chunk] = []
        for s, e, path in sections:
            t = _trim(text, s, e)
            if t is None:
                continue
            s, e = t
            meta = {"heading_path": path}
            if e - s <= self.max_size:
                chunks.append(_make_chunk(doc, s, e, meta))
                continue
            sub = _recursive_spans(text[s:e], self.max_size, self.overlap)
            chunks.extend(_chunks_from_spans(doc, [(s + a, s + b) for a, b in sub], meta))
        chunks.sort(key=lambda c: (c.start, c.end))
        return chunks


# --------------------------------------------------------------------------- whole document


class WholeDocumentChunker:
    """The whole document (whitespace-trimmed) as one chunk: the no-chunking baseline."""

    def split(self, doc: Document) -> list[Chunk]:
        return _chunks_from_spans(doc, [(0, len(doc.text))])
