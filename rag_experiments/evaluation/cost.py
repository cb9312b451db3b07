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


def cost_metrics(df: pd.DataFrame, pricing: Mapping[str, Mapping[str, Any] | None] | None = None) -> dict:
    """Run-level token sums, cost and latency percentiles.

    ``tokens_in/{stage}`` = sum over queries of ``tokens_in_{stage}`` (NaN rows, i.e. no usage
    reported, are left out; the key is not logged when no row has a value), same for out.
    ``cost_usd`` = sum over token stages (query transform, generation, judge; the transform's
    tokens counted once per item) of (tokens_in/1000 · price_per_1k_in + tokens_out/1000 ·
    price_per_1k_out) with ``pricing[stage]`` (absent: 0); NaN when a priced stage has queries
    without token counts (cost unknown, never silently 0).
    ``latency_p50_ms/{stage}``, ``latency_p95_ms/{stage}`` = 50th / 95th percentile (numpy
    linear interpolation) of ``latency_{stage}_s`` × 1000 over the queries with a value.
    """
    pricing = pricing or {}
    out: dict[str, float] = {}
    cost = 0.0
    for stage in token_stages():
        p_in, p_out = price(pricing.get(stage))
        # the query transform runs once per item, before replicates repeat the row
        rows = df.drop_duplicates("id") if stage == "query" and "id" in df.columns else df
        for side, p in (("in", p_in), ("out", p_out)):
            col = f"tokens_{side}_{stage}"
            v = (
                pd.to_numeric(rows[col], errors="coerce")
                if col in rows.columns
                else pd.Series(math.nan, rows.index)
            )
            if v.notna().any():
                out[f"tokens_{side}/{stage}"] = float(v.sum())
            if p > 0:  # every query with an answer (a transform) made this stage's calls: each needs a count
                ran_col = "latency_query_s" if stage == "query" else "answer"
                ran = rows[ran_col].notna() if ran_col in rows.columns else v.notna()
                cost += math.nan if v[ran].isna().any() else float(v.sum()) / 1000.0 * p
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


def serving_latency_ms(df: pd.DataFrame) -> pd.Series:
    """Per-query serving latency in ms: the sum of the serving steps' ``latency_<column>_s``
    (``core.slots``: query, retrieval, rerank, generation; the judge is evaluation, not serving); a
    missing column counts 0."""
    total = pd.Series(0.0, index=df.index)
    for col in (f"latency_{s.column}_s" for s in steps() if s.column and s.serving):
        if col in df.columns:
            total = total + pd.to_numeric(df[col], errors="coerce").fillna(0.0)
    return total * 1000.0
