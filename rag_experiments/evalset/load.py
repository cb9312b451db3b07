"""Eval sets: schema, loading with exhaustive validation, digests, and importers.

Gold evidence is text in the corpus, not a chunk id: each evidence item names a document and a
``quote`` (matched exactly after whitespace normalisation) and/or ``start``/``end`` offsets, and is
resolved at load time to a ``Span``. A quote that no longer occurs is how a stale eval set is caught.

CLI::

    python -m rag_experiments.evalset validate [--corpus PATH] [--evalset PATH]
    python -m rag_experiments.evalset import-squad FILE --out DIR [--strict]
    python -m rag_experiments.evalset import-beir DIR --out DIR [--split test] [--strict]
    python -m rag_experiments.evalset generate --corpus PATH --n N [--seed 0] [--base-url URL --model M
        [--api-key-env VAR]] [--model-path GGUF] [--dedup-threshold 0.9] --out review.csv
        [--rejected review.rejected.jsonl]
    python -m rag_experiments.evalset accept review.csv --corpus PATH --out evalset.jsonl

``generate`` / ``accept`` (``evalset/generate.py``, ``docs/evalset-generation.md``) bootstrap an eval
set from the corpus with an LLM and a human review. The importers (``evalset/importers.py``) repair misaligned answers and drop references they
cannot find, printing kept / repaired / dropped counts; ``--strict`` lists them and exits 2.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rag_experiments.core.build import build
from rag_experiments.core.conf_groups import conf_dir
from rag_experiments.core.keys import tag_problem
from rag_experiments.core.types import Document, EvalItem, Span
from rag_experiments.evalset import conversations as conv
from rag_experiments.evalset.checks import parse_checks
from rag_experiments.evalset.corpus import files_fingerprint
from rag_experiments.evalset.weak_facts import mark_weak

_WS = re.compile(r"\s+")
_CHUNK_INDEX = re.compile(r"^(?P<doc>.+)#chunk_(?P<i>\d+)$")
_CHUNK_OFFSETS = re.compile(r"^(?P<doc>.+)#(?P<s>\d+)-(?P<e>\d+)$")


def sample_dir() -> Path:
    """The bundled sample (package data): ``docs/`` and ``evalset.jsonl``."""
    return Path(str(resources.files("rag_experiments") / "data" / "sample"))


class EvalSetError(ValueError):
    """Every problem found, one ``FILE:LINE: field: what is wrong`` per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def _segments(text: str):
    """(offset, text) of each starter character with the combining marks that follow it: the
    units NFC composes, so every composed character maps back to one original range."""
    start = 0
    for i in range(1, len(text) + 1):
        if i == len(text) or not unicodedata.combining(text[i]):
            yield start, text[start:i]
            start = i


@dataclass
class Normalised:
    """A document's NFC, whitespace-collapsed text plus the map back to original offsets (an NFD
    document, "e" + U+0301, matches an NFC quote, "é", and the span covers both code points)."""

    text: str
    orig: list[int]  # orig[i] = offset in the original text where normalised character i starts
    orig_end: list[int]  # ... and where it ends

    @classmethod
    def of(cls, text: str) -> Normalised:
        out, orig, orig_end = [], [], []
        prev_space = False
        for at, seg in _segments(text):
            for ch in unicodedata.normalize("NFC", seg):
                if ch.isspace():
                    if prev_space:
                        continue
                    out.append(" ")
                    prev_space = True
                else:
                    out.append(ch)
                    prev_space = False
                orig.append(at)
                orig_end.append(at + len(seg))
        return cls("".join(out), orig, orig_end)

    def find_all(self, quote: str) -> list[tuple[int, int]]:
        """Original-text spans of every occurrence of the normalised quote."""
        spans, i = [], self.text.find(quote)
        while i != -1:
            spans.append((self.orig[i], self.orig_end[i + len(quote) - 1]))
            i = self.text.find(quote, i + 1)
        return spans


def normalise_ws(s: str) -> str:
    """Whitespace collapsed and NFC: how quotes are matched against ``Normalised`` documents."""
    return unicodedata.normalize("NFC", _WS.sub(" ", s).strip())


def closest_doc_id(doc_id: str, known: Iterable[str]) -> str | None:
    """The corpus document a mistyped ``doc_id`` most likely means, else None.

    First a document with the same file name in another folder (``webhooks.md`` →
    ``guide/webhooks.md``; the shortest path wins), then the highest ``difflib`` similarity
    ratio 2·M / (|a| + |b|) over case-folded ids, if ≥ 0.6 (``difflib.get_close_matches``).
    """
    known = sorted(known)
    base = doc_id.replace("\\", "/").rsplit("/", 1)[-1].lower()
    same = [k for k in known if k.replace("\\", "/").rsplit("/", 1)[-1].lower() == base]
    if same:
        return min(same, key=len)
    folded = {k.lower(): k for k in known}
    hit = difflib.get_close_matches(doc_id.lower(), list(folded), n=1, cutoff=0.6)
    return folded[hit[0]] if hit else None


