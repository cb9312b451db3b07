"""The review CSV of traced production questions, and accepting it into the eval set (docs/from-traces.md).

``from-traces`` writes one row per sampled question: its trace, inclusion probability, the
production answer and the retrieved context (to help, never to copy blindly), and empty columns
for the reviewer. The reviewer fills, per row:

- ``keep``: ``yes`` (an eval item with gold evidence: ``doc_id`` + a verbatim ``quote`` of the
  corpus), ``unanswerable`` (an eval item the corpus cannot answer: no evidence), ``discard``/``no``
  (not an eval item), blank (not reviewed yet);
- ``answer`` (the gold answer), ``key_facts`` (``;``-separated), ``tags``;
- ``label``: what the production answer was (``ok`` or a failure label, :data:`LABELS`), for the
  production estimate; blank: not labelled;
- ``note``: free text, where ``never: TEXT`` entries become checks the answer must pass
  (:func:`note_checks`); a review written before the column existed is read without it.

The header is a contract: a renamed, missing or extra column is refused (exit 2), as is a duplicate
``id``. ``accept`` validates every kept quote with the eval-set loader (the same messages as
``validate``), gives each item the id ``trace-<sha256(trace id)>`` (lengthened until it collides with
no existing id), writes the merged eval set with each new item's lineage (``source.trace_id``) and
skips items whose trace is already in the eval set, so accepting the same review twice changes
nothing.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from rag_experiments.core.types import Document
from rag_experiments.evalset.csv_text import numbered_rows
from rag_experiments.evalset.load import EvalSetError, load_evalset

COLUMNS = [
    "id",
    "trace_id",
    "inclusion_prob",
    "query",
    "production_answer",
    "retrieved_context",
    "doc_id",
    "quote",
    "answer",
    "key_facts",
    "tags",
    "label",
    "keep",
    "note",
]
#: A review written before ``note`` existed: read as one with every note blank.
LEGACY_COLUMNS = COLUMNS[:-1]
#: ``[critical] never: TEXT`` or ``[critical] never: /REGEX/`` (docs/from-traces.md, "Reviewer notes").
NEVER = re.compile(r"^(?P<critical>critical\s+)?never\s*:\s*(?P<value>.*)$", re.I | re.S)
KEEP = {"yes": "keep", "y": "keep", "1": "keep", "true": "keep", "unanswerable": "unanswerable",
        "discard": "discard", "no": "discard", "n": "discard", "0": "discard", "false": "discard", "": ""}  # fmt: skip
#: The reviewer's label of the production answer: ``ok`` or what went wrong (evaluation/labels.py's
#: failure labels, plus ``unanswerable_answered``: the corpus cannot answer and the app answered anyway).
LABELS = ("ok", "retrieval_failure", "generation_failure", "unanswerable_answered", "error")
CONTEXT_CHARS = 1500  # retrieved context shown per row


@dataclass
class ReviewRow:
    id: str
    trace_id: str
    inclusion_prob: float
    query: str
    production_answer: str = ""
    retrieved_context: str = ""
    doc_id: str = ""
    quote: str = ""
    answer: str = ""
    key_facts: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    label: str = ""
    keep: str = ""  # keep / unanswerable / discard / "" (KEEP's values)
    line: int = 0
    note: str = ""


def item_id(trace_id: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """``trace-`` + the first 12 hex digits of sha256(trace id), more digits while it is taken."""
    h = hashlib.sha256(trace_id.encode()).hexdigest()
    n = 12
    while f"trace-{h[:n]}" in taken and n < len(h):
        n += 4
    return f"trace-{h[:n]}"


def write_review(path: Path, rows: list[ReviewRow]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.id, r.trace_id, repr(float(r.inclusion_prob)), r.query, r.production_answer,
                        r.retrieved_context[:CONTEXT_CHARS], r.doc_id, r.quote, r.answer, ";".join(r.key_facts),
                        ";".join(r.tags), r.label, r.keep, r.note])  # fmt: skip


def is_trace_review(path: Path) -> bool:
    """A review CSV whose header names ``trace_id`` (else it is ``evalset generate``'s)."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            return "trace_id" in [h.strip() for h in next(csv.reader(f), [])]
    except (OSError, UnicodeDecodeError, csv.Error):
        return False


def read_review(path: Path) -> tuple[list[ReviewRow], list[str]]:
    """Every row, and ``FILE:LINE: column: problem`` lines (header, ids, keep, label, π)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        return [], [f"{path}:0: file: cannot read ({e})"]
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header = [h.strip() for h in next(reader, [])]
    if header == LEGACY_COLUMNS:
        header = COLUMNS[:-1]
    if header not in (COLUMNS, LEGACY_COLUMNS):
        missing = [c for c in COLUMNS if c not in header]
        extra = [c for c in header if c not in COLUMNS]
        what = "; ".join(
            x for x in (f"missing {', '.join(missing)}" if missing else "", f"unknown {', '.join(extra)}" if extra else "")
            if x
        ) or "columns reordered"  # fmt: skip
        return [], [f"{path}:1: header: changed ({what}); expected {','.join(COLUMNS)}"]
    rows, problems, first = [], [], {}
    for line, values in numbered_rows(reader, path, problems):
        if len(values) != len(header):
            problems.append(f"{path}:{line}: row: {len(values)} fields, the header has {len(header)}")
            continue
        rec = dict(zip(header, (v.strip() for v in values), strict=True))
        rec.setdefault("note", "")
        where = f"{path}:{line}"
        if rec["id"] in first:
            problems.append(f"{where}: id: duplicate {rec['id']!r} (first on line {first[rec['id']]})")
        first.setdefault(rec["id"], line)
        keep = KEEP.get(rec["keep"].lower())
        if keep is None:
            problems.append(f"{where}: keep: {rec['keep']!r} is not yes, unanswerable, discard/no or blank")
        if rec["label"] and rec["label"] not in LABELS:
            problems.append(f"{where}: label: {rec['label']!r} is not one of {', '.join(LABELS)} or blank")
        try:
            pi = float(rec["inclusion_prob"])
            if not 0 < pi <= 1:
                raise ValueError
        except ValueError:
            problems.append(f"{where}: inclusion_prob: {rec['inclusion_prob']!r} is not in (0, 1]")
            pi = float("nan")
        rows.append(ReviewRow(
            rec["id"], rec["trace_id"], pi, rec["query"], rec["production_answer"], rec["retrieved_context"],
            rec["doc_id"], rec["quote"], rec["answer"], [t.strip() for t in rec["key_facts"].split(";") if t.strip()],
            [t for t in re.split(r"[;,\s]+", rec["tags"]) if t], rec["label"], keep or "", line, rec["note"],
        ))  # fmt: skip
    return rows, problems


def note_checks(note: str) -> tuple[list[dict], list[str], list[str]]:
    """(the checks, the free-text parts, problems) of a reviewer's note: ``;``-separated entries;
    ``never: TEXT`` → ``{"type": "not_contains", "value": TEXT}``, ``never: /REGEX/`` →
    ``not_regex``, either with a ``critical`` prefix → ``"critical": true``; TEXT in double quotes
    keeps its outer spaces. Any other entry is free text (kept in the item's ``source.note``).
    The checks are validated by the eval-set loader like any ``assert`` (an invalid regex is a
    problem at the review's line)."""
    checks, text, problems = [], [], []
    for entry in (e.strip() for e in note.split(";")):
        m = NEVER.match(entry) if entry else None
        if m is None:
            if entry:
                text.append(entry)
            continue
        value = m.group("value").strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        kind = "not_contains"
        if len(value) >= 2 and value[0] == value[-1] == "/":
            kind, value = "not_regex", value[1:-1]
        if not value.strip():
            problems.append(f"{entry!r}: never: needs a text or a /regex/ after the colon")
            continue
        checks.append({"type": kind, "value": value, **({"critical": True} if m.group("critical") else {})})
    return checks, text, problems


def _item(r: ReviewRow, item: str) -> dict:
    unanswerable = r.keep == "unanswerable"
    tags = sorted(set(r.tags) | ({"unanswerable"} if unanswerable else set()) | {"production"})
    out = {
        "id": item,
        "query": r.query,
        "gold_evidence": [] if unanswerable else [{"doc_id": r.doc_id, "quote": r.quote}],
        "gold_answer": r.answer or None,
        "key_facts": r.key_facts,
        "tags": tags,
        "source": {"trace_id": r.trace_id, "inclusion_prob": r.inclusion_prob},
    }
    checks, text, _ = note_checks(r.note)
    if checks:
        out["assert"] = checks
    if text:
        out["source"]["note"] = "; ".join(text)
    return out


@dataclass
class Accepted:
    items: list[dict]  # the whole new eval set, existing items first
    new: list[dict]  # the items this review added
    already: int  # kept rows whose trace was already in the eval set (a re-accept)
    pending: list[int]  # lines not reviewed yet (keep blank)
    discarded: int
    lineage: dict[str, str]  # trace id -> item id, of the new items


def accept_review(review: Path, evalset: Path, docs: list[Document]) -> tuple[Accepted | None, list[str]]:
    """Merge the rows marked ``yes``/``unanswerable`` into the eval set at ``evalset``; (None,
    problems naming the review's lines) when anything is wrong: nothing is accepted then."""
    rows, problems = read_review(review)
    if problems:
        return None, problems
    try:
        old_items, _ = load_evalset(evalset, docs)
    except EvalSetError as e:
        return None, e.problems
    old = [
        json.loads(line) for line in Path(evalset).read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    taken = {it["id"] for it in old}
    known = {
        (it.get("source") or {}).get("trace_id"): it["id"] for it in old if isinstance(it.get("source"), dict)
    }
    kept = [r for r in rows if r.keep in ("keep", "unanswerable")]
    for r in kept:
        if r.keep == "keep" and not (r.doc_id and r.quote):
            problems.append(
                f"{review}:{r.line}: quote: keep=yes needs doc_id and a verbatim quote of the corpus"
            )
        problems += [f"{review}:{r.line}: note: {p} (row {r.id})" for p in note_checks(r.note)[2]]
    if problems:
        return None, problems
    new, lineage, already = [], {}, 0
    for r in kept:
        if r.trace_id in known:
            already += 1
            continue
        iid = item_id(r.trace_id, taken)
        taken.add(iid)
        new.append((r, _item(r, iid)))
        lineage[r.trace_id] = iid
    if new:
        problems = _validate([it for _, it in new], [r for r, _ in new], review, docs)
        if problems:
            return None, problems
    acc = Accepted(
        items=old + [it for _, it in new],
        new=[it for _, it in new],
        already=already,
        pending=[r.line for r in rows if r.keep == ""],
        discarded=sum(r.keep == "discard" for r in rows),
        lineage=lineage,
    )
    return acc, []


def _validate(items: list[dict], rows: list[ReviewRow], review: Path, docs: list[Document]) -> list[str]:
    """The eval-set loader's problems with the new items, mapped back to the review's lines; a
    check from a reviewer's note (``assert[i]``) is said as the note of that row."""
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "items.jsonl"
        p.write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items), encoding="utf-8")
        try:
            load_evalset(p, docs)
        except EvalSetError as e:
            pat = re.compile(re.escape(str(p)) + r":(\d+)")
            out = []
            for msg in e.problems:
                m = pat.match(msg)
                if not m:
                    out.append(f"{review}:0: {msg}")
                    continue
                r = rows[int(m.group(1)) - 1]
                rest = msg[m.end() :]
                if rest.startswith(": assert["):
                    rest = f": note: {rest.removeprefix(': ')} (row {r.id}, from its never: entries)"
                out.append(f"{review}:{r.line}{rest}")
            return out
    return []
