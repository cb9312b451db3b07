"""Which traced production questions a human reviews: a stratified sample with exact inclusion probabilities.

The frame is the traces left after the time and tag filters, with near-duplicate questions merged
(each cluster is one unit, represented by its earliest trace, weighted by its size ``m``) and the
questions already in the eval set left out. Every design is **stratified simple random sampling
without replacement**, so each unit's inclusion probability is exact: π = n_h / N_h in its stratum h.

- ``failures``: stratum F = units with a failure signal (:func:`failure_reasons`: an error, a decline,
  no retrieved document, answer-context overlap below ``low_overlap``, a top retrieval score in the
  frame's lowest decile, or a judge's failure verdict when the trace carries one: a label or yes/no
  feedback, or a ``--judge`` score below the threshold), stratum R = the
  rest. F gets ``n − ⌈fill·n⌉`` slots (all of F, π = 1, when it is that small), R the rest, so every
  unit keeps π > 0 while R is not empty and a production estimate stays possible;
- ``disagreement``: F = units where two judges' verdicts (assessments named by ``judges``) differ
  (each read as pass/fail at ``threshold``), same allocation;
- ``uncertain``: F = units whose judge score lies within ``band`` of ``threshold``, same allocation;
- ``random``: strata by ``stratify_by`` (a tag key, ``day``, or none), proportional allocation
  (largest remainders), π_h = n_h / N_h; a stratum given no slot has π = 0 and is reported as not
  covered.

A slot a stratum cannot fill passes to the other. The draw is seeded (numpy ``default_rng(seed)``).
Pure functions; no MLflow (``tracking/trace_reader.py`` reads the traces).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rag_experiments.evaluation.answer_metrics import answer_context_overlap
from rag_experiments.evaluation.declines import is_decline

PICKS = ("failures", "disagreement", "uncertain", "random")
LOW_OVERLAP = 0.3  # answer-context overlap below this: most of the answer is not in the context
FAIL_VALUES = {"no", "false", "fail", "failed", "bad", "incorrect", "unsupported", "no_support"}


@dataclass(frozen=True)
class RetrievedDoc:
    text: str
    doc_id: str = ""
    score: float | None = None


@dataclass
class TracedQuery:
    """One traced request as read from MLflow: the root span's question and answer, the RETRIEVER
    spans' documents, the trace's tags and its feedback assessments (name → value)."""

    trace_id: str
    question: str
    answer: str | None
    docs: list[RetrievedDoc]
    timestamp_ms: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    feedback: dict[str, object] = field(default_factory=dict)
    error: bool = False
    has_retriever: bool = True
    experiment_id: str = ""


@dataclass
class Unit:
    """A sampling unit: a cluster of near-duplicate questions, represented by its earliest trace."""

    rep: TracedQuery
    members: list[str]  # trace ids, the representative first
    stratum: str = "all"
    reasons: list[str] = field(default_factory=list)
    pi: float = 0.0

    @property
    def m(self) -> int:
        return len(self.members)


@dataclass
class Design:
    """What was drawn and how: enough to recompute every π and to say what the sample covers."""

    pick: str
    n: int
    seed: int
    strata: dict[str, tuple[int, int]]  # stratum -> (N_h units, n_h drawn)
    frame_units: int
    frame_traces: int
    merged: int  # traces folded into another's cluster
    dedup_threshold: float
    in_evalset: int  # traces whose question is already in the eval set (outside the frame)
    time_range: tuple[int, int]
    tags: dict[str, int]  # tag "key=value" -> traces in the frame
    params: dict[str, object] = field(default_factory=dict)


# ------------------------------------------------------------------------------ signals


def _verdict(value: object, threshold: float) -> bool | None:
    """A feedback value read as pass (True) / fail (False); None when it is neither."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and not math.isnan(float(value)):
        return float(value) >= threshold
    if isinstance(value, str):
        v = value.strip().lower()
        if v in FAIL_VALUES or v.endswith("_failure"):
            return False
        if v in {"yes", "true", "pass", "ok", "good", "correct", "supported"}:
            return True
    return None


