"""Replicated per-query tables (``replicates: R``): one row per (item, replicate), and back.

With ``replicates: R > 1`` the pipeline generates and judges every item R times (generator seeds
``seed + r``) and the per-query table is long: one row per (item, replicate) with a ``replicate``
column (0 … R−1) and a ``generation_seed`` column. Retrieval does not depend on the replicate, so
its columns are repeated, identical, on every replicate row; they are never weighted R× because
every reader first collapses the table with :func:`collapse_replicates` (``aggregate``,
``tracking.runs.load_per_query`` and so compare, gate, report, select and spotcheck, the traces).
A table without a ``replicate`` column (R = 1, the default) passes through unchanged.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["REPLICATE_COLUMNS", "collapse_replicates", "flip_rates", "is_replicated", "n_replicates"]

#: The columns that index a replicate row (absent from an unreplicated table).
REPLICATE_COLUMNS = ("replicate", "generation_seed")
#: Per-replicate values kept, as a list of dicts in the collapsed ``replicates`` column, for the traces.
_KEPT = (
    "replicate", "generation_seed", "answer", "failure_label", "correctness", "faithfulness", "error",
    "judge_repeat_labels",  # judge.repeats: each replicate's per-claim labels of every judge repeat
)


def is_replicated(df: pd.DataFrame) -> bool:
    return "replicate" in df.columns


def n_replicates(df: pd.DataFrame) -> int:
    """Replicates per query (the largest count of rows of one id); 1 for an unreplicated table."""
    if not is_replicated(df) or df.empty:
        return 1
    return int(df.groupby("id", sort=False).size().max())


def _modal(labels: pd.Series) -> object:
    """The most frequent value; ties go to the value seen first (the lowest replicate)."""
    vals = labels.dropna()
    if vals.empty:
        return labels.iloc[0] if len(labels) else None
    counts = vals.value_counts(sort=False)
    return counts.index[int(np.argmax(counts.to_numpy()))]


def _replicate_records(g: pd.DataFrame) -> list[dict]:
    cols = [c for c in _KEPT if c in g.columns]
    recs = g[cols].to_dict("records")
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in recs]


def collapse_replicates(df: pd.DataFrame) -> pd.DataFrame:
    """One row per query: numeric columns the mean over its replicates (NaN replicates left out, all
    NaN stays NaN), other columns from replicate 0, except ``failure_label`` (the modal label over
    the replicates, ties to the lowest replicate) and ``error`` (set only when every replicate
    failed). Adds ``n_replicates`` and ``replicates`` (a list of dicts: each replicate's seed, answer,
    label, correctness, faithfulness, error and, with judge repeats, its ``judge_repeat_labels``).
    Row order: first appearance of each id. Judge repeats stay inside each row (nothing to collapse:
    the run's metrics use repeat 0). Tables without a ``replicate`` column are returned unchanged."""
    if not is_replicated(df):
        return df
    df = df.sort_values(["replicate"], kind="stable")
    groups = df.groupby("id", sort=False)
    first = groups.head(1).set_index("id")
    order = pd.unique(df["id"])
    num = [
        c
        for c in df.columns
        if c not in ("id", *REPLICATE_COLUMNS)
        and pd.api.types.is_numeric_dtype(df[c])
        and not pd.api.types.is_bool_dtype(df[c])
    ]
    out = first.copy()
    if num:
        out[num] = groups[num].mean()  # pandas' mean skips NaN; all NaN gives NaN
    if "failure_label" in df:
        out["failure_label"] = groups["failure_label"].agg(_modal)
    if "error" in df:
        all_failed = groups["error"].agg(lambda e: e.notna().all())
        out["error"] = out["error"].where(all_failed, None)
    out["n_replicates"] = groups.size()
    out["replicates"] = pd.Series({k: _replicate_records(g) for k, g in groups}, dtype=object)
    out = out.drop(columns=[c for c in REPLICATE_COLUMNS if c in out.columns])
    return out.loc[order].reset_index()


def flip_rates(df: pd.DataFrame, correct_threshold: float) -> dict[str, float]:
    """Share of queries whose outcome differs between replicates, over the queries with at least
    two scored replicates: ``replicate_flip/failure_label`` (the failure label is not the same in
    every replicate) and ``replicate_flip/correctness`` (correct = correctness >= the attribution
    threshold ``correct``, in some replicates and not in others). Replicates whose generation failed
    are left out. An unreplicated table gives {}."""
    if not is_replicated(df):
        return {}
    ok = df[df["generated"].astype(bool)] if "generated" in df else df  # outside generation_subset: no answer
    ok = ok[ok["error"].isna()] if "error" in ok else ok
    out: dict[str, float] = {}
    if "failure_label" in ok:
        lab = ok.dropna(subset=["failure_label"]).groupby("id")["failure_label"]
        n = lab.size()
        flips = lab.nunique()[n >= 2] > 1
        out["replicate_flip/failure_label"] = float(flips.mean()) if len(flips) else math.nan
    if "correctness" in ok:
        cor = ok.dropna(subset=["correctness"])
        correct = (cor["correctness"] >= correct_threshold).groupby(cor["id"])
        n = correct.size()
        flips = correct.nunique()[n >= 2] > 1
        out["replicate_flip/correctness"] = float(flips.mean()) if len(flips) else math.nan
    return out
