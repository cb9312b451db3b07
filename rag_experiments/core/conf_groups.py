"""The Hydra config groups (``conf/<group>/<option>.yaml``): one list, and what an option builds.

``GROUPS`` holds the groups of ``conf/config.yaml``'s ``defaults`` (the same set, in pipeline
order rather than the file's; tests/test_run_path.py checks both): one group per pipeline stage
(``STAGE_GROUPS``: the inputs, then the slots of ``core.slots``), then the failure-label thresholds
and the tracking store. The sweep logs the stage-group choices as params, attribution
reads them as factors, and the report names a judge option's class from its YAML ``_target_``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import yaml

from rag_experiments.core.slots import INPUT_GROUPS, SLOTS

#: The inputs, then one group per stage slot in pipeline order (``core.slots.SLOTS``).
STAGE_GROUPS = (*INPUT_GROUPS, *(s.group for s in SLOTS))
GROUPS = (*STAGE_GROUPS, "attribution", "tracking")
#: Top-level config keys read only when a run generates (a retrieval-only run, generator=none,
#: ignores them): the report's "Held fixed" leaves them out when no config generated.
GENERATION_KEYS = ("prompt", "judge", "generation_subset", "replicates", "judge_card", "racing")


def generation_only(key: str) -> bool:
    """True for a config key (``judge.model``, ``generator.temperature``) only generation reads."""
    return key.split(".", 1)[0] in GENERATION_KEYS or key.startswith("generator.")


def embedding_used(params: Mapping[str, str]) -> bool:
    """Whether a run's embedding model could change its results, from its logged params: its
    retriever's class (``retriever._target_``) calls the embedder, i.e. its ``uses_embedder`` is
    not False (BM25's is). A class that does not say, or cannot be imported, counts as using it."""
    module, _, name = params.get("retriever._target_", "").rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name, None) if module else None
    except ImportError:
        cls = None
    return getattr(cls, "uses_embedder", True) is not False


def conf_dir() -> Path:
    """The Hydra config tree, package data inside ``rag_experiments``."""
    return Path(str(resources.files("rag_experiments") / "conf"))


def options(group: str) -> list[str]:
    """The option names of a group (``conf/<group>/*.yaml``), sorted."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def option_target(group: str, option: str) -> str | None:
    """The ``_target_`` of ``conf/<group>/<option>.yaml`` (None: no such option, or no target)."""
    path = conf_dir() / group / f"{option}.yaml"
    if not path.is_file():
        return None
    node = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    target = node.get("_target_") if isinstance(node, dict) else None
    return str(target) if target else None


def option_class(group: str, option: str) -> type | None:
    """The class ``conf/<group>/<option>.yaml`` instantiates (the report documents the judge's)."""
    target = option_target(group, option)
    if target is None:
        return None
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name, None)
