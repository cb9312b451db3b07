"""Config *keys*, with a "did you mean": the command line's before Hydra composes
(:func:`unknown_config_keys`), a group's against its constructor after (:func:`constructor_key_problems`).

``retriver=bm25``, ``retriever.kk=3`` and ``+foo.bar=1`` are typos in a key, not in a value. Hydra
reports the first two as ``Key 'retriver' is not in struct`` and exits 1 (the exit code the README
keeps for a failed gate), and it accepts the third, which nothing then reads. Here every
``key=value`` override is looked up in the config the command line composes (the group choices and
experiments it names, nothing else), and an unknown key becomes one line with a "did you mean",
exit 2, before any MLflow run or Hydra output exists. Group *options* (``chunking=fixd``) are
:func:`rag_experiments.run.config_schema.unknown_group_options`' job. Keys a group's constructor
does not take (``+chunking.sizee=5``, or a typo in a YAML) are found after composition, by
:func:`constructor_key_problems` (which ``config_schema`` calls for every group), so ``+group.key``
is left to it here.
"""

from __future__ import annotations

import difflib
import itertools
from typing import Any

from rag_experiments.core.conf_groups import conf_dir

# Arguments the sweep passes itself (not from YAML), per group.
INJECTED = {"evalset": {"corpus"}, "retriever": {"embedder"}}
# Flags after which the config lives elsewhere or the command is not a run: leave it to Hydra.
_OWN_CONFIG = ("-cd", "--config-dir", "-cp", "--config-path", "-cn", "--config-name")


def close_matches(word: str, candidates) -> str:
    """``'x' or 'y'``: the (at most 3) candidates closest to ``word`` (difflib ratio >= 0.6), else ``""``."""
    close = difflib.get_close_matches(word, sorted(set(map(str, candidates))), n=3, cutoff=0.6)
    return " or ".join(repr(c) for c in close)


def did_you_mean(word: str, candidates) -> str:
    """`` (did you mean 'x'?)`` for the closest candidates, else ``""``."""
    close = close_matches(word, candidates)
    return f" (did you mean {close}?)" if close else ""


def constructor_key_problems(group: str, node: dict, extra=frozenset()) -> list[tuple[str, str]]:
    """(key, what is wrong) for each key of a group's node that its ``_target_``'s constructor does
    not take (``extra``: keys the sweep reads itself, like ``pricing``), with a "did you mean";
    an unimportable ``_target_``; a key the sweep injects itself. The keys it takes are
    ``config_types.constructor_hints``' (the endpoint settings included); [] for a constructor
    that takes any key."""
    target = node.get("_target_")
    if not target:
        return []
    from hydra.utils import get_class

    from rag_experiments.run.config_types import constructor_hints

    try:
        hints = constructor_hints(get_class(target))
    except Exception as e:  # noqa: BLE001 - an unimportable target is itself the problem
        return [("_target_", f"cannot import ({type(e).__name__}: {e}) (got {target!r})")]
    if hints is None:
        return []
    allowed = set(hints) | {"_target_"} | set(extra)
    cls, out = target.rsplit(".", 1)[-1], []
    for key in node:
        if key not in allowed:
            close = close_matches(key, allowed - {"_target_"} - INJECTED.get(group, set()))
            hint = f"; did you mean {close}?" if close else ""
            out.append((key, f"unknown option for {cls} (got {node[key]!r}){hint}"))
    out += [(k, f"is set by the sweep, not the config (got {node[k]!r})") for k in sorted(INJECTED.get(group, set()) & set(node))]
    return out


def _is_group(key: str) -> bool:
    return "/" in key or (conf_dir() / key).is_dir()


def _parse(argv: list[str]) -> list:
    """Hydra's own parse of each ``key=value`` argument; one it cannot parse is left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, out = OverridesParser.create(), []
    for arg in argv:
        if arg.startswith("-") or ("=" not in arg and not arg.startswith("~")):
            continue
        try:
            out += parser.parse_overrides([arg])
        except Exception:  # noqa: BLE001 - a malformed override: Hydra's message names it
            continue
    return out


def _multirun(argv: list[str]) -> bool:
    return any(a in ("-m", "--multirun") for a in argv)


def _values(o) -> list[str]:
    return list(o.sweep_string_iterator()) if o.is_sweep_override() else [str(o.value())]


def _selector(o) -> str:
    """A group override's left side as written: ``+experiment``, ``generator@query.llm``, ``retriever``."""
    prefix = "++" if o.is_force_add() else "+" if o.is_add() else ""
    return prefix + o.key_or_group + (f"@{o.package}" if o.package else "")


def _compose(choices: dict[str, str]):
    """The config for these group choices (selector -> option); None if it does not compose."""
    from hydra import compose, initialize_config_dir

    overrides = [f"{sel}={v}" for sel, v in choices.items()]
    try:
        with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir())):
            return compose("config", overrides=overrides, return_hydra_config=True)
    except Exception:  # noqa: BLE001 - a bad option or plugin is reported elsewhere, or by Hydra
        return None


