"""MLflow and Hydra through their public APIs; their internals only in ``tracking.mlflow_adapter``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "rag_experiments"
ADAPTER = PKG / "tracking" / "mlflow_adapter.py"
INTERNAL = ("mlflow.store.tracking.sqlalchemy_store", "mlflow.tracing.client")


def _private_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            mod = node.module
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            mod, names = "", [a.name for a in node.names]
        else:
            continue
        for full in [mod] if mod else names:
            if not full.startswith(("mlflow", "hydra")):
                continue
            private = any(p.startswith("_") for p in full.split(".")) or full in INTERNAL
            private = private or (mod and any(n.startswith("_") for n in names))
            if private:
                out.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: {full} {names}")
    return out


def test_no_private_mlflow_or_hydra_import_outside_the_adapter():
    found = [hit for p in sorted(PKG.rglob("*.py")) if p != ADAPTER for hit in _private_imports(p)]
    assert not found, "\n".join(found)
    assert _private_imports(ADAPTER), "the adapter is where the internals are"


def test_split_sweep_equals_hydras_basic_sweeper():
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the reference, tests only
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rag_experiments.multirun import split_sweep

    args = ["chunking=fixed,sentence", "retriever.k=1,2,3", "seed=0", "+x=choice(a,b)", "y=[1,2]", "z='a,b'"]
    parsed = OverridesParser.create().parse_overrides(args)
    expected = [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    assert split_sweep(parsed) == expected and len(expected) == 12
    with pytest.raises(ValueError, match="does not support"):
        split_sweep(OverridesParser.create().parse_overrides(["seed=interval(0,1)"]))


# fault injection: the ray launcher plugin is not importable
HIDE_RAY = """
import importlib.abc, runpy, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith("hydra_plugins.hydra_ray_launcher"):
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Hide())
runpy.run_module("rag_experiments.sweep", run_name="__main__", alter_sys=True)
"""


def test_ray_launcher_without_the_extra_says_how_to_install_it(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = subprocess.run(
        [sys.executable, "-c", HIDE_RAY, "-m", "hydra/launcher=ray", "retriever.k=1,2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    assert "pip install -e '.[distributed]'" in p.stderr and "hydra-ray-launcher" in p.stderr
    assert "Unknown plugin" not in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "mlflow.db").exists()
