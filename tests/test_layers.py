"""Layering rules for ``rag_experiments/`` (docs/architecture.md), read statically by
``scripts/import_graph.py``: no import cycle, private MLflow/Hydra names in adapters only."""

from __future__ import annotations

import ast
import importlib.util

from tests.sweep_helpers import REPO

_spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

#: The one cycle left through in-function imports: tracking/traces <-> trace_store <-> genai_dataset
#: (issue 20 item 3, the MLflow adapter, removes it; then this set is empty).
PENDING_CYCLES: list[list[str]] = [
    [
        "rag_experiments.tracking.genai_dataset",
        "rag_experiments.tracking.trace_store",
        "rag_experiments.tracking.traces",
    ]
]
#: The modules allowed to import private (``_``-prefixed) MLflow or Hydra names.
ADAPTERS = {"rag_experiments/tracking/mlflow_adapter.py"}
#: Private imports still outside an adapter, until the MLflow/Hydra adapters land (issue 20 item 3).
PENDING_PRIVATE = {"rag_experiments/multirun.py", "rag_experiments/tracking/genai_dataset.py"}


def test_module_top_import_graph_has_no_cycle() -> None:
    top, _ = import_graph.graphs(REPO)
    assert import_graph.cycles(top) == []


def test_no_cycle_through_in_function_imports_either() -> None:
    top, inner = import_graph.graphs(REPO)
    full = {m: top[m] | {t for t, _ in inner[m]} for m in top}
    assert [c for c in import_graph.cycles(full) if c not in PENDING_CYCLES] == []


def test_cycles_are_found_when_there_are_some() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_graph.cycles(graph) == [["a", "b", "c"]]
    assert import_graph.cycles({"a": {"b"}, "b": set()}) == []


def private_imports(source: str) -> list[str]:
    """``module.name`` of every import of a ``_``-prefixed MLflow or Hydra module or name."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in ("mlflow", "hydra") and any(p.startswith("_") for p in parts):
                out.append(name)
    return out


def test_private_mlflow_and_hydra_names_only_in_adapters() -> None:
    offenders = {}
    for path in sorted((REPO / "rag_experiments").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        found = private_imports(path.read_text())
        hydra_adapter = "adapter" in path.stem and all(n.startswith("hydra.") for n in found)
        if found and rel not in ADAPTERS | PENDING_PRIVATE and not hydra_adapter:
            offenders[rel] = found
    assert offenders == {}
    assert private_imports("from hydra._internal.x import Y\nimport mlflow.tracking._ts\nimport mlflow") == [
        "hydra._internal.x.Y",
        "mlflow.tracking._ts",
    ]
