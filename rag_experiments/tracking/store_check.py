"""Is a SQLite tracking store's file intact? Asked where a lookup came back empty, so that garbage
in the pages of the runs table or its indexes reads as "store corrupt", not as "unknown run"
(issue 31 item 12). Standard library only, so any module can ask (no import cycle through
``tracking.errors``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def _path(uri: str) -> Path:
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:limit]


def sqlite_corruption(uri: str | None) -> str | None:
    """What SQLite's ``PRAGMA quick_check`` finds wrong with a ``sqlite:///`` store's file (its first
    line; "file is not a database" for garbage in the header), None when the check passes, the file
    does not exist or the store is not SQLite. Read-only, O(file size): asked only where a lookup
    came back empty, to tell "no such run" from "the page holding it is damaged"."""
    if not uri or not uri.startswith("sqlite:///"):
        return None
    path = _path(uri)
    if not path.is_file():
        return None
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            rows = con.execute("PRAGMA quick_check(5)").fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:  # a damaged header or schema page: not even readable
        return _first_line(e)
    # each row may start with "*** in database main ***" before the page it names
    lines = [ln for r in rows if r and r[0] != "ok" for ln in str(r[0]).splitlines() if not ln.startswith("***")]
    return lines[0][:200] if lines else None


def store_corrupt_message(uri: str | None, answer: str) -> str | None:
    """"store corrupt" instead of ``answer`` (e.g. "unknown run 'x'") when the sqlite store's file
    fails ``PRAGMA quick_check``; None when it passes (then ``answer`` stands)."""
    bad = sqlite_corruption(uri)
    if bad is None:
        return None
    return (
        f"store corrupt: tracking store {uri} (file {_path(uri).resolve()}) fails SQLite's integrity "
        f"check ({bad}), so {answer!r} may only mean the page holding it is damaged. Restore the file from a backup (`sqlite3 FILE .recover` "
        "salvages what is readable), or point --tracking-uri elsewhere."
    )
