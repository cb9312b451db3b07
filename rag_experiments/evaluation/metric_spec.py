"""The type of one metric declaration: a key pattern with its side, direction, value type,
definition and computing function (docs/metrics.md). The declarations are in
:mod:`rag_experiments.evaluation.metric_table`; lookups by logged key in
:mod:`rag_experiments.evaluation.registry`.
"""

from __future__ import annotations

import importlib
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from rag_experiments.core import slots
from rag_experiments.core.slots import steps
from rag_experiments.evaluation.labels import FAILURE_LABELS

Side = Literal["retrieval", "generation", "diagnostic", "label", "cost", "count", "judge", "noise"]
ValueType = Literal["binary", "proportion", "continuous", "count"]
#: What makes a metric's values incomparable across configs (``MetricSpec.breaks``; the rule is
#: ``analysis.comparability``): ``chunks`` — the configs' chunks differ (a cut-off counts chunks,
#: and a whole document is one chunk however many tokens it costs); ``judge`` — another judge
#: scored them (the metric is the judge's opinion; judge=none changes the failure-label rule);
#: ``key_facts`` — key facts the eval-set check calls weak still count.
Break = Literal["chunks", "judge", "key_facts"]
BREAKS: tuple[str, ...] = ("chunks", "judge", "key_facts")

#: What each pattern placeholder may be; anything else in a pattern is literal text.
_PLACEHOLDERS: dict[str, str] = {
    "k": r"[1-9]\d*",  # rank cut-off
    "B": r"[1-9]\d*",  # token budget of the context
    "label": "|".join(FAILURE_LABELS),
    "stage": "",  # a step with its own latency / tokens: :func:`_placeholder`, from the slots at use
    "ci": "|/ci_low|/ci_high",  # a judge-card figure or a bound of its bootstrap CI
    "ptype": r"(?!\S*_ci_(?:low|high)$)[A-Za-z0-9_.\-]+?",  # a judge_pairs pair type (not a CI form)
    "metric": r"[a-z][a-z0-9_]*",  # a per-query metric key (var_share/{metric}/...)
    "component": "query|generation|judge",  # a variance component (analysis.variance)
    "cell": "(?:answerable|unanswerable)_(?:answered|declined)",  # the abstention table
}
_INT_PLACEHOLDERS = frozenset({"k", "B"})


def _placeholder(name: str) -> str:
    """A placeholder's regex; ``stage`` is the steps' columns (``core.slots``) read when a pattern
    is first matched, not at import, so a slot declared later (a test's) is covered."""
    if name == "stage":
        return "|".join(s.column for s in steps() if s.column)
    return _PLACEHOLDERS[name]


@dataclass(frozen=True)
class MetricSpec:
    """One metric key pattern and everything a consumer needs to know about it.

    ``higher_is_better`` is None for descriptive counts (``n_queries``) that have no better side.
    ``per_query``: a per-query column whose mean (with a bootstrap CI, ``n_scored/`` and
    ``by_tag/``) is the logged aggregate; otherwise the key is logged as is (counts) or not
    aggregated at all (latencies: compared only when asked for by name).
    ``headline``: position in the run summary (None = not shown there); ``every_k``: the summary
    also lists it at every ``metrics.ks``, not only at the context k.
    ``compute``: dotted path of the pure function that computes the per-query value (resolved
    lazily by :meth:`function`, so importing the registry loads no judge or model code).
    ``columns``: the per-query table columns (``core/query_table.py``) that function's per-query
    inputs come from (``hit_at_{k}``: ``retrieved`` and ``gold_spans``); inputs that are no column
    (the chunk set, an item's key facts, the judge) are not listed. () for keys not computed from
    per-query columns (the judge card, cost, the variance split).
    ``breaks``: the :data:`BREAKS` that make the metric incomparable across configs (() = always
    comparable on one eval set); ``analysis.comparability`` applies them.
    """

    pattern: str
    side: Side
    higher_is_better: bool | None
    value_type: ValueType
    definition: str
    compute: str | None = None
    per_query: bool = True
    headline: int | None = None
    every_k: bool = False
    columns: tuple[str, ...] = ()
    breaks: tuple[Break, ...] = ()
    params: tuple[str, ...] = field(init=False)
    _regex: tuple | None = field(init=False, repr=False, compare=False)  # (slot list, compiled)

    def __post_init__(self) -> None:
        names = [f for _, f, _, _ in string.Formatter().parse(self.pattern) if f]
        if set(self.breaks) - set(BREAKS):
            raise ValueError(f"{self.pattern}: unknown breaks {sorted(set(self.breaks) - set(BREAKS))}")
        unknown = set(names) - set(_PLACEHOLDERS)
        if unknown:
            raise ValueError(f"{self.pattern}: unknown placeholder(s) {sorted(unknown)}")
        object.__setattr__(self, "params", tuple(names))
        object.__setattr__(self, "_regex", None)

    def regex(self) -> re.Pattern:
        """The pattern compiled on first use, again when the slot list changed (``{stage}``)."""
        key = slots.SLOTS if "stage" in self.params else None
        if self._regex is None or self._regex[0] is not key:
            rx = "".join(
                re.escape(lit) + (f"(?P<{name}>{_placeholder(name)})" if name else "")
                for lit, name, _, _ in string.Formatter().parse(self.pattern)
            )
            object.__setattr__(self, "_regex", (key, re.compile(rx)))
        return self._regex[1]

    def match(self, key: str) -> dict[str, Any] | None:
        """The placeholder values when ``key`` is an instance of this pattern (ints for k and B)."""
        m = self.regex().fullmatch(key)
        if m is None:
            return None
        return {n: (int(v) if n in _INT_PLACEHOLDERS else v) for n, v in m.groupdict().items()}

    def render(self, **params: Any) -> str:
        missing = set(self.params) - set(params)
        if missing:
            raise ValueError(f"{self.pattern}: missing parameter(s) {sorted(missing)}")
        key = self.pattern.format(**{n: params[n] for n in self.params})
        if self.match(key) is None:
            raise ValueError(f"{self.pattern}: {params} does not give a valid key ({key!r})")
        return key

    def function(self) -> Callable | None:
        if self.compute is None:
            return None
        module, _, name = self.compute.rpartition(".")
        return getattr(importlib.import_module(module), name)
