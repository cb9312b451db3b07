"""A logged run as the readers see it (compare, gate, select, report, spotcheck): ``RunData``,
JSON-valued per-query cells and the config-group params. No MLflow here: ``tracking.runs``
builds ``RunData`` from the store, ``analysis`` computes on it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from rag_experiments.core.conf_groups import GROUPS
from rag_experiments.core.identity import is_place_key


def parse_json(s: Any, default: Any) -> Any:
    """A JSON-valued per-query column cell (``retrieved``, ``verdicts`` …) as Python data;
    ``default`` when missing or unparseable."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return default
    try:
        return json.loads(s) if isinstance(s, str) else s
    except ValueError:
        return default


def as_series(x: pd.Series | pd.DataFrame, metric: str | None = None) -> pd.Series:
    """One metric per query as floats indexed by eval item id (str)."""
    if isinstance(x, pd.DataFrame):
        s = x.set_index("id")[metric] if "id" in x.columns else x[metric]
    else:
        s = x
    s = pd.to_numeric(s, errors="coerce").astype(float)
    s.index = s.index.astype(str)
    return s


@dataclass
class RunData:
    """One logged run as every reader sees it, whatever the store (``tracking.run_reader``):
    params, tags, metrics, status and place in the sweep; ``table`` is the per-query table once
    read (``RunReader.with_table``), None before."""

    run_id: str
    name: str  # the run name, else the run id
    params: dict[str, str]
    tags: dict[str, str] = field(default_factory=dict)
    table: pd.DataFrame | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    status: str = "FINISHED"  # RUNNING / FINISHED / FAILED / KILLED (MLflow's names)
    experiment_id: str = ""
    parent_id: str | None = None  # the sweep's parent run
    start_time: int = 0  # ms since the epoch, as MLflow keeps it
    run_name: str = ""  # the name as logged ("" when the run has none)

    @property
    def label(self) -> str:
        """``name (id prefix)``, or the id of a run without a name: how messages name a run."""
        return f"{self.run_name} ({self.run_id[:8]})" if self.run_name else self.run_id

    def series(self, metric: str) -> pd.Series:
        if self.table is None or metric not in self.table.columns:
            return pd.Series(dtype=float)
        return as_series(self.table, metric)


def is_bookkeeping(key: str) -> bool:
    """Params that never change results (places: paths, cache dirs, tracking) at any depth."""
    return is_place_key(key)


def group_choice_keys(params: Mapping[str, str]) -> set[str]:
    """Dot-free params that name a config group (``conf_groups.GROUPS``, or has ``key.*`` siblings)."""
    keys = set(params)
    return {
        k
        for k in keys
        if "." not in k
        and not is_bookkeeping(k)
        and (k in GROUPS or any(o.startswith(k + ".") for o in keys))
    }
