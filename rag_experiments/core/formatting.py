"""Numbers as the CLIs and reports print them: one rule for decimals, signs and missing values."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def fmt_num(x: Any, nd: int = 4, signed: bool = False, missing: str = "–", width: int = 0) -> str:
    """``x`` with ``nd`` decimals (``+`` sign if ``signed``), right-aligned to ``width``; None and
    NaN print as ``missing``. A value that is not a number is printed as it is."""
    if x is None:
        return f"{missing:>{width}}"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(v):
        return f"{missing:>{width}}"
    return f"{v:+{width}.{nd}f}" if signed else f"{v:{width}.{nd}f}"


def fmt_p(p: Any) -> str:
    """A p-value: 4 decimals, ``<1e-4`` below that, ``–`` when missing."""
    if p is None or math.isnan(v := float(p)):
        return "–"
    return "<1e-4" if v < 1e-4 else f"{v:.4f}"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    esc = [[str(c).replace("|", "\\|").replace("\n", " ") for c in row] for row in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in esc]
    return "\n".join(lines)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    cols = list(zip(*([list(headers)] + [list(map(str, r)) for r in rows]), strict=True))
    widths = [max(len(c) for c in col) for col in cols]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(out)


#: Width of a terminal table before its columns continue in a further block (pandas' habit).
TEXT_WIDTH = 120


def text_blocks(
    headers: Sequence[str], rows: Sequence[Sequence[str]], keep: int = 1, width: int = TEXT_WIDTH
) -> str:
    """:func:`text_table`, its columns split into blocks no wider than ``width`` (when possible);
    every block repeats the first ``keep`` columns (the row labels). Deterministic: no terminal query."""
    rows = [list(map(str, r)) for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    fixed = sum(widths[:keep]) + 2 * keep
    blocks: list[list[int]] = [[]]
    used = fixed
    for i in range(keep, len(headers)):
        if blocks[-1] and used + widths[i] > width:
            blocks.append([])
            used = fixed
        blocks[-1].append(i)
        used += widths[i] + 2
    out = []
    for cols in blocks:
        idx = list(range(keep)) + cols
        out.append(text_table([headers[i] for i in idx], [[r[i] for i in idx] for r in rows]))
    return "\n\n".join(out)
