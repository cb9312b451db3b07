"""Conversations in an eval set: the fields of a turn, their checks and the tags they add
(docs/conversations.md).

An item is one turn. Besides ``query`` (the last user turn) it may carry ``history`` (the earlier
turns, ``[{"role": "user" | "assistant", "text": ...}]``), ``standalone_query`` (a human rewrite,
what ``history=oracle`` searches), ``answerability`` (:data:`ANSWERABILITY`), ``turn`` (1 = the
first user turn), ``conversation_id`` and ``standalone`` (true: the question needs no earlier
turn; by default a turn is standalone when it has no history, or when its ``standalone_query``
is the question itself). An item without any of them is a conversation of one turn, unchanged:
no field is added to it, so existing eval sets keep their digests.

A turn's tags (added at load, never written to the file) carry the breakdowns: ``turn:1``,
``turn:2``, ``turn:3plus``, ``answerability:<label>`` and ``standalone:yes|no``, so every metric is
logged per turn index, answerability and standalone-or-not as ``by_tag/<tag>/<metric>``.
"""

from __future__ import annotations

from rag_experiments.core.types import EvalItem

ANSWERABILITY = ("answerable", "unanswerable", "underspecified", "partial")
NO_GOLD = ("unanswerable", "underspecified")  # such a turn has no gold evidence
ROLES = ("user", "assistant")
FIELDS: dict[str, type] = {
    "history": list,
    "standalone_query": str,
    "answerability": str,
    "turn": int,
    "conversation_id": str,
    "standalone": bool,
}


def is_turn(row: dict) -> bool:
    """True when the row carries any conversation field."""
    return any(row.get(k) is not None for k in FIELDS)


def row_problems(row: dict, where: str) -> list[str]:
    """The conversation fields of one row, each problem as ``FILE:LINE: field: what``."""
    problems = []
    for name, typ in FIELDS.items():
        v = row.get(name)
        if v is not None and (not isinstance(v, typ) or (typ is int and isinstance(v, bool))):
            problems.append(f"{where}: {name}: expected {typ.__name__}, got {type(v).__name__}")
    if problems:
        return problems
    history = row.get("history") or []
    for j, t in enumerate(history):
        w = f"{where}: history[{j}]"
        if not isinstance(t, dict):
            problems.append(f"{w}: expected an object with role and text")
            continue
        if t.get("role") not in ROLES:
            problems.append(f"{w}.role: must be 'user' or 'assistant', got {t.get('role')!r}")
        if not isinstance(t.get("text"), str) or not t["text"].strip():
            problems.append(f"{w}.text: must be a non-empty string")
        if "\x00" in str(t.get("text", "")):
            problems.append(f"{w}.text: contains a NUL character (U+0000)")
        if set(t) - {"role", "text"}:
            problems.append(f"{w}: unknown keys {sorted(set(t) - {'role', 'text'})} (only role and text)")
    if history and isinstance(history[0], dict) and history[0].get("role") != "user":
        problems.append(f"{where}: history[0].role: a conversation starts with a user turn")
    turn = row.get("turn")
    if turn is not None:
        users = sum(1 for t in history if isinstance(t, dict) and t.get("role") == "user")
        if turn < 1:
            problems.append(f"{where}: turn: must be >= 1, got {turn}")
        elif turn != users + 1:
            problems.append(
                f"{where}: turn: {turn}, but the history holds {users} user turns (expected turn {users + 1})"
            )
    sq = row.get("standalone_query")
    if sq is not None and not sq.strip():
        problems.append(f"{where}: standalone_query: empty")
    label = row.get("answerability")
    if label is not None and label not in ANSWERABILITY:
        problems.append(f"{where}: answerability: {label!r} is not one of {', '.join(ANSWERABILITY)}")
    if label in NO_GOLD and (row.get("gold_evidence") or row.get("gold_chunk_ids")):
        problems.append(
            f"{where}: gold_evidence: an {label} turn has no gold evidence (drop it or relabel the turn)"
        )
    return problems


def _turn_index(item: EvalItem) -> int:
    return item.turn if item.turn is not None else 1 + sum(1 for t in item.history if t["role"] == "user")


def turn_tags(row: dict, item: EvalItem) -> list[str]:
    """The breakdown tags of a turn (module docstring); [] for an item that is no turn."""
    if not is_turn(row):
        return []
    n = _turn_index(item)
    tags = [f"turn:{n}" if n < 3 else "turn:3plus"]
    if item.answerability:
        tags.append(f"answerability:{item.answerability}")
    standalone = row.get("standalone")
    if standalone is None:
        sq = " ".join((item.standalone_query or "").split()).lower()
        standalone = not item.history or sq == " ".join(item.query.split()).lower()
    tags.append("standalone:yes" if standalone else "standalone:no")
    return [t for t in tags if t not in item.tags]


def conversation_problems(items: list[EvalItem], path: str) -> list[str]:
    """Across the turns of each conversation: one item per turn number, and a later turn's
    history beginning with an earlier turn's history and question (``FILE:LINE`` of the later)."""
    problems = []
    seen: dict[tuple[str, int], EvalItem] = {}
    by_conv: dict[str, list[EvalItem]] = {}
    for it in items:
        if it.conversation_id is None:
            continue
        n = _turn_index(it)
        if (it.conversation_id, n) in seen:
            first = seen[(it.conversation_id, n)]
            problems.append(f"{path}:{it.line}: turn: conversation {it.conversation_id!r} has turn {n} twice "
                            f"(first on line {first.line})")  # fmt: skip
            continue
        seen[(it.conversation_id, n)] = it
        by_conv.setdefault(it.conversation_id, []).append(it)
    for turns in by_conv.values():
        turns.sort(key=_turn_index)
        for a, b in zip(turns, turns[1:], strict=False):
            before = [(t["role"], " ".join(t["text"].split())) for t in a.history] + [
                ("user", " ".join(a.query.split()))
            ]
            after = [(t["role"], " ".join(t["text"].split())) for t in b.history]
            if after[: len(before)] != before:
                problems.append(f"{path}:{b.line}: history: does not begin with turn {_turn_index(a)}'s "
                                f"history and question (line {a.line}) of conversation {b.conversation_id!r}")  # fmt: skip
    return problems
