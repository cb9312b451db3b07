"""Corpus loading: a directory of .md/.txt files, our JSONL, or a BEIR corpus.jsonl.

A loader returns plain ``Document`` objects and knows nothing of models (BEIR-style).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from rag_experiments.core.types import Document

TEXT_SUFFIXES = {".md", ".txt", ".markdown"}


class CorpusError(ValueError):
    """Bad corpus input; the message names file, line and field."""


def _title_from_markdown(text: str, fallback: str) -> str:
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return fallback


def decode_utf8(raw: bytes, where: str) -> str:
    """``raw`` as UTF-8 text (a leading BOM dropped), or an error naming line and byte.

    Text with NUL bytes is rejected as binary: no document or eval set legitimately has them.
    """
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise CorpusError(
            f"{where}:{line}: not valid UTF-8 ({e.reason} at byte {e.start}); save it as UTF-8"
        ) from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise CorpusError(f"{where}:{line}: contains NUL bytes (a binary file?)")
    return text


def load_directory(root: str | Path) -> list[Document]:
    """Every .md/.txt file under ``root``; doc_id = POSIX path relative to ``root``.

    Line endings are normalised to ``\n`` (as ``open`` does), so offsets do not depend on CRLF.
    """
    root = Path(root)
    docs = []
    real_root = root.resolve()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES):
        if not path.resolve().is_relative_to(real_root):  # a symlink out of the corpus is not a document
            print(f"corpus: skipped {path}: a symlink to {path.resolve()}, outside {root}", file=sys.stderr)
            continue
        doc_id = path.relative_to(root).as_posix()
        text = decode_utf8(path.read_bytes(), str(path)).replace("\r\n", "\n").replace("\r", "\n")
        docs.append(Document(doc_id, _title_from_markdown(text, path.stem), text))
    if not docs:
        raise CorpusError(f"{root}: no .md or .txt files found")
    _require_text(docs, str(root))
    return docs


def _require_text(docs: list[Document], where: str) -> None:
    if not any(d.text.strip() for d in docs):
        raise CorpusError(f"{where}: every document is empty ({len(docs)} documents, no text to chunk)")


def _jsonl_row(raw: bytes, where: str, id_field: str, seen: set[str]) -> tuple[Document | None, str | None]:
    """One corpus line → (document, None) or (None, problem)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"{where}: not valid UTF-8 ({e.reason} at byte {e.start} of the line)"
    if not line.strip():
        return None, None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"{where}: invalid JSON at column {e.colno}: {e.msg}"
    if not isinstance(row, dict):
        return None, f"{where}: expected a JSON object, got {type(row).__name__}"
    doc_id = row.get(id_field, row.get("_id") if id_field == "doc_id" else None)
    text = row.get("text")
    if not isinstance(doc_id, str) or not doc_id:
        return None, f"{where}: {id_field}: missing or not a string"
    if not isinstance(text, str):
        return None, f"{where}: text: missing or not a string"
    if doc_id in seen:
        return None, f"{where}: {id_field}: duplicate {doc_id[:200]!r}"
    seen.add(doc_id)
    meta = {k: v for k, v in row.items() if k not in (id_field, "_id", "title", "text")}
    return Document(doc_id, str(row.get("title") or ""), text, meta), None


def load_jsonl(path: str | Path, id_field: str = "doc_id") -> list[Document]:
    """Our JSONL (``doc_id``, ``title``, ``text``) or BEIR's corpus.jsonl (``_id``, ``title``, ``text``).

    Every problem is reported as ``FILE:LINE: field: what is wrong``, never just the first.
    """
    path = Path(path)
    docs: list[Document] = []
    seen: set[str] = set()
    errors: list[str] = []
    for lineno, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        raw = raw.removeprefix(b"\xef\xbb\xbf") if lineno == 1 else raw
        doc, problem = _jsonl_row(raw.rstrip(b"\r"), f"{path}:{lineno}", id_field, seen)
        if problem:
            errors.append(problem)
        elif doc is not None:
            docs.append(doc)
    if errors:
        raise CorpusError("\n".join(errors))
    if not docs:
        raise CorpusError(f"{path}: no documents (the file is empty)")
    _require_text(docs, str(path))
    return docs


def load_corpus(path: str | Path) -> list[Document]:
    """Dispatch on what ``path`` is: a directory, a .jsonl file, or a BEIR dataset directory."""
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"{path}: corpus not found")
    if path.is_dir() and (path / "corpus.jsonl").is_file():
        return load_jsonl(path / "corpus.jsonl")
    if path.is_dir():
        return load_directory(path)
    if path.suffix == ".jsonl":
        return load_jsonl(path)
    raise CorpusError(f"{path}: expected a directory of .md/.txt files or a .jsonl file")


def corpus_digest(docs: list[Document]) -> str:
    """sha256 over the sorted (doc_id, text) pairs (docs/architecture.md)."""
    h = hashlib.sha256()
    for d in sorted(docs, key=lambda d: d.doc_id):
        h.update(json.dumps([d.doc_id, d.text], ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()


def files_fingerprint(path: str | Path) -> tuple:
    """(name, size, mtime) of every file under ``path``: cheap to compute, changes on any edit."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.exists())


_LOADED: dict[tuple, dict] = {}  # one load per process per unchanged corpus: sweeps reuse it


class Corpus:
    """Hydra target for ``conf/corpus``: a path resolved to documents once per process."""

    def __init__(self, path: str, name: str = "") -> None:
        key = (str(Path(path).resolve()), files_fingerprint(path)) if Path(path).exists() else None
        if key in _LOADED:
            self.__dict__.update(_LOADED[key], name=name or Path(path).name)
            return
        self.path = path
        self.name = name or Path(path).name
        self.docs = load_corpus(path)
        self.by_id = {d.doc_id: d for d in self.docs}
        self.digest = corpus_digest(self.docs)
        if key is not None:
            _LOADED[key] = dict(self.__dict__)
