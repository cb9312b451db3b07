"""Tokens, money and latency percentiles of a run (docs/metrics.md, "Cost and tokens").

Pure functions over the per-query table: the pipeline adds the token columns from each reply's
``usage`` and logs :func:`cost_metrics` next to the quality aggregates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from rag_experiments.core.slots import steps
from rag_experiments.core.steps import StepRecord


def latency_stages() -> tuple[str, ...]:
    """Steps whose per-query wall time is a ``latency_{stage}_s`` column (``core.slots``: ``column``)."""
    return tuple(s.column for s in steps() if s.column)


def token_stages() -> tuple[str, ...]:
    """Steps whose model calls report tokens (``tokens_in_{stage}`` / ``tokens_out_{stage}``)."""
    return tuple(s.column for s in steps() if s.priced)


def usage_columns(usage: Mapping[str, Any] | None, stage: str = "generation") -> dict[str, float]:
    """``tokens_in_{stage}`` / ``tokens_out_{stage}`` from an OpenAI-style ``usage`` mapping
    (``prompt_tokens`` / ``completion_tokens``); NaN when the endpoint sent none, never 0."""
    usage = usage or {}

    def num(key: str) -> float:
        v = usage.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan

    return {f"tokens_in_{stage}": num("prompt_tokens"), f"tokens_out_{stage}": num("completion_tokens")}


def add_usage(*usages: Mapping[str, Any] | None) -> dict[str, float] | None:
    """Sum of OpenAI-style usages (``prompt_tokens``, ``completion_tokens``) of several calls.

    None (unknown, never 0) when any usage is None or lacks a count; no usages at all: 0 tokens.
    """
    total = {"prompt_tokens": 0.0, "completion_tokens": 0.0}
    for u in usages:
        if u is None:
            return None
        for key in total:
            v = u.get(key)
            if not isinstance(v, int | float) or isinstance(v, bool) or math.isnan(v):
                return None
            total[key] += v
    return total


def price(pricing: Mapping[str, Any] | None) -> tuple[float, float]:
    """``(price_per_1k_in, price_per_1k_out)`` in USD from a config ``pricing`` mapping; absent = 0
    (local models). A negative or non-numeric price raises ValueError naming the key."""
    out = []
    for key in ("price_per_1k_in", "price_per_1k_out"):
        v = (pricing or {}).get(key, 0.0)
        try:
            v = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"pricing.{key}: must be a number of USD per 1000 tokens, got {v!r}") from None
        if v < 0 or math.isnan(v):
            raise ValueError(f"pricing.{key}: must be >= 0, got {v}")
        out.append(v)
    return out[0], out[1]


def stage_costs(df: pd.DataFrame, pricing: Mapping[str, Mapping[str, Any] | None] | None = None
                ) -> dict[str, dict[str, float]]:  # fmt: skip
    """Per priced step (``core.slots``: ``priced``; keyed by its ``column``): ``tokens_in`` /
    ``tokens_out`` (sums over queries of ``tokens_{in,out}_{column}``, NaN rows left out; absent
    when no row has a value) and ``cost_usd`` = tokens_in/1000 · price_per_1k_in + tokens_out/1000
    · price_per_1k_out with ``pricing[column]`` (absent: 0), NaN when a priced step has queries it
    ran on without token counts (cost unknown, never silently 0). A retrieval-half step (phase
    ``before_answer``: the query transform) runs once per item, before replicates repeat the row: its
    tokens count once per item, and it ran where its ``latency_<column>_s`` is set; a generate or
    judge step ran where there is an answer."""
    pricing = pricing or {}
    out: dict[str, dict[str, float]] = {}
    for s in steps():
        if not s.priced:
            continue
        stage, row = s.column, {"cost_usd": 0.0}
        p_in, p_out = price(pricing.get(stage))
        rows = df.drop_duplicates("id") if s.phase == "before_answer" and "id" in df.columns else df
        for side, p in (("in", p_in), ("out", p_out)):
            col = f"tokens_{side}_{stage}"
            v = (
                pd.to_numeric(rows[col], errors="coerce")
                if col in rows.columns
                else pd.Series(math.nan, rows.index)
            )
            if v.notna().any():
                row[f"tokens_{side}"] = float(v.sum())
            if p > 0:  # every query the step ran on made its calls: each needs a count
                ran_col = f"latency_{stage}_s" if s.phase == "before_answer" else "answer"
                ran = rows[ran_col].notna() if ran_col in rows.columns else v.notna()
                row["cost_usd"] += math.nan if v[ran].isna().any() else float(v.sum()) / 1000.0 * p
        out[stage] = row
    return out


def cost_metrics(df: pd.DataFrame, pricing: Mapping[str, Mapping[str, Any] | None] | None = None) -> dict:
    """Run-level token sums, cost and latency percentiles.

    ``tokens_in/{stage}``, ``tokens_out/{stage}`` and the stage's cost: :func:`stage_costs`.
    ``cost_usd`` = the sum of the priced steps' costs (query transform, generation, judge); NaN
    when one is unknown.
    ``latency_p50_ms/{stage}``, ``latency_p95_ms/{stage}`` = 50th / 95th percentile (numpy
    linear interpolation) of ``latency_{stage}_s`` × 1000 over the queries with a value.
    """
    out: dict[str, float] = {}
    cost = 0.0
    for stage, row in stage_costs(df, pricing).items():
        out.update({f"{k}/{stage}": v for k, v in row.items() if k != "cost_usd"})
        cost += row["cost_usd"]
    out["cost_usd"] = cost
    for stage in latency_stages():
        col = f"latency_{stage}_s"
        if col not in df.columns:
            continue
        v = pd.to_numeric(df[col], errors="coerce").dropna().to_numpy(float)
        if v.size:
            out[f"latency_p50_ms/{stage}"] = float(np.percentile(v, 50) * 1000.0)
            out[f"latency_p95_ms/{stage}"] = float(np.percentile(v, 95) * 1000.0)
    return out


def step_rows(records: Mapping[str, StepRecord], costs: Mapping[str, Mapping[str, float]]) -> list[dict]:
    """The per-step table of a run, one row per step that ran, in run order (``core.slots``):
    ``step``, ``seconds`` (the loop's wall time), ``calls`` (model calls, every kind), ``items``,
    ``errors`` (items it failed on), ``tokens_in`` / ``tokens_out`` and ``cost_usd`` for a priced
    step (:func:`stage_costs`; None when unknown or not priced). The run tag ``steps`` holds it; the
    report's per-step table reads it."""
    out = []
    for s in steps():
        r = records.get(s.name)
        if r is None:
            continue
        c = costs.get(s.column, {})
        row = {"step": s.step, "seconds": round(r.seconds, 3), "calls": sum(r.calls.values()), "items": r.items,
               "errors": r.failed}  # fmt: skip
        for key in ("tokens_in", "tokens_out", "cost_usd"):
            v = c.get(key)
            row[key] = None if v is None or math.isnan(v) else v
        out.append(row)
    return out


def serving_latency_ms(df: pd.DataFrame) -> pd.Series:
    """Per-query serving latency in ms: the sum of the serving steps' ``latency_<column>_s``
    (``core.slots``: query, retrieval, rerank, generation; the judge is evaluation, not serving); a
    missing column counts 0."""
    total = pd.Series(0.0, index=df.index)
    for col in (f"latency_{s.column}_s" for s in steps() if s.column and s.serving):
        if col in df.columns:
            total = total + pd.to_numeric(df[col], errors="coerce").fillna(0.0)
    return total * 1000.0
