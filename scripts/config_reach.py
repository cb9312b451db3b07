"""How far the Hydra config travels from the sweep entry (issue 28 item 3). Prints, asserts nothing.

    python scripts/config_reach.py            # the count and every place, by module

Static (AST) only. Starting from ``rag_experiments/run/sweep.py``, every module of the package it
reaches through imports (module-level and in-function, ``scripts/import_graph.py``) is read, and
each function (methods included) is a *place* when it

- has a parameter annotated ``DictConfig`` (or ``DictConfig | None`` …), or an unannotated
  parameter named ``cfg``, ``config`` or ``*_cfg`` (how the code names a Hydra node);
- reads such a name (``cfg.x``, ``cfg.get(…)``, ``job.cfg``);
- calls ``OmegaConf.*`` or ``HydraConfig.get()``.

A parameter annotated ``dict`` or ``Mapping`` (resolved plain data) is not the Hydra config, nor
are the few names the heuristic mistakes (:data:`NOT_CONFIG`, printed apart with the reason). Places in
``run/assemble.py`` and ``run/config_schema.py`` (assembly: where the config becomes typed values)
and in the Hydra entry (``run/sweep.py``'s ``main``/``cli``, the ``@hydra.main`` function, and
``run/multirun.py``, the callback Hydra hands the sweep's config to, and ``run/config_keys.py``,
which composes the command line's config to check its keys before Hydra runs) are counted apart: the figure
that matters is the count *below* assembly, which ``tests/test_layers.py`` holds at 0.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

START = "rag_experiments.run.sweep"
ASSEMBLY = {"rag_experiments/run/assemble.py", "rag_experiments/run/config_schema.py"}
ENTRY_FUNCTIONS = {("rag_experiments/run/sweep.py", "main"), ("rag_experiments/run/sweep.py", "cli")}
# the Hydra callback: Hydra calls it with the config; config_keys: the command line's keys, looked up
# in the config its group choices compose, before the entry hands over to Hydra
ENTRY_MODULES = {"rag_experiments/run/multirun.py", "rag_experiments/run/config_keys.py"}
CFG_NAMES = {"cfg", "config"}
#: (module, function): why the name the heuristic matched is not the Hydra config
NOT_CONFIG = {
    ("rag_experiments/core/identity.py", "semantic_config"): "cfg is the resolved config as plain data",
    ("rag_experiments/stages/rerank.py", "is_cross_encoder"): "cfg is the path of a model's config.json",
    ("rag_experiments/tracking/race_board.py", "Board.run_id"): "config is a racing peer's config_hash",
}


def _is_cfg_name(name: str) -> bool:
    return name in CFG_NAMES or name.endswith("_cfg")


def _annotation_text(a: ast.expr | None) -> str:
    return "" if a is None else ast.unparse(a)


def reachable(root: Path = ROOT, start: str = START) -> list[str]:
    """Modules reachable from ``start`` over module-level and in-function imports, sorted."""
    top, inner = import_graph.graphs(root)
    full = {m: top[m] | {t for t, _ in inner[m]} for m in top}
    seen, todo = {start}, [start]
    while todo:
        for t in full.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return sorted(seen)


def places_in(source: str) -> list[tuple[str, int, str]]:
    """(function, line, what) for every way a function of ``source`` receives or reads the config."""
    out: list[tuple[str, int, str]] = []
    tree = ast.parse(source)

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                out.extend((name, line, what) for line, what in _function_places(child))
                visit(child, f"{name}.")

    visit(tree, "")
    return out


def _function_places(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    a = fn.args
    plain: set[str] = set()  # cfg parameters annotated ``dict``: resolved containers, not the config
    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
        ann = _annotation_text(arg.annotation)
        if "DictConfig" in ann:
            found.append((arg.lineno, f"parameter {arg.arg}: {ann}"))
        elif _is_cfg_name(arg.arg):
            if ann.startswith(("dict", "Mapping")):
                plain.add(arg.arg)
            else:
                found.append((arg.lineno, f"parameter {arg.arg} (unannotated config)"))
    nested = {id(n) for c in ast.iter_child_nodes(fn) for n in ast.walk(c)
              if isinstance(c, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    for node in ast.walk(fn):
        if id(node) in nested:  # a nested function is its own place
            continue
        if isinstance(node, ast.Attribute):
            v = node.value
            if isinstance(v, ast.Name) and _is_cfg_name(v.id) and v.id not in plain:
                found.append((node.lineno, f"reads {v.id}.{node.attr}"))
            elif node.attr == "cfg" and not (isinstance(v, ast.Name) and v.id == "self"):
                found.append((node.lineno, f"reads {ast.unparse(node)}"))
            elif isinstance(v, ast.Name) and v.id == "OmegaConf":
                found.append((node.lineno, f"OmegaConf.{node.attr}"))
            elif isinstance(v, ast.Name) and v.id == "HydraConfig" and node.attr == "get":
                found.append((node.lineno, "HydraConfig.get()"))
    return sorted(set(found))


def classify(rel: str, function: str) -> str:
    if (rel, function) in NOT_CONFIG:
        return "not the config"
    if rel in ASSEMBLY:
        return "assembly"
    if rel in ENTRY_MODULES or (rel, function.split(".")[0]) in ENTRY_FUNCTIONS:
        return "entry"
    return "below"


def report(root: Path = ROOT) -> dict[str, dict[str, list[tuple[str, int, str]]]]:
    """{kind: {module path: [(function, line, what)]}}, kind: below / entry / assembly / not the config."""
    files = import_graph.module_files(root)
    out: dict[str, dict[str, list]] = {"below": {}, "entry": {}, "assembly": {}, "not the config": {}}
    for mod in reachable(root):
        path = files[mod]
        rel = path.relative_to(root).as_posix()
        for fn, line, what in places_in(path.read_text(encoding="utf-8")):
            out[classify(rel, fn)].setdefault(rel, []).append((fn, line, what))
    return out


def out_kinds(rep: dict) -> list[str]:
    return list(rep)


def main() -> int:
    rep = report()
    print(f"modules reachable from {START}: {len(reachable())}")
    for kind in out_kinds(rep):
        mods = rep[kind]
        fns = {(m, f) for m, ps in mods.items() for f, _, _ in ps}
        n = sum(len(ps) for ps in mods.values())
        print(f"\n== {kind}: {len(fns)} functions in {len(mods)} modules ({n} reads/parameters)")
        for m, ps in sorted(mods.items()):
            by_fn: dict[str, list[str]] = {}
            for f, line, what in ps:
                by_fn.setdefault(f, []).append(f"{line}: {what}")
            print(f"  {m}")
            for f, whats in by_fn.items():
                why = f"  [{NOT_CONFIG[(m, f)]}]" if (m, f) in NOT_CONFIG else ""
                print(f"    {f}: " + "; ".join(whats) + why)
    below = rep["below"]
    print(f"\nbelow assembly: {len({(m, f) for m, ps in below.items() for f, _, _ in ps})} functions "
          f"in {len(below)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
