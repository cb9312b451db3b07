"""Hydra launcher plugins that ship in an extra: a missing one is named with its install command.

Without this, ``hydra/launcher=ray`` with the plugin absent ends in Hydra's "Could not load
hydra_plugins... / Unknown plugin class" traceback; checked before Hydra composes (exit 2).
"""

from __future__ import annotations

import importlib.util

INSTALL = "pip install -e '.[distributed]'"
# launcher option -> (plugin module, distribution)
PLUGINS = {
    "ray": ("hydra_plugins.hydra_ray_launcher", "hydra-ray-launcher"),
    "submitit_local": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
    "submitit_slurm": ("hydra_plugins.hydra_submitit_launcher", "hydra-submitit-launcher"),
    "joblib": ("hydra_plugins.hydra_joblib_launcher", "hydra-joblib-launcher"),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the hydra_plugins namespace itself is absent
        return False


def missing_launcher_plugins(argv: list[str]) -> list[str]:
    """One problem per ``hydra/launcher=NAME`` on the command line whose plugin is not installed."""
    problems = []
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if key != "hydra/launcher" or not sep or value not in PLUGINS:
            continue
        module, dist = PLUGINS[value]
        if not _installed(module):
            problems.append(
                f"hydra/launcher={value} needs the {dist} plugin, which is not installed: "
                f"{INSTALL} (docs/scale.md, 'Distributed sweeps')"
            )
    return problems
