"""Corpus loading: a directory of .md/.txt files, our JSONL, or a BEIR corpus.jsonl.

A loader returns plain ``Document`` objects and knows nothing of models (BEIR-style).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rag_experiments.types import Document

TEXT_SUFFIXES = {".md", ".txt", ".markdown"}


class CorpusError(ValueError):
    """Bad corpus input; the message names file, line and field."""


def _title_from_markdown(text: str, fallback: str) -> str:
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return fallback


def load_directory(root: str | Path) -> list[Document]:
    """Every .md/.txt file under ``root``; doc_id = POSIX path relative to ``root``."""
    root = Path(root)
    docs = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES):
        doc_id = path.relative_to(root).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise CorpusError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from e
        docs.append(Document(doc_id, _title_from_markdown(text, path.stem), text))
    if not docs:
        raise CorpusError(f"{root}: no .md or .txt files found")
    return docs


def load_jsonl(path: str | Path, id_field: str = "doc_id") -> list[Document]:
    """Our JSONL (``doc_id``, ``title``, ``text``) or BEIR's corpus.jsonl (``_id``, ``title``, ``text``)."""
    path = Path(path)
    docs: list[Document] = []
    seen: set[str] = set()
    errors: list[str] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                errors.append(f"{path}:{lineno}: invalid JSON: {e.msg}")
                continue
            doc_id = row.get(id_field, row.get("_id") if id_field == "doc_id" else None)
            text = row.get("text")
            if not isinstance(doc_id, str) or not doc_id:
                errors.append(f"{path}:{lineno}: {id_field}: missing or not a string")
                continue
            if not isinstance(text, str):
                errors.append(f"{path}:{lineno}: text: missing or not a string")
                continue
            if doc_id in seen:
                errors.append(f"{path}:{lineno}: {id_field}: duplicate {doc_id!r}")
                continue
            seen.add(doc_id)
            meta = {k: v for k, v in row.items() if k not in (id_field, "_id", "title", "text")}
            docs.append(Document(doc_id, str(row.get("title") or ""), text, meta))
    if errors:
        raise CorpusError("\n".join(errors))
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
    """sha256 over the sorted (doc_id, text) pairs (DESIGN §2)."""
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
