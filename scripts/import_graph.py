"""Print the structure figures of ``rag_experiments`` (issue 20): import cycles, in-function
imports of our own modules, ``run_pipeline`` arguments, string look-ups of stages, largest modules.

    python scripts/import_graph.py            # figures
    python scripts/import_graph.py --cycles   # also list each cycle's modules

Static (AST) only: nothing is imported. An edge ``a -> b`` is an import of ``b`` by ``a`` at
module level (class bodies and module-level ``if``/``try`` count; ``if TYPE_CHECKING:`` and
``if __name__ == "__main__":`` do not, see ``_never_imported``). ``from pkg import name`` points at ``pkg.name`` when that is a module, else at
``pkg``. The same walk with in-function imports added gives the "runtime" graph.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "rag_experiments"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    out = {}
    for p in sorted((root / PKG).rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _targets(node: ast.AST, module: str, is_pkg: bool, modules: dict) -> list[str]:
    """Our modules an Import/ImportFrom node names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = module.split(".") if is_pkg else module.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out: list[str] = []
    for n in names:
        while n and n not in modules:  # ``import a.b.c`` of a name inside a module
            n = n.rpartition(".")[0]
        if n.startswith(PKG) and n not in out:
            out.append(n)
    return out


def _never_imported(node: ast.If) -> bool:
    """``if TYPE_CHECKING:`` never runs; ``if __name__ == "__main__":`` runs only as ``__main__``,
    a different module object, so its imports close no cycle."""
    t = node.test
    if isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__":
        return True
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, path: Path, modules: dict) -> tuple[set[str], list[tuple[str, int]]]:
    """(module-top imports, [(in-function import, line)]) of one module, our package only."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    top: set[str] = set()
    inner: list[tuple[str, int]] = []

    def walk(node: ast.AST, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _never_imported(child):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                for t in _targets(child, module, is_pkg, modules):
                    if t == module:
                        continue
                    if in_func:
                        inner.append((t, child.lineno))
                    else:
                        top.add(t)
            func = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            walk(child, in_func or func)

    walk(tree, False)
    return top, inner


def graphs(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, list[tuple[str, int]]]]:
    """(module-top graph, in-function imports per module)."""
    modules = module_files(root)
    top, inner = {}, {}
    for m, p in modules.items():
        top[m], inner[m] = imports_of(m, p, modules)
    return top, inner


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(out)


def run_pipeline_args(root: Path = ROOT) -> tuple[str, int]:
    """The module that defines ``run_pipeline`` at its top level, and its number of arguments.

    Found by walking every module (it moved from the package root to ``run/``), so the figure
    follows the function wherever it lives; raises when no module defines it."""
    for m, p in module_files(root).items():
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name == "run_pipeline":
                a = node.args
                return m, len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
    raise LookupError(f"no module of {PKG} defines run_pipeline")


STAGE_NAMES = {
    "corpus", "evalset", "chunker", "embedder", "retriever", "generator", "prompt", "judge",
}  # fmt: skip


def stage_lookups(root: Path = ROOT) -> list[tuple[str, int]]:
    """``stages["judge"]``-style look-ups: a string subscript or ``.get("…")`` of a stage name on
    a name/attribute called ``stages``/``st``."""
    found = []
    for m, p in module_files(root).items():
        for node in ast.walk(ast.parse(p.read_text())):
            key, obj = None, None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                key, obj = node.slice.value, node.value
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                key, obj = node.args[0].value, node.func.value
            name = getattr(obj, "id", None) or getattr(obj, "attr", None)
            if key in STAGE_NAMES and name in ("stages", "st"):
                found.append((m, node.lineno))
    return found


def largest(root: Path = ROOT, n: int = 8) -> list[tuple[int, str]]:
    sizes = [(len(p.read_text().splitlines()), m) for m, p in module_files(root).items()]
    return sorted(sizes, reverse=True)[:n]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", action="store_true", help="list the modules of each cycle")
    ap.add_argument("--inner", action="store_true", help="list the in-function imports")
    args = ap.parse_args(argv)
    top, inner = graphs()
    full = {m: top[m] | {t for t, _ in inner[m]} for m in top}
    c_top, c_full = cycles(top), cycles(full)
    n_inner = sum(len(v) for v in inner.values())
    print(f"modules: {len(top)}")
    print(f"import cycles (module-top imports): {len(c_top)}")
    print(f"import cycles (with in-function imports): {len(c_full)}")
    if args.cycles:
        for c in c_full:
            print("  cycle:", " <-> ".join(c), "(module-top)" if c in c_top else "")
    print(f"in-function imports of our own modules: {n_inner}")
    by_mod = sorted(((len(v), m) for m, v in inner.items() if v), reverse=True)[:5]
    print("  most:", ", ".join(f"{m} {n}" for n, m in by_mod))
    if args.inner:
        for m, v in sorted(inner.items()):
            for t, line in v:
                print(f"  {m}:{line} -> {t}")
    where, n_args = run_pipeline_args()
    print(f"run_pipeline arguments: {n_args} ({where})")
    looks = stage_lookups()
    print(f"string look-ups of stages: {len(looks)}")
    print("largest modules (lines):", ", ".join(f"{m} {n}" for n, m in largest()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
