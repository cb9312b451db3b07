"""Hydra through its public API, and a missing launcher plugin named with its install command.

(No private MLflow/Hydra import outside the ``tracking/mlflow_adapter*.py`` modules: tests/test_layers.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_split_sweep_equals_hydras_basic_sweeper():
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the reference, tests only
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rag_experiments.run.multirun import split_sweep

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
