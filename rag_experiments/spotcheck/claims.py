"""The run's judged claims, one row each, and the seeded borderline-weighted sample of them.

``COLUMNS`` is the label CSV's full column contract; ``sample`` writes it **blind** by default
(:data:`BLIND_COLUMNS`: no judge verdict, score or rationale beside the empty human column, so the
judge cannot anchor the human), ``labels`` reads either back, and ``score`` restores the judge's
columns from the run by ``item_id`` (:func:`with_judge_columns`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from rag_experiments.core.query_table import cell
from rag_experiments.core.run_record import RunData
from rag_experiments.judge.agreement import inclusion_probabilities, systematic_pps
from rag_experiments.tracking.runs import RunInputError

COLUMNS = [
    "item_id",
    "query",
    "claim",
    "context",
    "judge_verdict",
    "judge_score",
    "judge_rationale",
    "answer",
    "inclusion_prob",
    "human_verdict",
]
#: The judge's columns: hidden from the labeller by default (``sample --show-judge`` keeps them).
JUDGE_COLUMNS = ("judge_verdict", "judge_score", "judge_rationale")
BLIND_COLUMNS = [c for c in COLUMNS if c not in JUDGE_COLUMNS]
#: The 3 in 1 + 3·exp(−|score − threshold| / s): a claim's weight is 4 at the threshold, → 1 far from it.
BORDERLINE_BOOST = 3.0


def item_id(query_id: str, index: int) -> str:
    return f"{query_id}#{index}"


def judged_claims(table: pd.DataFrame) -> pd.DataFrame:
    """One row per judged claim (columns of the CSV except ``human_verdict``), in table order."""
    if "verdicts" not in table.columns:
        raise RunInputError("the run has no judged claims (no 'verdicts' column: a retrieval-only run?)")
    rows = []
    for r in table.itertuples(index=False):
        rd = r._asdict()
        for i, v in enumerate(cell("verdicts", rd.get("verdicts"))):
            score = v.get("score")
            rows.append(
                {
                    "item_id": item_id(str(rd["id"]), i),
                    "query": rd.get("query", ""),
                    "claim": v.get("claim", ""),
                    "context": rd.get("context", "") or "",
                    "judge_verdict": v.get("label", ""),
                    "judge_score": float(score) if score is not None else float("nan"),
                    "judge_rationale": v.get("rationale", "") or "",
                    "answer": rd.get("answer", "") or "",
                }
            )
    return pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("inclusion_prob", "human_verdict")])


def judge_threshold(run: RunData) -> float | None:
    """The score threshold the judge decides at (LLM judges: ``judge.threshold``; heuristic:
    ``judge.sim_threshold``), from the run's params."""
    params = run.params
    for key in ("judge.threshold", "judge.sim_threshold"):
        try:
            return float(params[key])
        except (KeyError, TypeError, ValueError):
            continue
    return None


def sample_weights(scores: np.ndarray, threshold: float | None) -> np.ndarray:
    """``1 + 3·exp(−|score − threshold| / s)``; all ones without scores or threshold."""
    w = np.ones(len(scores))
    if threshold is None:
        return w
    d = np.abs(np.asarray(scores, float) - threshold)
    ok = ~np.isnan(d)
    if not ok.any():
        return w
    scale = float(np.median(d[ok])) or 1e-9
    w[ok] += BORDERLINE_BOOST * np.exp(-d[ok] / scale)
    return w


def sample_claims(
    claims: pd.DataFrame, n: int, stratify: bool = False, seed: int = 0, threshold: float | None = None
) -> pd.DataFrame:
    """n claims, seeded, borderline ones over-weighted; stratified by verdict when asked.

    Within the population (or each verdict stratum with its quota q) claim i is drawn with
    probability π_i = min(1, c·w_i), Σπ = q (:func:`inclusion_probabilities`, systematic πps);
    π_i is recorded as ``inclusion_prob`` so that scores can be weighted back to the run.
    """
    rng = np.random.default_rng(seed)
    w = sample_weights(claims["judge_score"].to_numpy(float), threshold)
    idx = np.arange(len(claims))
    groups, quota = {"all": idx}, {"all": n}
    if stratify:
        labels = sorted(claims["judge_verdict"].unique())
        groups = {lab: idx[(claims["judge_verdict"] == lab).to_numpy()] for lab in labels}
        quota = dict.fromkeys(labels, 0)
        left = n
        while left > 0:  # even split; a label with too few claims passes its share on
            open_ = [lab for lab in labels if quota[lab] < len(groups[lab])]
            if not open_:
                break
            for lab in open_:
                if left == 0:
                    break
                quota[lab] += 1
                left -= 1
    pi = np.zeros(len(claims))
    chosen: list[int] = []
    for lab, g in groups.items():
        pi[g] = inclusion_probabilities(w[g], quota[lab])
        chosen += list(g[systematic_pps(pi[g], rng)]) if quota[lab] else []
    out = claims.iloc[sorted(chosen)].copy()
    out["inclusion_prob"] = pi[sorted(chosen)]
    out["human_verdict"] = ""
    return out.reset_index(drop=True)


def with_judge_columns(labelled: pd.DataFrame, claims: pd.DataFrame) -> pd.DataFrame:
    """``labelled`` (rows of a label file, any subset of :data:`COLUMNS`) in :data:`COLUMNS` order
    with the judge's columns taken from the run's ``claims`` by ``item_id``: what a blind file
    left out, restored for reading judge and human side by side after scoring. An ``item_id``
    the run does not have gets empty judge cells."""
    judge = claims.set_index("item_id")[list(JUDGE_COLUMNS)]
    out = labelled.drop(columns=[c for c in JUDGE_COLUMNS if c in labelled.columns])
    out = out.join(judge, on="item_id")
    return out.reindex(columns=[c for c in COLUMNS if c in out.columns or c in JUDGE_COLUMNS])
