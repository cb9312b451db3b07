"""The endpoint settings: one frozen type every remote user composes (docs/endpoints.md, "Endpoint
settings").

The generator (OpenAI-compatible and llama.cpp), the LLM judges, MLflow's judge, the rerank API,
the LLM reranker, the embeddings API and ``app=http`` each hold an :class:`EndpointSettings`. Its
fields are flat keys of the user's config group (``generator.timeout_s``, ``judge.rpm``,
``app.concurrency``): the YAML stays flat, the constructor takes them as keyword arguments and
:class:`Takes` (the class attribute ``ENDPOINT``) says which of them a user takes and its
defaults. Each field's range is declared here once (:data:`RANGES`): the config check
(``run.endpoint_checks``) and the constructor both ask :func:`setting_problems`, so a bad value
exits 2 naming the key before any run, and a caller in Python gets the same sentence.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ADDRESS = ("base_url", "model", "api_key_env")  # set by a local user itself (llama.cpp, app's url)
SAMPLING = ("temperature", "seed", "max_tokens")  # a chat model's; no meaning for rerank, embeddings, apps


@dataclass(frozen=True)
class Range:
    """A number's allowed range; None (where the type allows it) is always in range."""

    low: float
    high: float | None = None
    open_low: bool = False
    integer: bool = False

    def problem(self, v: Any) -> str | None:
        """``must be …`` when ``v`` is out of range, else None."""
        if v is None:
            return None
        fits = _is_int(v) if self.integer else _is_num(v)
        if fits and (v > self.low if self.open_low else v >= self.low) and (self.high is None or v <= self.high):
            return None
        kind = "an integer" if self.integer else "a number"
        if self.high is None:
            return f"must be {kind} {'>' if self.open_low else '>='} {self.low}"
        return f"must be {kind} in {'(' if self.open_low else '['}{self.low}, {self.high}] or null (no limit)"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


#: Each numeric setting's range, the one rule the config check and the constructor apply.
RANGES: dict[str, Range] = {
    "temperature": Range(0),
    "max_tokens": Range(1, integer=True),
    "concurrency": Range(1, integer=True),  # requests this step keeps in flight
    "timeout_s": Range(0, open_low=True),  # a whole attempt, body included (stages.endpoint)
    "max_retries": Range(0, integer=True),
    "backoff_s": Range(0),
    "max_concurrency": Range(1, 1024, integer=True),  # the endpoint's limits: None, no limit
    "rpm": Range(0, 1_000_000, open_low=True),
    "tpm": Range(0, 1_000_000_000, open_low=True),
}


@dataclass(frozen=True)
class EndpointSettings:
    """Where a remote step sends its requests and how (docs/endpoints.md, "Endpoint settings").

    ``base_url`` + ``model`` name the endpoint (its limits and usage are shared per that pair);
    ``api_key_env`` is the NAME of the variable holding the key; ``temperature``, ``seed``,
    ``max_tokens`` sample a chat model; ``concurrency`` is this step's requests in flight;
    ``timeout_s``, ``max_retries``, ``backoff_s`` are the client's deadline and retries
    (``stages.endpoint``); ``max_concurrency``, ``rpm``, ``tpm`` the endpoint's limits (None: none).
    """

    base_url: str = ""
    model: str = ""
    api_key_env: str | None = None
    temperature: float = 0.0
    seed: int | None = 0
    max_tokens: int = 256
    concurrency: int = 4
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 0.5
    max_concurrency: int | None = None
    rpm: float | None = None
    tpm: float | None = None

    def __post_init__(self) -> None:
        if bad := setting_problems(dataclasses.asdict(self)):
            raise ValueError("; ".join(f"{key}: {what}" for key, what in bad))
        for f in dataclasses.fields(self):  # YAML's 60 is a float here; identities print 60.0 as before
            v = getattr(self, f.name)
            if v is not None and f.name in RANGES:
                object.__setattr__(self, f.name, int(v) if RANGES[f.name].integer else float(v))
        object.__setattr__(self, "base_url", str(self.base_url or "").rstrip("/"))
        object.__setattr__(self, "model", str(self.model or ""))
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))

    def keywords(self, *leave_out: str) -> dict[str, Any]:
        """The settings as keyword arguments (another user built on these, e.g. a judge's client)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in leave_out}


def setting_problems(values: Mapping[str, Any], aliases: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(key, "must be … (got v)")`` for each setting in ``values`` out of its range
    (:data:`RANGES`; ``aliases``: another key a user takes for a field, e.g. MLflow's ``num_retries``)."""
    out = []
    for key, v in values.items():
        rule = RANGES.get((aliases or {}).get(key, key))
        if rule is not None and (what := rule.problem(v)):
            out.append((key, f"{what} (got {v!r})"))
    return out


class Takes:
    """The endpoint settings a class takes as keyword arguments (its ``ENDPOINT`` attribute): every
    field of :class:`EndpointSettings` but ``without``, with the class's own ``defaults``;
    ``aliases`` maps a key of its own to a field (``num_retries`` → ``max_retries``);
    ``model_required``: an empty ``model`` is refused by the config check."""

    def __init__(self, without: tuple[str, ...] = (), aliases: Mapping[str, str] | None = None,
                 model_required: bool = True, **defaults: Any) -> None:  # fmt: skip
        names = [f.name for f in dataclasses.fields(EndpointSettings)]
        unknown = (set(without) | set(defaults) | set((aliases or {}).values())) - set(names)
        assert not unknown, f"not endpoint settings: {sorted(unknown)}"
        self.keys = tuple(n for n in names if n not in without)
        self.without, self.defaults = tuple(without), dict(defaults)
        self.aliases, self.model_required = dict(aliases or {}), model_required
        self.owner = "the constructor"

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner = f"{owner.__name__}()"

    def hints(self) -> dict[str, Any]:
        """Config key → type, for the config check (``run.config_types.constructor_hints``)."""
        types = typing.get_type_hints(EndpointSettings)
        out = {k: types[k] for k in self.keys}
        return out | {alias: types[field] for alias, field in self.aliases.items()}

    def settings(self, given: Mapping[str, Any], **fixed: Any) -> EndpointSettings:
        """The settings from the keyword arguments ``given`` (a key it does not take is a TypeError,
        as Python's own), over the class's defaults; ``fixed``: what the class sets itself."""
        values: dict[str, Any] = {}
        for key, v in given.items():
            field = self.aliases.get(key, key)
            if field not in self.keys and key not in self.aliases:
                raise TypeError(f"{self.owner} got an unexpected keyword argument {key!r}")
            if field in values:
                raise TypeError(f"{self.owner}: give {field!r} once (got it as {key!r} too)")
            values[field] = v
        return EndpointSettings(**{**self.defaults, **values, **fixed})
