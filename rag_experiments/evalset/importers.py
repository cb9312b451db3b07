"""Importers for eval sets from the ecosystem (SQuAD v1.1 JSON, BEIR directories), converted once.

Real files are not always self-consistent: public SQuAD-format sets carry ``answer_start`` offsets
that do not hold the answer text, and BEIR qrels can name documents missing from the corpus. The
importers repair what can be repaired, drop what cannot, and say so (:class:`ImportReport`, one
note per repair or drop naming the item); the CLI's ``--strict`` refuses the import instead.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ImportReport:
    """What an importer did with each gold reference (answer or qrel)."""

    kept: int = 0  # used as given
    repaired: int = 0  # moved to where its text actually is
    dropped: int = 0  # could not be found; left out
    dropped_items: int = 0  # items left with no evidence at all, so left out
    notes: list[str] = field(default_factory=list)  # one line per repair or drop, naming the item

    def summary(self, what: str) -> str:
        return f"{what}: kept {self.kept}, repaired {self.repaired}, dropped {self.dropped}" + (
            f" ({self.dropped_items} items left without evidence were dropped)" if self.dropped_items else ""
        )


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_") or "doc"


def _ws_find_all(text: str, needle: str) -> list[tuple[int, int]]:
    """Spans of ``text`` equal to ``needle`` after collapsing whitespace runs in both."""
    words = needle.split()
    if not words:
        return []
    pattern = r"\s+".join(re.escape(w) for w in words)
    return [(m.start(), m.end()) for m in re.finditer(pattern, text)]


def locate_answer(context: str, answer: str, start: int) -> tuple[int, int] | None:
    """Where ``answer`` is in ``context``: at ``start`` if it is there, else the occurrence nearest
    to ``start`` (exact, then whitespace-insensitive); None when it is nowhere."""
    if answer and context[start : start + len(answer)] == answer:
        return start, start + len(answer)
    exact = [(m.start(), m.start() + len(answer)) for m in re.finditer(re.escape(answer), context)]
    found = exact if answer else []
    found = found or _ws_find_all(context, answer)
    if not found:
        return None
    return min(found, key=lambda se: (abs(se[0] - start), se[0]))


def _merge(spans: list[tuple[int, int]]) -> list[list[int]]:
    merged: list[list[int]] = []
    for s, e in sorted(set(spans)):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def import_squad(squad_json: str | Path) -> tuple[list[dict], list[dict], ImportReport]:
    """SQuAD v1.1 → (corpus rows, eval rows, report).

    Paragraphs of one article are joined with a blank line into one document; every answer span
    becomes offset evidence (overlapping answers of one question merged into one span); the
    distinct answer texts found become ``gold_answers`` (answer F1 / exact match take the best),
    the first of them ``gold_answer`` and the one ``key_facts`` entry. A misaligned answer is moved to the
    occurrence of its text nearest to ``answer_start`` (:func:`locate_answer`); one that occurs
    nowhere in its paragraph is dropped, and so is a question left with no answer.
    """
    data = json.loads(Path(squad_json).read_text(encoding="utf-8"))["data"]
    rep = ImportReport()
    corpus, evals, used = [], [], Counter()
    for article in data:
        base = _slug(article.get("title", "article"))
        used[base] += 1
        doc_id = base if used[base] == 1 else f"{base}_{used[base]}"
        parts, offsets, pos = [], [], 0
        for p in article["paragraphs"]:
            offsets.append(pos)
            parts.append(p["context"])
            pos += len(p["context"]) + 2
        text = "\n\n".join(parts)
        corpus.append({"doc_id": doc_id, "title": article.get("title", doc_id), "text": text})
        for p, base_off in zip(article["paragraphs"], offsets, strict=True):
            for qa in p["qas"]:
                item = _squad_item(qa, p["context"], base_off, doc_id, text, rep, squad_json)
                if item is not None:
                    evals.append(item)
    return corpus, evals, rep


def _squad_item(qa, context, base_off, doc_id, text, rep, src) -> dict | None:
    spans, answers = [], []
    for j, a in enumerate(qa["answers"]):
        start, ans = int(a["answer_start"]), a["text"]
        where = f"{src}: question {qa['id']}: answers[{j}]"
        se = locate_answer(context, ans, start) if ans.strip() else None
        if se is None:
            rep.dropped += 1
            rep.notes.append(f"{where}: {ans!r} not found in its paragraph: dropped")
            continue
        if se[0] == start and se[1] - se[0] == len(ans):
            rep.kept += 1
        else:
            rep.repaired += 1
            rep.notes.append(f"{where}: answer_start {start} does not hold {ans!r}: moved to {se[0]}")
        s, e = se
        while s < e and context[s].isspace():  # evidence starts and ends on text
            s += 1
        while e > s and context[e - 1].isspace():
            e -= 1
        spans.append((base_off + s, base_off + e))
        answers.append(context[s:e])
    if not spans:
        rep.dropped_items += 1
        return None
    return _squad_row(qa, spans, answers, doc_id, text)


def _squad_row(qa, spans, answers, doc_id, text) -> dict:
    answers = list(dict.fromkeys(answers))
    return {
        "id": str(qa["id"]),
        "query": qa["question"],
        "gold_evidence": [
            {"doc_id": doc_id, "start": s, "end": e, "quote": text[s:e]} for s, e in _merge(spans)
        ],
        "gold_answer": answers[0] if answers else None,
        "gold_answers": answers,  # every distinct answer text: answer F1/EM take the best match
        "key_facts": answers[:1],
        "tags": ["squad"],
    }


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def import_beir(beir_dir: str | Path, split: str = "test") -> tuple[list[dict], list[dict], ImportReport]:
    """BEIR (corpus.jsonl, queries.jsonl, qrels/{split}.tsv) → (corpus rows, eval rows, report).

    BEIR judges whole documents, so each relevant document (score > 0) becomes one evidence span
    covering the whole document text. A qrel naming a document that is missing (or empty) is
    dropped and reported, and so is a query left with no relevant document or missing itself.
    """
    beir_dir = Path(beir_dir)
    corpus = [
        {"doc_id": str(r["_id"]), "title": r.get("title", ""), "text": r["text"]}
        for r in _read_jsonl(beir_dir / "corpus.jsonl")
    ]
    lengths = {d["doc_id"]: len(d["text"]) for d in corpus}
    queries = {str(r["_id"]): r["text"] for r in _read_jsonl(beir_dir / "queries.jsonl")}
    qrels_path = beir_dir / "qrels" / f"{split}.tsv"
    rep = ImportReport()
    qrels: dict[str, list[str]] = {}
    with qrels_path.open(encoding="utf-8") as f:
        for lineno, row in enumerate(csv.reader(f, delimiter="\t"), 1):
            if not row or row[0] in ("query-id", "query_id"):
                continue
            qid, did, score = row[0], row[1], float(row[2])
            if score <= 0:
                continue
            where = f"{qrels_path}:{lineno}: query {qid}"
            if qid not in queries:
                rep.dropped += 1
                rep.notes.append(f"{where}: query not in queries.jsonl: dropped")
            elif not lengths.get(did):
                rep.dropped += 1
                why = "not in corpus.jsonl" if did not in lengths else "empty"
                rep.notes.append(f"{where}: document {did!r} {why}: dropped")
            else:
                rep.kept += 1
                qrels.setdefault(qid, []).append(did)
    evals = [
        {
            "id": qid,
            "query": queries[qid],
            "gold_evidence": [{"doc_id": d, "start": 0, "end": lengths[d]} for d in dict.fromkeys(dids)],
            "key_facts": [],
            "tags": ["beir"],
        }
        for qid, dids in qrels.items()
    ]
    return corpus, evals, rep


_MTRAG_ROLES = {"user": "user", "agent": "assistant", "assistant": "assistant"}


def _label(v) -> str:
    """MTRAG's one-element list labels (``["ANSWERABLE"]``) as one lower-case string."""
    v = v[0] if isinstance(v, list) and v else v
    return str(v or "").strip().lower()


