"""Does a config value fit the type a stage constructor declares for it? The annotated signature of
an implementation is its typed config: :func:`constructor_hints` reads it (its parameters and the
endpoint settings it takes, ``stages.endpoint_settings``), ``config_schema._Group.typed_keys`` asks
:func:`conforms`; :func:`describe` words the type for the message (``conf/<group>: <key>: must be
an integer or null (got 'x')``).
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from typing import Any

__all__ = ["constructor_hints", "conforms", "describe", "is_int", "is_num"]


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def constructor_hints(cls: type) -> dict[str, Any] | None:
    """Config key → type for every key ``cls(...)`` takes: its annotated parameters, those of the
    base classes its ``**kwargs`` reach, and the endpoint settings its ``ENDPOINT`` declares
    (``stages.endpoint_settings.Takes``). None: it takes any key (``**kwargs``, no declaration).
    Raises when the annotations cannot be read."""
    keys: dict[str, Any] = {}
    for c in cls.__mro__[:-1]:  # object last
        init = c.__dict__.get("__init__")
        if init is None:
            continue
        hints, params = typing.get_type_hints(init), inspect.signature(init).parameters.values()
        for p in params:
            if p.name != "self" and not p.name.startswith("_") and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                keys.setdefault(p.name, hints.get(p.name, Any))
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return keys
    takes = getattr(cls, "ENDPOINT", None)
    if takes is None:
        return None
    return takes.hints() | {k: v for k, v in keys.items() if k not in takes.without}  # its own annotation wins


def conforms(value: Any, hint: Any) -> bool:
    """Does a YAML value fit a constructor annotation? Unknown annotations (a Protocol such as
    ``Embedder``, set by the sweep or a nested ``_target_`` node) are not judged here."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return True
    if value is None:
        return hint is type(None) or type(None) in args
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args if a is not type(None))
    if origin is typing.Literal:
        return value in args
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return is_int(value)
    if hint is float:
        return is_num(value)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(conforms(v, a) for v, a in zip(value, args, strict=True))
        item = args[0] if args else Any
        return all(conforms(v, item) for v in value)
    if origin in (dict, collections.abc.Mapping) or hint is dict:
        return isinstance(value, dict)
    return True


def describe(hint: Any) -> str:
    """``int | None`` → "an integer or null"; ``Literal["chars", "tokens"]`` → "one of chars, tokens"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is typing.Literal:
        return f"one of {', '.join(map(str, args))}"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}
    if hint in names:
        return names[hint]
    if origin in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        return "a list" + (f" of {describe(args[0])}" if args and args[-1] is not Ellipsis and origin is list else "")
    if origin in (dict, collections.abc.Mapping) or hint is dict:
        return "a mapping"
    return str(hint)
