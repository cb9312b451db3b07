"""Objects from plain, already resolved config nodes: ``{"_target_": "pkg.mod.Class", **args}``.

Why not ``hydra.utils.instantiate``: it wraps the node in an OmegaConf config again and resolves it
a second time, so a value the user escaped (``prompt.system='… \\${x} …'``, resolved once to the
literal ``${x}``) is read as an interpolation: a traceback, or a prompt that differs from the logged
``config.yaml`` (issue 31, item 9). Here the node is resolved once, by the caller, and built as is.
No Hydra or OmegaConf import: every layer can build from YAML.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def target_object(target: str) -> Any:
    """The class or function a dotted ``_target_`` names (``pkg.mod.Class`` or ``pkg.mod.Class.attr``)."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as e:
            if e.name is not None and not ".".join(parts[:i]).startswith(e.name):
                raise  # the module exists but one of its own imports is missing
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"_target_ {target!r}: no such module")


def build(node: Any, **kwargs: Any) -> Any:
    """``node`` with every mapping that has a ``_target_`` replaced by ``target(**args)``, innermost
    first; ``kwargs`` go to the outermost call and win over the node's keys. Keys starting with an
    underscore (``_target_`` and Hydra's other flags) are not arguments. Lists are built element-wise;
    other values are passed as they are (never re-resolved)."""
    if isinstance(node, Mapping):
        args = {k: build(v) for k, v in node.items() if not str(k).startswith("_")}
        if "_target_" not in node:
            return {**args, **kwargs}
        return target_object(str(node["_target_"]))(**{**args, **kwargs})
    if isinstance(node, list | tuple):
        return [build(v) for v in node]
    return node
