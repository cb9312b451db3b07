"""Which items of a run get a trace (``tracking.trace_sample``, docs/tracing.md): every item up to
the cap, beyond it a seeded sample with every failure that fits (:func:`select_traced`)."""

from __future__ import annotations

import hashlib

import pandas as pd


def _rank(seed: int, item_id: str) -> str:
    return hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()


def select_traced(per_query: pd.DataFrame, cap: int | None, seed: int) -> tuple[pd.DataFrame, dict]:
    """The rows to trace and the rule's record (run tag ``traces_sampled``).

    Every row when ``cap`` is None or ``len(per_query) <= cap``. Otherwise exactly ``cap`` rows:
    the ``cap // 2`` items first in a seeded order (sha256 of ``seed:item_id``: the same items in
    every run of the eval set, so two runs can be compared trace by trace), then every failure
    (a failure label whose rate is better lower, ``evaluation.registry``, or an error) in the
    same order while room is left, then the next items in that order.
    """
    n = len(per_query)
    if cap is None or n <= cap:
        return per_query, {"rule": "all", "n": n, "traced": n}
    order = per_query.assign(_rank=[_rank(seed, str(i)) for i in per_query["id"]]).sort_values("_rank")
    failed = _failed(order)
    common = order.index[: cap // 2]
    rest = order.index[cap // 2 :]
    fails = [i for i in rest if failed[i]][: cap - len(common)]
    chosen = set(common) | set(fails)
    fill = [i for i in rest if i not in chosen][: cap - len(chosen)]
    keep = per_query.index.isin(chosen | set(fill))
    failed = failed.reindex(per_query.index)  # ``order``'s labels, back in the table's order
    record = {
        "rule": "seeded half + failures first + seeded fill",
        "cap": cap,
        "seed": seed,
        "n": n,
        "traced": int(keep.sum()),
        "failures": int(failed.sum()),
        "failures_traced": int(failed[keep].sum()),
    }
    return per_query[keep], record


def _failed(df: pd.DataFrame) -> pd.Series:
    from rag_experiments.evaluation.registry import higher_is_better

    bad = set()
    for label in df.get("failure_label", pd.Series(dtype=object)).dropna().unique():
        try:
            if higher_is_better(f"rate_{label}") is False:
                bad.add(label)
        except KeyError:
            continue
    err = df["error"].map(lambda e: isinstance(e, str)) if "error" in df.columns else False
    label = df["failure_label"].isin(bad) if "failure_label" in df.columns else False
    return pd.Series(label | err, index=df.index).astype(bool)