def _lookup(cfg, parts: list[str]) -> tuple[Any, int]:
    """(the node at ``parts``, how many parts were found): stops at the first missing one."""
    from omegaconf import DictConfig, ListConfig

    node = cfg
    for i, part in enumerate(parts):
        if isinstance(node, DictConfig) and part in node.keys():  # `in node` is False for ??? values
            node = node._get_node(part)
        elif isinstance(node, ListConfig) and part.isdigit() and int(part) < len(node):
            node = node._get_node(int(part))
        else:
            return node, i
    return node, len(parts)


def _where(cfg, parts: list[str], found: int) -> str:
    """The YAML that holds the missing key: ``conf/retriever/dense.yaml`` or ``conf/config.yaml``."""
    choice = cfg.hydra.runtime.choices.get(parts[0]) if found >= 1 else None
    return f"conf/{parts[0]}/{choice}.yaml" if choice else "conf/config.yaml"


def _problem(arg: str, cfg, parts: list[str], found: int, add: bool) -> str:
    from omegaconf import DictConfig

    node, _ = _lookup(cfg, parts[:found])
    siblings = [k for k in node.keys() if k != "hydra"] if isinstance(node, DictConfig) else []
    missing = parts[found]
    hint = did_you_mean(missing, siblings)
    if not hint and 0 < len(siblings) <= 30:
        hint = f" (keys: {', '.join(map(str, siblings))})"
    where = _where(cfg, parts, found)
    if add:
        return f"{arg}: unknown key {missing!r}: nothing in {where} reads it{hint}"
    tail = ""
    if found == 1 and _is_group(parts[0]) and "did you mean" not in hint:  # a constructor argument the YAML leaves out
        tail = f"; a key the YAML leaves out is added with +{'.'.join(parts)}=..."
    return f"{arg}: unknown key {missing!r} in {where}{hint}{tail}"


def unknown_config_keys(argv: list[str]) -> list[str]:
    """One line per ``key=value`` / ``~key`` / ``+key=value`` naming a key the config lacks.

    ``key=value`` and ``~key`` need the key to exist (in every option a swept group takes);
    ``+key`` / ``++key`` outside a config group add a key nothing reads. ``hydra.*`` keys, and
    command lines with their own config dir or name, are left to Hydra.
    """
    if any(a in _OWN_CONFIG or a.split("=", 1)[0] in _OWN_CONFIG for a in argv):
        return []
    overrides = _parse(argv)
    # selector -> options: every group choice, ``+experiment=x`` and ``+generator@query.llm=openai`` too
    groups = {_selector(o): _values(o) for o in overrides if _is_group(o.key_or_group) and not o.is_delete()}
    groups = {g: v for g, v in groups.items() if not g.lstrip("+").startswith("hydra/") and v}
    keys = [o for o in overrides if not _is_group(o.key_or_group) and o.key_or_group.split(".")[0] != "hydra"]
    if not keys:
        return []
    cache: dict[tuple, Any] = {}

    def composed(choices: dict[str, str]):
        at = tuple(sorted(choices.items()))
        if at not in cache:
            cache[at] = _compose(choices)
        return cache[at]

    first = {g: v[0] for g, v in groups.items()}
    swept = {g for g, o in ((_selector(o), o) for o in overrides) if o.is_sweep_override()} if _multirun(argv) else set()
    problems = []
    for o in keys:
        parts = o.key_or_group.split(".")
        arg = o.input_line or o.key_or_group
        # every option of the key's own group when it is swept; the other groups at their first value
        variants = [{**first, parts[0]: v} for v in groups.get(parts[0], [None])] if parts[0] in groups else [first]
        for choices in itertools.islice(variants, 20):
            cfg = composed(choices)
            if cfg is None:
                break
            node, found = _lookup(cfg, parts)
            if found == len(parts):
                if o.is_add():  # Hydra: "Could not append to config. An item is already at ..."
                    problems.append(f"{arg}: {o.key_or_group} is already set: drop the + ({arg[1:]})")
                    break
                continue
            if o.is_add() or o.is_force_add():
                if _is_group(parts[0]) and found >= 1:
                    break  # a constructor argument: config_schema's known_keys checks it
                problems.append(_problem(arg, cfg, parts, found, add=True))
            else:
                problems.append(_problem(arg, cfg, parts, found, add=False))
            break
        else:
            if parts[0] in swept and not (o.is_add() or o.is_force_add()):
                problems += _primary_problem(arg, parts, composed({g: v for g, v in first.items() if g not in swept}))
    return problems


def _primary_problem(arg: str, parts: list[str], primary) -> list[str]:
    """Hydra composes a multirun's primary config without its sweeps, so a key of a swept group
    must also be in that group's default option (else Hydra's "Could not override", exit 1)."""
    if primary is None or _lookup(primary, parts)[1] == len(parts):
        return []
    default = primary.hydra.runtime.choices.get(parts[0])
    return [f"{arg}: {parts[0]} is swept, and Hydra first composes a multirun with its default ({parts[0]}="
            f"{default}), which has no {'.'.join(parts[1:])}: write ++{arg} to set it in every swept option"]  # fmt: skip