def did_you_mean(doc_id: str, known: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for :func:`closest_doc_id`, else ``""``."""
    best = closest_doc_id(doc_id, known)
    return f"; did you mean {best!r}?" if best else ""


class _Resolver:
    """Resolves evidence items against a corpus, caching the normalised documents."""

    def __init__(self, docs: dict[str, Document], chunking_dir: Path | None = None):
        self.docs = docs
        self._norm: dict[str, Normalised] = {}
        self._chunks: dict[str, dict[str, list]] = {}
        self.chunking_dir = chunking_dir

    def norm(self, doc_id: str) -> Normalised:
        if doc_id not in self._norm:
            self._norm[doc_id] = Normalised.of(self.docs[doc_id].text)
        return self._norm[doc_id]

    def evidence(self, ev: Any, where: str) -> tuple[Span | None, list[str]]:
        if not isinstance(ev, dict):
            return None, [f"{where}: expected an object with doc_id and quote or start/end"]
        doc_id = ev.get("doc_id")
        if not isinstance(doc_id, str) or not doc_id:
            return None, [f"{where}.doc_id: missing or not a string"]
        if doc_id not in self.docs:
            return None, [
                f"{where}.doc_id: unknown document {doc_id!r} (not in the corpus{did_you_mean(doc_id, self.docs)})"
            ]
        text = self.docs[doc_id].text
        quote, start, end = ev.get("quote"), ev.get("start"), ev.get("end")
        for name, val in (("start", start), ("end", end)):
            if val is not None and (not isinstance(val, int) or isinstance(val, bool)):
                return None, [f"{where}.{name}: must be an integer character offset, got {val!r}"]
        if (start is None) != (end is None):
            return None, [f"{where}: give both start and end, or neither"]
        if start is not None and not (0 <= start < end <= len(text)):
            return None, [
                f"{where}.start/end: offsets {start}-{end} outside document {doc_id!r} (length {len(text)})"
            ]
        if quote is None:
            if start is None:
                return None, [f"{where}: needs a quote or start/end offsets"]
            return Span(doc_id, start, end), []
        if not isinstance(quote, str) or not normalise_ws(quote):
            return None, [f"{where}.quote: must be a non-empty string"]
        hits = self.norm(doc_id).find_all(normalise_ws(quote))
        if not hits:
            return None, [f"{where}.quote: not found in {doc_id} (stale eval set?): {quote[:80]!r}"]
        if start is not None:
            if (start, end) in hits:
                return Span(doc_id, start, end), []
            return None, [f"{where}.start/end: offsets {start}-{end} do not hold the quote in {doc_id}"]
        if len(hits) > 1:
            where_at = ", ".join(str(s) for s, _ in hits[:5])
            return None, [
                f"{where}.quote: found {len(hits)} times in {doc_id} (at {where_at}); "
                "add start/end offsets or a longer quote"
            ]
        return Span(doc_id, *hits[0]), []

    def chunk_ids(self, ids: Any, reference: Any, where: str) -> tuple[list[Span], list[str]]:
        """The seed format: gold_chunk_ids under a named reference chunking → spans."""
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return [], [f"{where}: must be a list of chunk id strings"]
        spans, problems = [], []
        for j, cid in enumerate(ids):
            w = f"{where}[{j}]"
            if m := _CHUNK_OFFSETS.match(cid):
                sp, pr = self.evidence({"doc_id": m["doc"], "start": int(m["s"]), "end": int(m["e"])}, w)
            elif m := _CHUNK_INDEX.match(cid):
                if m["doc"] not in self.docs:
                    sp, pr = None, [f"{w}: unknown document {m['doc']!r}{did_you_mean(m['doc'], self.docs)}"]
                elif reference is None:
                    sp, pr = None, [f"{w}: chunk index ids need 'reference_chunking' on the item"]
                else:
                    try:
                        chunks = self._reference_chunks(reference, m["doc"])
                    except Exception as e:  # a bad chunker config is an input error here
                        sp, pr = None, [f"{where.rsplit('.', 1)[0]}.reference_chunking: {e}"]
                    else:
                        i = int(m["i"])
                        if i >= len(chunks):
                            sp, pr = (
                                None,
                                [f"{w}: {m['doc']} has {len(chunks)} chunks under the reference chunking"],
                            )
                        else:
                            c = chunks[i]
                            sp, pr = Span(c.doc_id, c.start, c.end), []
            else:
                sp, pr = None, [f"{w}: {cid!r} is neither 'doc#chunk_N' nor 'doc#start-end'"]
            problems += pr
            if sp:
                spans.append(sp)
        return spans, problems

    def _reference_chunks(self, reference: Any, doc_id: str) -> list:
        key = json.dumps(reference, sort_keys=True)
        per_doc = self._chunks.setdefault(key, {})
        if doc_id not in per_doc:
            per_doc[doc_id] = build_reference_chunker(reference).split(self.docs[doc_id])
        return per_doc[doc_id]


def build_reference_chunker(reference: Any):
    """A chunker from an option name of ``conf/chunking`` ("fixed") or a ``_target_`` mapping."""
    import yaml

    if isinstance(reference, str):
        path = conf_dir() / "chunking" / f"{reference}.yaml"
        if not path.is_file():
            raise ValueError(f"unknown chunking {reference!r} (no {path})")
        reference = yaml.safe_load(path.read_text(encoding="utf-8"))  # chunking options interpolate nothing
    if not isinstance(reference, dict) or "_target_" not in reference:
        raise ValueError("must be a conf/chunking option name or a mapping with _target_")
    return build(reference)


_FIELDS: dict[str, tuple[type, bool]] = {
    "id": (str, True),
    "query": (str, True),
    "gold_evidence": (list, False),
    "gold_answer": (str, False),
    "gold_answers": (list, False),
    "key_facts": (list, False),
    "tags": (list, False),
    "assert": (list, False),  # per-item checks (evalset.checks)
}


def _type_name(v: Any) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
    }.get(type(v), type(v).__name__)


def _parse_line(raw: bytes, lineno: int, where: str) -> tuple[dict | None, list[str]]:
    """One JSONL line → (object, problems); (None, []) for a blank line.

    Decoded per line, so one bad byte names its line and the rest of the file is still checked.
    """
    try:
        line = (raw.removeprefix(b"\xef\xbb\xbf") if lineno == 1 else raw).decode("utf-8")
    except UnicodeDecodeError as e:
        return None, [f"{where}: encoding: not valid UTF-8 ({e.reason} at byte {e.start} of the line)"]
    if not line.strip():
        return None, []
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        return None, [f"{where}: json: invalid JSON at column {e.colno}: {e.msg}"]
    if not isinstance(row, dict):
        return None, [f"{where}: item: expected a JSON object, got {_type_name(row)}"]
    return row, []


def _field_problems(row: dict, where: str) -> list[str]:
    """Missing required fields and wrongly typed ones (:data:`_FIELDS`); any makes the row unusable."""
    problems = []
    for name, (typ, required) in _FIELDS.items():
        if name not in row or row[name] is None:
            if required:
                problems.append(f"{where}: {name}: missing required field")
        elif not isinstance(row[name], typ):
            problems.append(f"{where}: {name}: expected {typ.__name__}, got {_type_name(row[name])}")
    if "gold_evidence" not in row and "gold_chunk_ids" not in row:
        problems.append(f"{where}: gold_evidence: missing (use [] for an unanswerable item)")
    return problems


def _gold_spans(row: dict, where: str, resolver: _Resolver) -> tuple[list[Span], list[str]]:
    """The row's gold evidence (and seed-format ``gold_chunk_ids``) resolved to corpus spans."""
    spans: list[Span] = []
    problems: list[str] = []
    for j, ev in enumerate(row.get("gold_evidence") or []):
        sp, pr = resolver.evidence(ev, f"{where}: gold_evidence[{j}]")
        problems += pr
        if sp:
            spans.append(sp)
    if "gold_chunk_ids" in row:
        sp_list, pr = resolver.chunk_ids(
            row["gold_chunk_ids"], row.get("reference_chunking"), f"{where}: gold_chunk_ids"
        )
        problems += pr
        spans += sp_list
    return spans, problems


def _text_problems(row: dict, where: str) -> list[str]:
    """Control characters in ``id`` (any, e.g. ``\\u0000``), NUL in any other text: PostgreSQL
    stores no NUL, and an id is printed, logged and used as a key."""
    problems = []
    bad = sorted({c for c in row["id"] if unicodedata.category(c) == "Cc"})
    if bad:
        shown = ", ".join(f"U+{ord(c):04X}" for c in bad[:5])
        problems.append(f"{where}: id: contains control characters ({shown}); use printable text")
    for name in ("query", "gold_answer"):
        if isinstance(row.get(name), str) and "\x00" in row[name]:
            problems.append(f"{where}: {name}: contains a NUL character (U+0000)")
    for name in ("key_facts", "tags", "gold_answers"):
        if any(isinstance(v, str) and "\x00" in v for v in row.get(name) or []):
            problems.append(f"{where}: {name}: contains a NUL character (U+0000)")
    return problems


def _item_of(row: dict, lineno: int, where: str, resolver: _Resolver) -> tuple[EvalItem, list[str]]:
    """A well-typed row → (EvalItem, problems of its values: strings, evidence, unanswerable tag)."""
    problems = []
    for name in ("key_facts", "tags", "gold_answers"):
        for j, v in enumerate(row.get(name) or []):
            if not isinstance(v, str) or not v.strip():
                problems.append(f"{where}: {name}[{j}]: must be a non-empty string")
            elif name == "tags" and (why := tag_problem(v)):
                problems.append(f"{where}: tags[{j}]: {v!r} cannot name a by_tag/ metric: {why}")
    problems += _text_problems(row, where)
    spans, pr = _gold_spans(row, where, resolver)
    problems += pr
    checks, pr = parse_checks(
        row.get("assert"), where, resolver.docs, lambda d: did_you_mean(d, resolver.docs)
    )
    problems += pr
    tags = list(row.get("tags") or [])
    declared_empty = not row.get("gold_evidence") and not row.get("gold_chunk_ids")
    if declared_empty and "unanswerable" not in tags:
        problems.append(f"{where}: gold_evidence: empty, but the item is not tagged 'unanswerable'")
    if not declared_empty and "unanswerable" in tags:
        problems.append(f"{where}: tags: tagged 'unanswerable' but has gold evidence")
    item = EvalItem(
        id=row["id"],
        query=row["query"],
        gold_spans=spans,
        gold_answer=row.get("gold_answer"),
        key_facts=list(row.get("key_facts") or []),
        tags=tags,
        line=lineno,
        gold_answers=list(row.get("gold_answers") or []),
        checks=checks,
    )
    if conv.is_turn(row):  # a conversation's turn (evalset.conversations); absent: nothing changes
        problems += conv.row_problems(row, where)
        item.history = [dict(t) for t in row.get("history") or [] if isinstance(t, dict)]
        item.standalone_query, item.answerability = row.get("standalone_query"), row.get("answerability")
        item.turn, item.conversation_id = row.get("turn"), row.get("conversation_id")
        item.tags += conv.turn_tags(row, item) if not problems else []
    return item, problems


def load_evalset(
    path: str | Path, docs: list[Document], limit: int | None = None
) -> tuple[list[EvalItem], str]:
    """Load and validate an eval set against ``docs``; returns (items, digest).

    Raises ``EvalSetError`` listing every problem found, never just the first.
    """
    path = Path(path)
    if not path.is_file():
        raise EvalSetError([f"{path}: eval set file not found"])
    resolver = _Resolver({d.doc_id: d for d in docs})
    items: list[EvalItem] = []
    raw_items: list[dict] = []
    problems: list[str] = []
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        where = f"{path}:{lineno}"
        row, pr = _parse_line(raw, lineno, where)
        problems += pr
        if row is None:
            continue
        pr = _field_problems(row, where)
        problems += pr
        if pr:
            continue
        if not row["query"].strip():
            problems.append(f"{where}: query: empty")
        if row["id"] in first_line:
            problems.append(f"{where}: id: duplicate {row['id']!r} (first on line {first_line[row['id']]})")
        else:
            first_line[row["id"]] = lineno
        item, pr = _item_of(row, lineno, where, resolver)
        problems += pr
        raw_items.append(row)
        items.append(item)
    if not items and not problems:
        problems.append(f"{path}: eval set is empty")
    problems += conv.conversation_problems(items, str(path)) if not problems else []
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        problems.append(
            f"{path}: limit: must be a positive number of items, got {limit!r}"
        )  # [:-1] drops one
    if problems:
        raise EvalSetError(problems)
    if limit:
        items, raw_items = items[:limit], raw_items[:limit]
    return items, evalset_digest(raw_items)


def evalset_digest(raw_items: list[dict]) -> str:
    """sha256 of the canonical JSON (sorted keys, no whitespace) of the items, in file order."""
    canon = json.dumps(raw_items, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()


def tag_counts(items: list[EvalItem]) -> Counter:
    return Counter(t for it in items for t in it.tags)


class EvalSet:
    """Hydra target for ``conf/evalset``: loads and validates against a corpus once."""

    _loaded: dict[tuple, tuple] = {}  # validated once per process per (file, corpus, limit)

    def __init__(self, path: str, corpus, limit: int | None = None, name: str = "") -> None:
        self.path = path
        self.name = name or Path(path).stem
        key = (str(Path(path).resolve()), files_fingerprint(path), corpus.digest, limit)
        if key not in EvalSet._loaded:
            items, digest = load_evalset(path, corpus.docs, limit=limit)
            EvalSet._loaded[key] = (*mark_weak(items, corpus.docs), digest)
        items, self.weak, self.digest = EvalSet._loaded[key]  # weak: evalset.weak_facts.WeakFact list
        self.items = list(items)