def failure_reasons(
    q: TracedQuery,
    low_score: float | None,
    low_overlap: float = LOW_OVERLAP,
    threshold: float = 0.5,
    judges: Sequence[str] = (),
) -> list[str]:
    """Judge-free failure signals of one trace, then judge verdicts it carries (``feedback``)."""
    out = []
    if q.error:
        out.append("error")
    if q.answer is not None and is_decline(q.answer):
        out.append("decline")
    if q.has_retriever and not q.docs:
        out.append("no_retrieval")
    scores = [d.score for d in q.docs if d.score is not None]
    if low_score is not None and scores and max(scores) < low_score:
        out.append("low_retrieval_score")
    if q.answer and q.docs and not out:
        ov = answer_context_overlap(q.answer, "\n".join(d.text for d in q.docs))
        if not math.isnan(ov) and ov < low_overlap:
            out.append(f"low_overlap({ov:.2f})")
    # verdicts: labels and yes/no values (``failure_label``, pass/fail scorers); a numeric score only
    # from a judge named by --judge (this project's runs log every metric as feedback: hit@1 = 0 is
    # a measurement, not a verdict)
    out += [
        f"judge:{k}"
        for k, v in sorted(q.feedback.items())
        if (k in judges or isinstance(v, bool | str)) and _verdict(v, threshold) is False
    ]
    return out


def low_score_cut(queries: Sequence[TracedQuery], quantile: float = 0.1) -> float | None:
    """The ``quantile`` of the traces' top retrieval scores (None with fewer than 10 scored traces):
    retrievers' score scales differ, so "low" is relative to this traffic."""
    tops = [max(s) for q in queries if (s := [d.score for d in q.docs if d.score is not None])]
    return float(np.quantile(tops, quantile)) if len(tops) >= 10 else None


# ------------------------------------------------------------------------------ the frame


def cluster(
    queries: Sequence[TracedQuery], encode: Callable[[list[str]], np.ndarray], threshold: float
) -> list[Unit]:
    """Greedy in time order: a question joins the first earlier cluster whose representative it
    matches with cosine ≥ ``threshold`` (``encode`` returns unit vectors), else starts its own."""
    qs = sorted(queries, key=lambda q: (q.timestamp_ms, q.trace_id))
    if not qs:
        return []
    vecs = np.asarray(encode([q.question for q in qs]), float)
    units: list[Unit] = []
    reps: list[int] = []
    for i, q in enumerate(qs):
        if reps:
            sims = vecs[reps] @ vecs[i]
            j = int(np.argmax(sims))
            if sims[j] >= threshold:
                units[j].members.append(q.trace_id)
                continue
        reps.append(i)
        units.append(Unit(q, [q.trace_id]))
    return units


def _norm(q: str) -> str:
    return " ".join(q.lower().split())


def frame(
    queries: Sequence[TracedQuery],
    encode: Callable[[list[str]], np.ndarray],
    dedup_threshold: float,
    known_questions: Sequence[str] = (),
) -> tuple[list[Unit], int]:
    """(units, traces left out as already in the eval set): exact question match after case and
    whitespace folding, or cosine ≥ ``dedup_threshold`` with an eval-set question."""
    known = {_norm(k) for k in known_questions}
    rest = [q for q in queries if _norm(q.question) not in known]
    if known_questions and rest:
        kv = np.asarray(encode(list(known_questions)), float)
        qv = np.asarray(encode([q.question for q in rest]), float)
        near = (qv @ kv.T).max(axis=1) >= dedup_threshold
        rest = [q for q, n in zip(rest, near, strict=True) if not n]
    return cluster(rest, encode, dedup_threshold), len(queries) - len(rest)


# ------------------------------------------------------------------------------ the draw


