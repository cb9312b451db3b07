"""``python -m rag_experiments.<cli> --help`` exits 0 for every entry point and every subcommand
(issue 37: ``judge --help`` exited 2). The entry points are found, not listed: every module at the
package root with an ``if __name__ == "__main__"`` and every package with a ``__main__.py``; the
subcommands are read from the ``{a,b}`` in each usage line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "rag_experiments"


def entry_points() -> list[str]:
    roots = [p.stem for p in PKG.glob("*.py") if '__name__ == "__main__"' in p.read_text()]
    packages = [p.parent.name for p in PKG.glob("*/__main__.py")]
    return sorted(roots + packages)


def _help(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [sys.executable, "-m", *args, "--help"], capture_output=True, text=True, env=env, timeout=300
    )


def test_the_entry_points_are_found():
    assert {"sweep", "compare", "select", "gate", "plan", "judge", "evalset", "report", "spotcheck"} <= set(
        entry_points()
    )


@pytest.mark.parametrize("name", entry_points())
def test_every_cli_help_exits_0(name, tmp_path):
    module = f"rag_experiments.{name}"
    p = _help(module)
    assert p.returncode == 0, (module, p.returncode, p.stderr[-2000:])
    assert "usage" in p.stdout.lower() or "== Configuration groups ==" in p.stdout, p.stdout[:500]  # sweep: Hydra's help
    usage = p.stdout.split("\n\n")[0]
    for choices in re.findall(r"\{([a-z_,-]+)\}", usage):
        for command in choices.split(","):
            q = _help(module, command)
            assert q.returncode == 0, (module, command, q.returncode, q.stderr[-2000:])
            assert "usage" in q.stdout.lower(), (module, command, q.stdout[:500])
