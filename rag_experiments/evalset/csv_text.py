"""Reading a hand-filled CSV (spot-check labels, label files for the judge): its text and its
records, with every problem named ``FILE:LINE: field: what is wrong``."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path


class LabelFileError(Exception):
    """A malformed label file; ``problems`` are ``FILE:LINE: field: what is wrong`` lines."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _open_text(path: Path) -> io.StringIO:
    """The file's text (UTF-8, a BOM dropped); unreadable or undecodable → :class:`LabelFileError`."""
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise LabelFileError([f"{name}:0: file: cannot read ({e.strerror})"]) from None
    try:
        return io.StringIO(raw.decode("utf-8-sig"), newline="")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise LabelFileError(
            [f"{name}:{line}: file: not valid UTF-8 ({e.reason} at byte {e.start})"]
        ) from None


def _records(reader, name: str, problems: list[str]) -> Iterator[tuple[int, list[str]]]:
    """(line, values) of every non-blank record, ``line`` where it starts (a quoted field may span
    lines). Broken CSV stops the read: :class:`LabelFileError` with ``problems`` found so far."""
    while True:
        line = reader.line_num + 1
        try:
            values = next(reader, None)
        except csv.Error as e:
            raise LabelFileError([*problems, f"{name}:{line}: row: not valid CSV ({e})"]) from None
        if values is None:
            return
        if values and any(v.strip() for v in values):
            yield line, values


def numbered_rows(reader, path, problems: list[str]) -> Iterator[tuple[int, list[str]]]:
    """``(line, values)`` of every non-blank row a ``csv.reader`` gives after its header; a row the
    CSV parser rejects ends the file with a ``FILE:LINE: row: not valid CSV`` problem."""
    while True:
        line = reader.line_num + 1
        try:
            values = next(reader, None)
        except csv.Error as e:
            problems.append(f"{path}:{line}: row: not valid CSV ({e})")
            return
        if values is None:
            return
        if any(v.strip() for v in values):
            yield line, values
