"""A built wheel, installed outside the repository, runs the retrieval-only sweep from an empty directory.

This is what a user gets from ``pip install .``: the config tree and the bundled sample must be
package data found through importlib.resources, never through the current directory. To stay fast
the fresh venv reuses the project venv's site-packages through a ``.pth`` file (dependencies are
not re-installed) and receives only the wheel (``--no-deps``). A ``.pth`` entry adds a plain path,
so the editable install of the checkout in that site-packages is not active in the new venv.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(cmd: list, cwd: Path, env: dict | None = None, timeout: int = 600) -> str:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout + p.stderr


def test_wheel_runs_the_sweep_from_an_empty_directory(tmp_path):
    wheels, src = tmp_path / "wheels", tmp_path / "src"
    # a copy of the sources: an in-tree build would leave build/ and egg-info in the checkout
    ignore = shutil.ignore_patterns(".*", "build", "*.egg-info", "mlruns", "outputs", "multirun", "*.db")
    shutil.copytree(REPO, src, ignore=ignore)
    # no build isolation: the venv's setuptools builds it offline
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, src],
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("rag_experiments-*.whl")

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    new_site = Path(
        subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        .decode()
        .strip()
    )
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()] or [sysconfig.get_paths()["purelib"]]
    (new_site / "project_deps.pth").write_text("\n".join(deps) + "\n")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-compile",
            "--ignore-installed",
            "--target",
            new_site,
            wheel,
        ],
        cwd=tmp_path,
    )

    work = tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    where = _run([py, "-c", "import rag_experiments; print(rag_experiments.__file__)"], cwd=work, env=env)
    assert str(new_site) in where, f"imported the checkout, not the wheel: {where}"

    out = _run(
        [py, "-m", "rag_experiments.sweep", "generator=none", "progress=false", "evalset.limit=20"],
        cwd=work,
        env=env,
    )
    assert "hit_at_5" in out and (work / "mlflow.db").is_file(), out[-3000:]
    # the printed UI command works from another shell: absolute store, this venv's interpreter
    ui = next(line for line in out.splitlines() if "mlflow server" in line)
    assert f"sqlite:///{work}/mlflow.db" in ui and f"{py} -m mlflow server" in ui, ui
