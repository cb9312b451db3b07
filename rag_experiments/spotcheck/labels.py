"""Reading the filled label CSV: every malformed row named as ``FILE:LINE: field: what is wrong``."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from rag_experiments.evalset.csv_text import LabelFileError, _open_text, _records  # noqa: F401  (re-exported)

REQUIRED = ("item_id", "claim", "human_verdict")
HUMAN_LABELS = ("supported", "unsupported")


@dataclass
class Labels:
    """The labelled rows of a filled CSV, checked against the run's judged claims."""

    rows: pd.DataFrame  # item_id, claim, human (lower-case), judge (the run's verdict), score, pi
    n_blank: int
    path: Path
    weighted: bool = False  # the file has inclusion probabilities (rows' ``pi``)
    n_population: int = 0  # the run's judged claims with a parseable verdict


def _inclusion_prob(raw: str | None, where: str) -> tuple[float, str | None]:
    """(π, problem): π must be a number in (0, 1]; NaN when the file has no such column."""
    if raw is None:
        return float("nan"), None
    try:
        pi = float(raw)
    except ValueError:
        pi = float("nan")
    if not 0 < pi <= 1:
        return pi, f"{where}: inclusion_prob: {raw!r} is not a probability in (0, 1] (keep the sampled value)"
    return pi, None


def _ws(text: str) -> str:
    return " ".join(text.split())  # spreadsheets re-wrap long cells


def _read_header(reader, name: str) -> list[str]:
    """The header's column names (stripped); a missing :data:`REQUIRED` column → :class:`LabelFileError`."""
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise LabelFileError(
            [
                f"{name}:1: {c}: missing column (the header has: {', '.join(header) or 'nothing'})"
                for c in missing
            ]
        )
    return header


def _labelled_row(
    rec: dict[str, str], where: str, by_id: pd.DataFrame, seen: dict[str, int | str]
) -> tuple[dict | None, str | None]:
    """(row, problem) of one record; both None for a blank ``human_verdict`` (skipped and counted).

    A row must carry a known label, a judged claim of the run (same text up to whitespace) not
    labelled before (``seen``: item_id → line) and, when the column exists, its inclusion_prob.
    """
    iid = (rec.get("item_id") or "").strip()
    human = (rec.get("human_verdict") or "").strip().lower()
    if not human:
        return None, None
    if human not in HUMAN_LABELS:
        return None, (
            f"{where}: human_verdict: {rec.get('human_verdict')!r} is not one of {', '.join(HUMAN_LABELS)}"
        )
    if iid not in by_id.index:
        return None, f"{where}: item_id: {iid!r} is not a judged claim of the run"
    if _ws(rec.get("claim") or "") != _ws(str(by_id.at[iid, "claim"])):
        return None, (
            f"{where}: claim: does not match the run's claim {iid} ({str(by_id.at[iid, 'claim'])[:80]!r})"
        )
    if iid in seen:
        at = f"on line {seen[iid]}" if isinstance(seen[iid], int) else f"at {seen[iid]}"
        return None, f"{where}: item_id: {iid!r} already labelled {at}"
    pi, problem = _inclusion_prob(rec.get("inclusion_prob"), where)
    if problem:
        return None, problem
    row = {
        "item_id": iid,
        "claim": by_id.at[iid, "claim"],
        "human": human,
        "judge": str(by_id.at[iid, "judge_verdict"]),
        "score": by_id.at[iid, "judge_score"],
        "pi": pi,
    }
    return row, None


def read_labels(path: Path, claims: pd.DataFrame) -> Labels:
    """Parse and validate the filled CSV against the run's judged claims.

    Every bad row is reported (one :class:`LabelFileError` with all problems); a file with no
    labelled row is an error too: scoring nothing is not a result.
    """
    name = str(path)
    by_id = claims.set_index("item_id")
    rows, problems, n_blank, seen = [], [], 0, {}
    with _open_text(path) as f:
        reader = csv.reader(f, strict=True)  # an unclosed quote is an error, not a field to EOF
        header = _read_header(reader, name)
        for line, values in _records(reader, name, problems):
            if len(values) > len(header):
                problems.append(f"{name}:{line}: row: {len(values)} fields, the header has {len(header)}")
                continue
            rec = dict(zip(header, values, strict=False))
            n_blank += _take(rec, f"{name}:{line}", line, by_id, seen, rows, problems)
    return _labels(rows, problems, n_blank, path, claims, weighted="inclusion_prob" in header)


def _take(
    rec: dict[str, str], where: str, mark: int | str, by_id: pd.DataFrame, seen: dict, rows: list, problems: list
) -> int:
    """Check one label record (:func:`_labelled_row`): a labelled row joins ``rows`` (``seen``
    remembers it as ``mark``), a problem joins ``problems``; 1 when the row is blank, else 0."""
    row, problem = _labelled_row(rec, where, by_id, seen)
    if problem:
        problems.append(problem)
    elif row is not None:
        seen[row["item_id"]] = mark
        rows.append(row)
    return int(problem is None and row is None)


def _labels(
    rows: list[dict], problems: list[str], n_blank: int, path: Path, claims: pd.DataFrame, weighted: bool
) -> Labels:
    """The checked rows as :class:`Labels`; any problem, or no labelled row, → :class:`LabelFileError`."""
    if problems:
        raise LabelFileError(problems)
    if not rows:
        raise LabelFileError(
            [
                f"{path}: human_verdict: no claim labelled ({n_blank} blank rows); fill in supported / unsupported"
            ]
        )
    df = pd.DataFrame(rows, columns=["item_id", "claim", "human", "judge", "score", "pi"])
    n_pop = int(claims["judge_verdict"].isin(HUMAN_LABELS).sum())
    return Labels(df, n_blank, path, weighted=weighted, n_population=n_pop)


def labels_from_records(
    records: Iterable[tuple[str, dict[str, str]]], claims: pd.DataFrame, source: Path, weighted: bool
) -> Labels:
    """:func:`read_labels` for label records read elsewhere (a review queue in MLflow): each
    ``(where, record)`` has the CSV's fields and is checked by the same rules, problems named by
    ``where``."""
    by_id = claims.set_index("item_id")
    rows, problems, n_blank, seen = [], [], 0, {}
    for where, rec in records:
        n_blank += _take(rec, where, where, by_id, seen, rows, problems)
    return _labels(rows, problems, n_blank, source, claims, weighted)
