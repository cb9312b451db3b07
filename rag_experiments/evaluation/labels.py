"""Failure labels: where the pipeline failed each query (decision table in :func:`failure_label`).

Thresholds come from ``rag_experiments/conf/attribution/default.yaml`` (read through
``importlib.resources``, so an installed package finds it too) or from the run's config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["FAILURE_LABELS", "RATE_LABELS", "Thresholds", "failure_label", "load_thresholds"]

#: Every label :func:`failure_label` can return, in display order.
FAILURE_LABELS = (
    "ok",
    "retrieval_failure",
    "generation_failure",
    "correct_without_evidence",
    "retrieved",
    "error",
)

#: Labels whose ``rate_{label}`` a generating run logs, in summary order. ``error`` is counted by
#: ``n_errors`` instead; ``retrieved`` only occurs in retrieval-only runs, which log just
#: ``rate_retrieval_failure`` (without an answer the other labels mean nothing).
RATE_LABELS = ("retrieval_failure", "generation_failure", "ok", "correct_without_evidence")
assert set(RATE_LABELS) <= set(FAILURE_LABELS)


@dataclass(frozen=True)
class Thresholds:
    correct: float = 0.5
    faithful: float = 0.5


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """Read ``conf/attribution/default.yaml`` of the package (or ``path``); missing keys keep the
    defaults, a missing ``path`` file gives the defaults."""
    import yaml

    if path is None:
        res = resources.files("rag_experiments") / "conf" / "attribution" / "default.yaml"
        text = res.read_text() if res.is_file() else ""
    else:
        p = Path(path)
        text = p.read_text() if p.exists() else ""
    return as_thresholds(yaml.safe_load(text) or {})


def as_thresholds(t: Any) -> Thresholds:
    """Thresholds from None, a Thresholds, a mapping (``correct``, ``faithful``) or a config node."""
    if t is None:
        return Thresholds()
    if isinstance(t, Thresholds):
        return t
    if isinstance(t, Mapping):
        return Thresholds(float(t.get("correct", 0.5)), float(t.get("faithful", 0.5)))
    return Thresholds(float(t.correct), float(t.faithful))


def _is_nan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def failure_label(
    answerable: bool,
    hit: bool,
    correctness: float | None,
    faithfulness: float | None,
    generated: bool,
    error: str | None,
    thresholds: Thresholds | Mapping[str, float] | None = None,
    contradicted: bool = False,
) -> str:
    """Label one query by where the pipeline failed it. The first matching row wins:

    ============================================================  ==========================
    case                                                          label
    ============================================================  ==========================
    ``error`` set (non-empty)                                     ``error``
    not generated (retrieval-only run), answerable and not hit    ``retrieval_failure``
    not generated, otherwise                                      ``retrieved``
    unanswerable item, correctness >= correct (it declined)       ``ok``
    unanswerable item, otherwise                                  ``generation_failure``
    answerable, hit, correct and (faithful or faithfulness NaN)   ``ok``
    answerable, hit, not correct or not faithful                  ``generation_failure``
    answerable, not hit, correct                                  ``correct_without_evidence``
    answerable, not hit, not correct                              ``retrieval_failure``
    ============================================================  ==========================

    ``hit`` means a relevant chunk was in the context given to the generator (hit@retriever.k).
    correct = ``correctness >= thresholds.correct``; faithful = ``faithfulness >=
    thresholds.faithful``. A NaN correctness counts as not correct (nothing silently passes); a
    NaN faithfulness (no scorable claims) does not count against the answer. ``contradicted``: the
    answer contradicts a key fact (``n_contradicted_key_facts`` > 0,
    ``evaluation.answer_scores.fact_status``), so it is not correct whatever its correctness.
    """
    th = as_thresholds(thresholds)
    if error:
        return "error"
    if not generated:
        return "retrieval_failure" if answerable and not hit else "retrieved"
    correct = not _is_nan(correctness) and float(correctness) >= th.correct and not contradicted
    if not answerable:
        return "ok" if correct else "generation_failure"
    faithful = _is_nan(faithfulness) or float(faithfulness) >= th.faithful
    if hit:
        return "ok" if correct and faithful else "generation_failure"
    return "correct_without_evidence" if correct else "retrieval_failure"
