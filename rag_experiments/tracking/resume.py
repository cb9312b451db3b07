"""The resume rule, written once for every run store (``tracking.run_store``): which earlier run a
config about to run can stand on, and why not when it cannot (docs/architecture.md, "Identity,
cache keys and resume"). Pure: the MLflow store and the in-memory one hand it what they found.
No MLflow here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from rag_experiments.core.run_record import RunData
from rag_experiments.core.slots import steps

#: The tag naming the run that computed a reused run's results (``tracking.reuse``).
REUSED_FROM = "reused_from"
#: Tags that describe a run's own place (set when it starts), never copied onto a reused run.
OWN_TAGS = frozenset({"sweep_id", "overrides", "command", "runner"})
TRACES_EXPECTED = "traces_expected"  # tag: traces a run should have, set before they are written


class Resume(NamedTuple):
    """A store's resume decision: ``done``, the FINISHED run to reuse (None: run the config), and
    ``why`` (printed as ``[skip]`` or ``[rerun]``; "" when no earlier run matches at all)."""

    done: RunData | None
    why: str


def original_run_id(tags: Mapping[str, str], run_id: str) -> str:
    """The run that computed a run's results: itself unless it is a reused copy (``REUSED_FROM``)."""
    return tags.get(REUSED_FROM) or run_id


def incomplete_reason(tags: Mapping[str, str], metrics: Mapping[str, float], has_table: bool) -> str:
    """Why a FINISHED run cannot be reused ("" when it is complete), first match:

    - items a step failed on (its slot's ``errors`` metric > 0, ``core.slots``: ``n_query_errors``,
      ``n_rerank_errors``, ``n_errors``, ``n_judge_errors``); failures are never cached, so a
      re-run redoes exactly those;
    - no per-query table (``has_table``: ``per_query.parquet`` in MLflow);
    - fewer traces written (tag ``traces`` = ``{"n": ...}``, set after the last) than expected
      (tag ``traces_expected``, set before the first); a run from before ``traces_expected``
      existed counts as complete only with its ``traces`` tag.

    The status is set last (``run.sweep.execute``), so this catches runs an older version, or a
    kill in that window, left FINISHED without everything."""
    for s in steps():
        if s.errors and metrics.get(s.errors, 0) > 0:
            return f"{int(metrics[s.errors])} {s.step} errors to retry ({s.errors})"
    if not has_table:
        return "no per_query.parquet artifact"
    written = json.loads(tags.get("traces") or "{}").get("n")
    expected = tags.get(TRACES_EXPECTED)
    if expected is None:
        return "" if written is not None else "no traces recorded"
    if int(expected) > 0 and (written is None or int(written) < int(expected)):
        return f"{written or 0} of {expected} traces written"
    return ""


def decide(
    chash: str,
    fingerprint: str,
    candidates: Iterable[tuple[str, str]],
    previous: Callable[[], tuple[str, str] | None],
) -> tuple[str | None, str]:
    """(the run id to reuse or None, why) for a config about to run.

    ``candidates``: (run id, :func:`incomplete_reason`) of the FINISHED runs with this
    ``config_hash`` AND this ``code_fingerprint``, newest first (read lazily: the first complete
    one is reused). ``previous()``: (run id, its ``code_fingerprint`` or "none recorded") of the
    newest FINISHED run of this ``config_hash`` whatever its code, or None; asked only when no candidate is complete
    and none is incomplete. ``why`` is "" when no earlier run matches the config at all.
    """
    gaps = []
    for rid, gap in candidates:
        if gap:
            gaps.append(f"run {rid} is FINISHED but incomplete ({gap})")
            continue
        return rid, (
            f"config_hash {chash} and code_fingerprint {fingerprint} already FINISHED as run {rid} "
            "(force=true re-runs)"
        )
    if gaps:
        return None, "; ".join(gaps)
    old = previous()
    if old is None:
        return None, ""
    rid, before = old
    return None, f"code changed since run {rid} (fingerprint {before} -> {fingerprint})"
