"""A filled spot-check label CSV as verifier training pairs (``judge fit --labels FILE.csv``).

The CSV is the one ``python -m rag_experiments.spotcheck sample`` writes and a human fills in
(``spotcheck.claims.COLUMNS``): each labelled row (``human_verdict`` = supported | unsupported)
becomes a :class:`~.judge_pairs.JudgePair` of its ``claim`` against its ``context``. Rows left
blank are skipped (counted). The claims of one answer share a cross-validation group (the query
id, the part of ``item_id`` before ``#``): they come from one generation over one context.

Every problem is reported as ``FILE:LINE: field: what is wrong`` in one
:class:`~.judge_pairs.JudgePairsError` (the CLI exits 2): unknown label, empty claim, empty
context (a claim whose evidence is missing), a repeated item_id, a missing column, broken CSV.
"""

from __future__ import annotations

import csv
from pathlib import Path

from rag_experiments.evalset.csv_text import LabelFileError, _open_text, _records
from rag_experiments.evalset.judge_pairs import LABELS, JudgePair, JudgePairsError

REQUIRED = ("item_id", "claim", "context", "human_verdict")


def _row_pair(rec: dict[str, str], where: str, name: str) -> tuple[JudgePair | None, str | None]:
    """(pair, problem) of one record; both None for a row without a human verdict."""
    human = (rec.get("human_verdict") or "").strip().lower()
    if not human:
        return None, None
    iid = (rec.get("item_id") or "").strip()
    claim, context = (rec.get("claim") or "").strip(), (rec.get("context") or "").strip()
    if human not in LABELS:
        return None, f"{where}: human_verdict: {rec.get('human_verdict')!r} is not one of {', '.join(LABELS)}"
    if not iid:
        return None, f"{where}: item_id: empty"
    if not claim:
        return None, f"{where}: claim: empty"
    if not context:
        return None, f"{where}: context: empty: the claim's evidence is missing"
    group = f"{name}#{iid.rsplit('#', 1)[0]}"
    return JudgePair(f"{name}:{iid}", claim, context, human, "spotcheck", group, f"spotcheck:{name}"), None


def load_label_csv(path: str | Path) -> list[JudgePair]:
    """The labelled rows of a filled spot-check CSV as pairs (module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise JudgePairsError(f"{path}: no such label file")
    pairs, problems, seen = [], [], {}
    try:
        with _open_text(path) as f:
            reader = csv.reader(f, strict=True)
            header = [h.strip() for h in next(reader, [])]
            missing = [c for c in REQUIRED if c not in header]
            if missing:
                raise JudgePairsError(
                    "\n".join(f"{path}:1: {c}: missing column (the header has: {', '.join(header) or 'nothing'})"
                              for c in missing)
                )
            for line, values in _records(reader, str(path), problems):
                where = f"{path}:{line}"
                if len(values) > len(header):
                    problems.append(f"{where}: row: {len(values)} fields, the header has {len(header)}")
                    continue
                pair, problem = _row_pair(dict(zip(header, values, strict=False)), where, path.name)
                if problem:
                    problems.append(problem)
                elif pair is not None:
                    if pair.id in seen:
                        problems.append(f"{where}: item_id: already labelled on line {seen[pair.id]}")
                        continue
                    seen[pair.id] = line
                    pairs.append(pair)
    except LabelFileError as e:
        raise JudgePairsError("\n".join(e.problems)) from None
    if problems:
        raise JudgePairsError("\n".join(problems))
    if not pairs:
        raise JudgePairsError(f"{path}: human_verdict: no row labelled; fill in supported / unsupported")
    return pairs


def load_labels(path: str | Path) -> list[JudgePair]:
    """Training labels from a ``judge_pairs`` JSONL file or a filled spot-check ``.csv``."""
    if str(path).lower().endswith(".csv"):
        return load_label_csv(path)
    from rag_experiments.evalset.judge_pairs import load_pairs

    return load_pairs(path)


def training_label_problems(pairs: list, where: str) -> list[str]:
    """Why human labels cannot train a verifier ([] when they can): every label the same (one
    class: nothing to separate), or one (claim, context) labelled both supported and unsupported
    (the labels contradict themselves). ``where`` names the file in each problem."""
    if not pairs:
        return []
    problems = []
    labels = {p.label for p in pairs}
    if len(labels) == 1:
        problems.append(f"{where}: every one of the {len(pairs)} labels is {next(iter(labels))!r} (one class)")
    seen: dict[tuple[str, str], object] = {}
    for p in pairs:
        key = (" ".join(p.claim.split()).lower(), " ".join(p.context.split()))
        first = seen.setdefault(key, p)
        if first.label != p.label:
            problems.append(
                f"{where}: pairs {first.id!r} ({first.label}) and {p.id!r} ({p.label}) give the same claim "
                "and context opposite labels"
            )
    return problems