def import_mtrag(tasks_jsonl: str | Path) -> tuple[list[dict], list[dict], ImportReport]:
    """MTRAG / MTRAG-UN generation tasks (JSONL, one evaluated turn per line) → (corpus rows, eval
    rows, report); docs/conversations.md.

    Each turn becomes an item ``<conversation_id>#<turn>`` (compare, gate and select pair by it):
    ``input`` → ``history`` (``agent`` → ``assistant``) and ``query`` (its last user turn),
    ``targets[0]`` → ``gold_answer``, ``answerability`` lower-cased, ``Multi-Turn: N/A`` →
    ``standalone: true``, ``Collection`` → a tag. Every reference passage (``contexts``) becomes a
    corpus document (its ``document_id``) and one evidence span over its text. An unanswerable or
    underspecified turn keeps no gold: its passages stay in the corpus but are dropped as evidence
    and reported (the turn stays, tagged ``unanswerable``). A ``turn`` that disagrees with the
    history's user turns is repaired to them; a passage whose id was seen with another text, and
    an input not ending with a user turn, are dropped; an answerable or partial turn left without
    passages is dropped.
    """
    src = Path(tasks_jsonl)
    rep = ImportReport()
    docs: dict[str, str] = {}
    evals: list[dict] = []
    for lineno, line in enumerate(src.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        task = json.loads(line)
        where = f"{src}:{lineno}: task {task.get('task_id', '?')}"
        turns = [
            (_MTRAG_ROLES.get(str(m.get("speaker")), ""), str(m.get("text") or "").strip())
            for m in task["input"]
        ]
        if not turns or turns[-1][0] != "user" or any(not r or not t for r, t in turns):
            rep.dropped_items += 1
            rep.notes.append(
                f"{where}: input does not end with a user turn (or has an unknown speaker or empty text): dropped"
            )
            continue
        history = [{"role": r, "text": t} for r, t in turns[:-1]]
        turn = 1 + sum(r == "user" for r, _ in turns[:-1])
        if str(task.get("turn")) != str(turn):
            rep.repaired += 1
            rep.notes.append(
                f"{where}: turn {task.get('turn')!r} but {turn - 1} earlier user turns: set to {turn}"
            )
        answerability = _label(task.get("answerability")) or "answerable"
        evidence = _mtrag_evidence(task.get("contexts") or [], answerability, where, docs, rep)
        if not evidence and answerability not in ("unanswerable", "underspecified"):
            rep.dropped_items += 1
            rep.notes.append(f"{where}: an {answerability} turn with no reference passage: dropped")
            continue
        targets = [t for t in task.get("targets") or [] if str(t.get("text") or "").strip()]
        collection = _slug(str(task.get("Collection") or "")).lower()
        evals.append({
            "id": f"{task['conversation_id']}#{turn}",
            "query": turns[-1][1],
            "gold_evidence": evidence,
            "gold_answer": targets[0]["text"].strip() if targets else None,
            "key_facts": [],
            "tags": ([collection] if task.get("Collection") else []) + ([] if evidence else ["unanswerable"]),
            "history": history,
            "answerability": answerability,
            "turn": turn,
            "conversation_id": str(task["conversation_id"]),
            "standalone": _label(task.get("Multi-Turn")) in ("n/a", ""),
        })  # fmt: skip
    corpus = [{"doc_id": d, "title": "", "text": t} for d, t in docs.items()]
    return corpus, evals, rep


def _mtrag_evidence(
    contexts: list, answerability: str, where: str, docs: dict[str, str], rep: ImportReport
) -> list:
    """One turn's reference passages → evidence spans over their text (one per document); every
    passage joins ``docs``; an unanswerable or underspecified turn's are dropped as evidence."""
    evidence = {}
    for j, c in enumerate(contexts):
        did, text = str(c.get("document_id") or ""), str(c.get("text") or "")
        w = f"{where}: contexts[{j}] {did!r}"
        if answerability in ("unanswerable", "underspecified"):
            if did and text.strip():  # still a passage of the corpus, searched by every turn
                docs.setdefault(did, text)
            rep.dropped += 1
            rep.notes.append(f"{w}: an {answerability} turn keeps no gold evidence: dropped")
        elif not did or not text.strip():
            rep.dropped += 1
            rep.notes.append(f"{w}: no document id or empty text: dropped")
        elif docs.setdefault(did, text) != text:
            rep.dropped += 1
            rep.notes.append(f"{w}: another text under the same document id: dropped")
        else:
            rep.kept += 1
            evidence[did] = {
                "doc_id": did,
                "start": len(text) - len(text.lstrip()),
                "end": len(text.rstrip()),
            }
    return list(evidence.values())