def _two_strata(n: int, n_f: int, n_r: int, fill: float) -> tuple[int, int]:
    """Slots for the signal stratum F and the rest R: F first, ⌈fill·n⌉ kept for R; unused slots move over."""
    keep_r = min(n_r, math.ceil(fill * n)) if n_r else 0
    take_f = min(n_f, n - keep_r)
    take_r = min(n_r, n - take_f)
    return take_f, take_r


def _proportional(n: int, sizes: dict[str, int]) -> dict[str, int]:
    """Largest-remainder proportional allocation of n slots, each stratum capped at its size."""
    total = sum(sizes.values())
    n = min(n, total)
    quota = {h: n * s / total for h, s in sizes.items()}
    alloc = {h: min(sizes[h], int(math.floor(q))) for h, q in quota.items()}
    for h in sorted(sizes, key=lambda h: (-(quota[h] - math.floor(quota[h])), h)):
        if sum(alloc.values()) >= n:
            break
        if alloc[h] < sizes[h]:
            alloc[h] += 1
    while sum(alloc.values()) < n:  # caps left slots over: give them to strata with room
        h = next(h for h in sorted(sizes) if alloc[h] < sizes[h])
        alloc[h] += 1
    return alloc


def stratum_key(q: TracedQuery, by: str | None) -> str:
    if not by:
        return "all"
    if by == "day":
        return time.strftime("%Y-%m-%d", time.gmtime(q.timestamp_ms / 1000))
    return f"{by}={q.tags.get(by, '')}"


def pick(
    units: list[Unit],
    how: str,
    n: int,
    seed: int = 0,
    fill: float = 0.2,
    judges: Sequence[str] = (),
    threshold: float = 0.5,
    band: float = 0.1,
    stratify_by: str | None = None,
) -> tuple[list[Unit], dict[str, tuple[int, int]]]:
    """(drawn units in frame order with ``pi`` and ``stratum`` set on every unit, {stratum: (N_h, n_h)})."""
    if how not in PICKS:
        raise ValueError(f"--pick {how!r}: expected one of {', '.join(PICKS)}")
    low = low_score_cut([u.rep for u in units])
    for u in units:
        if how == "failures":
            u.reasons = failure_reasons(u.rep, low, threshold=threshold, judges=judges)
            u.stratum = "signal" if u.reasons else "rest"
        elif how == "disagreement":
            a, b = (_verdict(u.rep.feedback.get(j), threshold) for j in judges)
            u.reasons = [f"{judges[0]}={a} {judges[1]}={b}"] if None not in (a, b) and a != b else []
            u.stratum = "signal" if u.reasons else "rest"
        elif how == "uncertain":
            v = u.rep.feedback.get(judges[0])
            near = (
                isinstance(v, int | float) and not isinstance(v, bool) and abs(float(v) - threshold) <= band
            )
            u.reasons = [f"{judges[0]}={float(v):.3f}"] if near else []
            u.stratum = "signal" if u.reasons else "rest"
        else:
            u.stratum = stratum_key(u.rep, stratify_by)
    sizes = Counter(u.stratum for u in units)
    if how == "random":
        alloc = _proportional(n, dict(sizes))
    else:
        f, r = _two_strata(n, sizes.get("signal", 0), sizes.get("rest", 0), fill)
        alloc = {"signal": f, "rest": r}
    rng = np.random.default_rng(seed)
    drawn: set[int] = set()
    for h in sorted(alloc):
        idx = [i for i, u in enumerate(units) if u.stratum == h]
        if not idx:
            continue
        for i in idx:
            units[i].pi = alloc[h] / len(idx)
        drawn |= {int(i) for i in rng.choice(idx, size=alloc[h], replace=False)}
    strata = {
        h: (sizes.get(h, 0), alloc.get(h, 0)) for h in sorted(set(sizes) | set(alloc)) if sizes.get(h, 0)
    }
    return [u for i, u in enumerate(units) if i in drawn], strata
