"""Layering rules for ``rag_experiments/`` (docs/architecture.md), read statically by
``scripts/import_graph.py``: no import cycle, private MLflow/Hydra names in adapters only."""

from __future__ import annotations

import ast
import importlib.util

from tests.sweep_helpers import REPO

_spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

#: Cycles through in-function imports still allowed: none (the MLflow adapter broke the last one).
PENDING_CYCLES: list[list[str]] = []
#: The modules allowed to import private (``_``-prefixed) MLflow or Hydra names.
ADAPTERS = {f"rag_experiments/tracking/mlflow_adapter{part}.py" for part in ("", "_session")}
#: Private imports still outside an adapter: none (Hydra's sweep split uses the public Override API).
PENDING_PRIVATE: set[str] = set()


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


# ------------------------------------------------------------------ the package layers (issue 28)

#: The layers, bottom first (docs/architecture.md, "Layers"): a module imports only its own layer
#: and those below. ``entry`` is the thin ``python -m`` shims and ``__main__`` modules.
LAYERS = (
    "core",
    "stages",
    "evalset",
    "evaluation",
    "judge",
    "analysis",
    "tracking",
    "run",
    "spotcheck",
    "report",
    "cli",
    "entry",
)
ENTRY_SHIMS = {"sweep", "compare", "select", "gate", "plan"}
#: Modules outside ``tracking/`` that still import mlflow: none (the run reader and writer doors,
#: tracking/run_reader.py and tracking/run_writer.py). The set may only shrink.
PENDING_MLFLOW: set[str] = set()
#: Modules outside ``run/`` and ``cli/`` that still build objects from YAML with Hydra: may only shrink.
PENDING_HYDRA: set[str] = set()


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[-1] == "__main__" or (len(parts) == 2 and parts[1] in ENTRY_SHIMS):
        return "entry"
    return parts[1]


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every (importer, imported) pair whose imported module sits in a higher layer."""
    return sorted(
        (m, t) for m, ts in graph.items() for t in ts if LAYERS.index(layer_of(t)) > LAYERS.index(layer_of(m))
    )


def test_every_import_goes_down_the_layers() -> None:
    top, inner = import_graph.graphs(REPO)
    full = {m: top[m] | {t for t, _ in inner[m]} for m in top}
    assert {layer_of(m) for m in full} <= set(LAYERS)
    assert upward_imports(full) == []
    # the rule can fail: stages importing the run path is caught
    assert upward_imports({"rag_experiments.stages.x": {"rag_experiments.run.pipeline"}}) == [
        ("rag_experiments.stages.x", "rag_experiments.run.pipeline")
    ]


def package_of(module: str) -> str:
    """The folder a module lives in (its ``__main__`` included); root modules are ``entry``."""
    parts = module.split(".")
    if len(parts) == 2 and (REPO / "rag_experiments" / parts[1]).is_dir():
        return parts[1]
    return parts[1] if len(parts) > 2 else "entry"


def test_no_cycle_between_packages() -> None:
    """Folders as a whole, ``__main__`` modules counted in theirs: ``judge/__main__`` importing the
    CLI made judge → cli → judge (it runs the CLI with runpy instead)."""
    top, inner = import_graph.graphs(REPO)
    packages: dict[str, set[str]] = {}
    for m, ts in top.items():
        packages.setdefault(package_of(m), set()).update(
            package_of(t) for t in ts | {t for t, _ in inner[m]} if package_of(t) != package_of(m)
        )
    assert import_graph.cycles(packages) == []


def test_at_most_six_modules_loose_at_the_root() -> None:
    loose = sorted(p.name for p in (REPO / "rag_experiments").glob("*.py"))
    assert len(loose) <= 6, loose


def _imports_of(path, names: tuple[str, ...]) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        mods = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            )
        )
        if any(m.split(".")[0] in names for m in mods):
            return True
    return False


def test_mlflow_only_in_tracking_and_hydra_only_in_run_and_cli() -> None:
    mlflow_users, hydra_users = set(), set()
    for path in sorted((REPO / "rag_experiments").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if not rel.startswith("rag_experiments/tracking/") and _imports_of(path, ("mlflow",)):
            mlflow_users.add(rel)
        if not rel.startswith(("rag_experiments/run/", "rag_experiments/cli/")) and _imports_of(
            path, ("hydra", "omegaconf")
        ):
            hydra_users.add(rel)
    assert mlflow_users <= PENDING_MLFLOW, sorted(mlflow_users - PENDING_MLFLOW)
    assert hydra_users <= PENDING_HYDRA, sorted(hydra_users - PENDING_HYDRA)


# ------------------------------------------------------------ the Hydra config stops at assembly

_reach_spec = importlib.util.spec_from_file_location("config_reach", REPO / "scripts" / "config_reach.py")
config_reach = importlib.util.module_from_spec(_reach_spec)
_reach_spec.loader.exec_module(config_reach)

#: Functions reachable from the sweep entry, below assembly, that still take or read a DictConfig: none
#: (the ``judge card`` CLI reads ``conf/judge/NAME.yaml`` with PyYAML; the run's assembly passes
#: the judge node as plain data). This set may only shrink.
PENDING_CONFIG_BELOW: set[tuple[str, str]] = set()


def test_the_hydra_config_stops_at_assembly() -> None:
    """From ``run/sweep.py``, no function below ``run/assemble.py`` / ``run/config_schema.py`` and
    the Hydra entry (``@hydra.main``, the multirun callback) annotates, receives or reads a
    DictConfig: traces, racing, the judge card, the pilot line and the run writer get typed settings."""
    below = config_reach.report(REPO)["below"]
    found = {(m, f) for m, places in below.items() for f, _, _ in places}
    assert found <= PENDING_CONFIG_BELOW, sorted(found - PENDING_CONFIG_BELOW)
    # the rule can fail: a function that reads the config, or takes one, is found
    src = "def f(job):\n    return job.cfg.seed\n\ndef g(x: DictConfig):\n    return OmegaConf.to_yaml(x)\n"
    assert {(fn, what) for fn, _, what in config_reach.places_in(src)} == {
        ("f", "reads job.cfg"),
        ("g", "parameter x: DictConfig"),
        ("g", "OmegaConf.to_yaml"),
    }
    assert config_reach.places_in("def h(cfg: dict):\n    return cfg.get('k')\n") == []


def test_import_graph_script_runs_to_the_end(capsys) -> None:
    """The script's figures are read by whoever plans a refactor: every line must print (it once
    read ``rag_experiments/pipeline.py`` after the module had moved to ``run/``)."""
    assert import_graph.main([]) == 0
    out = capsys.readouterr().out
    where, n_args = import_graph.run_pipeline_args(REPO)
    assert where.startswith("rag_experiments.") and n_args > 0
    assert f"run_pipeline arguments: {n_args} ({where})" in out
    assert "largest modules (lines):" in out
