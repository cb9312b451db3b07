"""Labelled (claim, evidence) pairs for measuring and fitting faithfulness judges.

One JSON object per line, the ``judge_pairs`` format: ``id``, ``claim``, ``context``, ``label``
(``supported`` | ``unsupported``), optional ``type`` (what kind of pair: ``support_evidence``,
``contradict_evidence``, a perturbation name, ...), optional ``group`` (pairs sharing a group are
never split across cross-validation folds; default: the normalised claim text) and ``source``.
Every problem is reported as ``FILE:LINE: what is wrong`` (:class:`JudgePairsError`), all at once.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from rag_experiments.evalset.csv_text import LabelFileError, _open_text

LABELS = ("supported", "unsupported")
_WS = re.compile(r"\s+")


class JudgePairsError(ValueError):
    """A pairs file that cannot be used; the message lists every problem as ``FILE:LINE: ...``."""


@dataclass(frozen=True)
class JudgePair:
    id: str
    claim: str
    context: str
    label: str  # "supported" | "unsupported"
    type: str = "unknown"
    group: str = ""  # cross-validation group; "" -> the normalised claim
    source: str = ""

    @property
    def group_key(self) -> str:
        return self.group or _WS.sub(" ", self.claim.strip().lower())


def load_pairs(path: str | Path) -> list[JudgePair]:
    """Read and validate a pairs file; raise :class:`JudgePairsError` naming ``FILE:LINE`` for each problem."""
    path = Path(path)
    if not path.is_file():
        raise JudgePairsError(f"{path}: no such pairs file")
    pairs: list[JudgePair] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    try:
        text = _open_text(path).getvalue()  # undecodable bytes: FILE:LINE, not a traceback
    except LabelFileError as e:
        raise JudgePairsError("\n".join(e.problems)) from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"{where}: not valid JSON ({e.msg})")
            continue
        if not isinstance(row, dict):
            problems.append(f"{where}: expected a JSON object")
            continue
        pid, claim, context, label = (row.get(k) for k in ("id", "claim", "context", "label"))
        bad = []
        if not isinstance(pid, str) or not pid.strip():
            bad.append("missing or empty 'id'")
        elif pid in seen:
            bad.append(f"duplicate id {pid!r} (first on line {seen[pid]})")
        if not isinstance(claim, str) or not claim.strip():
            bad.append("empty 'claim'")
        if not isinstance(context, str) or not context.strip():
            bad.append("missing evidence: empty 'context'")
        if label not in LABELS:
            bad.append(f"unknown label {label!r} (expected one of {', '.join(LABELS)})")
        if bad:
            problems.extend(f"{where}: {b}" for b in bad)
            continue
        seen[pid] = lineno
        pairs.append(
            JudgePair(
                id=pid, claim=claim, context=context, label=label, type=str(row.get("type") or "unknown"),
                group=str(row.get("group") or ""), source=str(row.get("source") or ""),
            )
        )
    if problems:
        raise JudgePairsError("\n".join(problems))
    if not pairs:
        raise JudgePairsError(f"{path}: no pairs")
    return pairs


def pairs_digest(pairs: list[JudgePair]) -> str:
    """sha256 over the canonical JSON of the pairs (id, claim, context, label, type), order-independent."""
    rows = sorted((p.id, p.claim, p.context, p.label, p.type) for p in pairs)
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()
