"""Size rules for ``rag_experiments/``: no function over 80 lines; no module over 500 lines unless its
docstring says why in a sentence of its own ("Why this module is long: ...").

A function's length runs from its first decorator (or ``def``) to its last line, docstring included.
The failure message names every offender; there is no allow-list: a long module justifies itself in
its own header, where a reader sees it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from tests.sweep_helpers import REPO

PACKAGE = REPO / "rag_experiments"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500
#: "Why this module is long: ..." or "Why one module of ~880 lines: ...".
WHY_LONG = re.compile(r"\bWhy (?:this|one) module\b[^.]*?\b(?:is long|lines)\b")


def function_lengths(source: str) -> Iterator[tuple[str, int, int]]:
    """(qualified name, first line, length in lines) of every function and method in ``source``."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            name = f"{prefix}{getattr(child, 'name', '')}"
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                yield name, first, child.end_lineno - first + 1
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(source), "")


def module_problem(source: str) -> str | None:
    """Why a module breaks the size rule (None when it keeps it)."""
    n = len(source.splitlines())
    if n <= MAX_MODULE_LINES:
        return None
    if WHY_LONG.search(ast.get_docstring(ast.parse(source)) or ""):
        return None
    return f"{n} lines and no 'Why this module is long: ...' sentence in its docstring"


def _sources() -> list[tuple[str, str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 30, "the package's modules were not found"
    return [(str(p.relative_to(REPO)), p.read_text(encoding="utf-8")) for p in files]


def test_no_function_over_80_lines():
    long = [
        f"{path}:{line} {name} ({n} lines)"
        for path, src in _sources()
        for name, line, n in function_lengths(src)
        if n > MAX_FUNCTION_LINES
    ]
    assert not long, (
        f"functions over {MAX_FUNCTION_LINES} lines; split them into named pieces:\n" + "\n".join(long)
    )


def test_no_module_over_500_lines_without_saying_why():
    long = [f"{path}: {why}" for path, src in _sources() if (why := module_problem(src))]
    assert not long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(long)


def test_the_measures_catch_what_they_should():
    body = "".join(f"    x{i} = {i}\n" for i in range(79))
    src = f"@decorator\ndef f():\n{body}\n\nclass C:\n    def m(self):\n        async def inner():\n            pass\n"
    lengths = {name: n for name, _, n in function_lengths(src)}
    assert lengths == {"f": 81, "C.m": 3, "C.m.inner": 2}
    filler = "x = 1\n" * MAX_MODULE_LINES
    assert module_problem('"""Short."""\n' + filler).startswith(f"{MAX_MODULE_LINES + 1} lines")
    assert module_problem('"""Long.\n\nWhy this module is long: one table."""\n' + filler) is None
    assert module_problem('"""Long.\n\nWhy one module of ~880 lines: one contract."""\n' + filler) is None
    assert module_problem(filler) is None
