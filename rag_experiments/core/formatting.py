"""Numbers as the CLIs and reports print them: one rule for decimals, signs and missing values."""

from __future__ import annotations

import math
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
