"""Judge self-consistency: the verdicts of ``judge.repeats`` asks of a stochastic judge (docs/judges.md).

Repeat 0 is the run's judge; its verdicts are the ones every metric uses, so ``repeats`` adds a
measurement and changes no other figure. Repeats 2..N are the same judge with ``seed + r`` (their
own identity, so each repeat's verdicts are cached separately and a resumed run re-asks nothing).
Per query the table gets ``judge_flip_rate`` (registered; its mean with CI is the run's flip rate)
and ``judge_repeat_labels``: per claim, the N labels in repeat order (a list of lists). Repeats stay inside the
query row, so every reader (and ``collapse_replicates``) sees one row per (item, replicate) as
before; :func:`judge_repeat_long` unfolds them into a long view with a ``judge_repeat`` column for the
variance split (``var_share/faithfulness/judge``, docs/noise.md). Only faithfulness is re-judged by
the repeats (claims are split once, answer relevance is asked once, correctness is a string match).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pandas as pd

from rag_experiments.core.cache import StageCache
from rag_experiments.core.progress import track
from rag_experiments.core.query_table import cell
from rag_experiments.judge.cached import cached_verdicts
from rag_experiments.judge.claims import label_faithfulness

#: The per-query metrics the judge repeats re-score (one value per repeat); the others do not vary
#: with the judge's repeat.
REPEATED_METRICS = ("faithfulness",)
LABELS_COLUMN = "judge_repeat_labels"


def claim_flips(labels: Sequence[Sequence[str]]) -> list[bool]:
    """Per claim, True when its labels across repeats are not all equal (``labels[claim][repeat]``)."""
    return [len(set(ls)) > 1 for ls in labels]


def query_flip_rate(labels: Sequence[Sequence[str]]) -> float:
    """flipped claims / claims of the query (:func:`claim_flips`); NaN when it has no claim."""
    flips = claim_flips(labels)
    return sum(flips) / len(flips) if flips else math.nan


def repeat_columns(
    repeats: Sequence[Any],
    judged: Sequence[Any],
    contexts: Sequence[str],
    cache: StageCache,
    calls: Counter,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Per judged answer (``judge_stage``'s ``JudgedAnswer``), its claims re-judged by each repeat judge:
    ``{"judge_flip_rate", "judge_repeat_labels"}`` ({} for a query not judged). The repeats' token
    usage joins the query's judge tally, so judge tokens and cost count every repeat."""
    out: list[dict[str, Any]] = []
    rows = list(zip(judged, contexts, strict=True))
    for j, context in track(rows, "judging: repeats", enabled=progress and bool(repeats), unit="answers"):
        if j is None or not repeats:
            out.append({})
            continue
        claims, verdicts, tally = j.claims, j.verdicts, j.usage
        per_repeat = [[v.label for v in verdicts]]
        for rj in repeats:
            vs = cached_verdicts(rj, claims, context, cache, calls, tally, "repeat_verdicts")
            per_repeat.append([v.label for v in vs])
        by_claim = [list(ls) for ls in zip(*per_repeat, strict=True)]
        out.append(
            {"judge_flip_rate": query_flip_rate(by_claim), "judge_repeat_labels": by_claim}
        )
    return out


def repeat_scores(by_claim: Sequence[Sequence[str]] | None) -> list[float]:
    """Faithfulness of each judge repeat from a row's ``judge_repeat_labels`` (per claim, the label of
    each repeat): repeat j scores ``label_faithfulness([labels[c][j] for each claim c])`` (the formula
    of the run's faithfulness, so repeat 0 equals the row's ``faithfulness``); [] for a row without
    repeats or claims."""
    by_claim = cell(LABELS_COLUMN, by_claim)  # JSON text in tables written before the schema
    if not by_claim:
        return []
    return [label_faithfulness([c[j] for c in by_claim]) for j in range(len(by_claim[0]))]


def n_judge_repeats(df: pd.DataFrame) -> int:
    """Judge repeats per row of a per-query table (1 without a ``judge_repeat_labels`` column)."""
    if LABELS_COLUMN not in df.columns:
        return 1
    return max([len(repeat_scores(v)) for v in df[LABELS_COLUMN]] + [1])


def judge_repeat_long(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The long view ``id, replicate, judge_repeat, {metric}``: one row per (item, replicate, judge
    repeat). For a re-judged metric (:data:`REPEATED_METRICS`) the values come from
    :func:`repeat_scores` (a row with fewer repeats, e.g. no claims, gets NaN for the missing ones);
    any other metric, or a table without repeats, has ``judge_repeat`` 0 only. ``replicate`` is 0
    when the table is not replicated."""
    reps = df["replicate"] if "replicate" in df.columns else pd.Series(0, index=df.index)
    n = n_judge_repeats(df) if metric in REPEATED_METRICS else 1
    if n <= 1:
        return pd.DataFrame({"id": df["id"], "replicate": reps, "judge_repeat": 0, metric: df[metric]})
    recs = []
    for i, rep, labels in zip(df["id"], reps, df[LABELS_COLUMN], strict=True):
        scores = repeat_scores(labels)
        scores += [math.nan] * (n - len(scores))
        recs += [(i, rep, j, v) for j, v in enumerate(scores)]
    return pd.DataFrame.from_records(recs, columns=["id", "replicate", "judge_repeat", metric])
