"""Per-query readings for the report: relevance from the logged rankings, and the worst queries."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from rag_experiments.core.query_table import cell
from rag_experiments.core.types import Chunk, Span
from rag_experiments.evaluation import metrics as M
from rag_experiments.report.load import Config
from rag_experiments.report.tables import fmt_num


def tag_list(tags: Any) -> list[str]:
    """The ``tags`` cell as a list (logged as a comma-separated string or a list)."""
    if tags is None or (isinstance(tags, float) and math.isnan(tags)):
        return []
    if isinstance(tags, str):
        return [x for x in tags.split(",") if x]
    return [str(x) for x in tags]


def min_coverage(c: Config) -> float:
    return float(c.params.get("metrics.min_coverage", 0.5))


def relevance_matrix(table: pd.DataFrame, min_cov: float) -> tuple[np.ndarray, np.ndarray]:
    """(rel, answerable) from the logged ``retrieved`` and ``gold_spans`` columns.

    Uses :func:`rag_experiments.evaluation.metrics.relevance_arrays`, the single definition of
    relevance, so hit@k for any k up to the ranking depth is exactly what the pipeline would have logged.
    """

    ranked, gold = [], []
    for ret, gs in zip(table["retrieved"], table["gold_spans"], strict=True):
        ranked.append(
            [
                Chunk(r["chunk_id"], r["doc_id"], int(r["start"]), int(r["end"]), "")
                for r in sorted(cell("retrieved", ret), key=lambda r: r["rank"])
            ]
        )
        gold.append([Span(s["doc_id"], int(s["start"]), int(s["end"])) for s in cell("gold_spans", gs)])
    rel, _, _ = M.relevance_arrays(ranked, gold, [], min_cov)
    answerable = np.array([bool(g) for g in gold])
    return rel, answerable


# Worst first: errors, then retrieval failures, generation failures, correct without evidence.
SEVERITY = {"error": 0, "retrieval_failure": 1, "generation_failure": 2, "correct_without_evidence": 3}


def worst(c: Config, k: int, n: int, gen: bool) -> pd.DataFrame:
    """The ``n`` worst queries of a config, with ``_first`` (rank of the first relevant chunk, 0: none).

    Order: failure-label severity, then (with generation) correctness and faithfulness, then
    reciprocal rank, evidence_recall@k and nDCG@k, lowest first; ties by id. Retrieval-only runs
    leave out unanswerable items (they have no retrieval verdict); generating runs leave out the
    items never generated (outside ``evalset.generation_subset``: no answer and no error).
    """
    t = c.table.copy()
    rel, answerable = relevance_matrix(t, min_coverage(c))
    first = np.where(rel.any(axis=1), rel.argmax(axis=1) + 1, 0) if rel.size else np.zeros(len(t), int)
    t["_first"] = first
    t["_rel"] = list(rel) if rel.size else [np.zeros(0, bool)] * len(t)
    t["_answerable"] = answerable
    t["_sev"] = t.get("failure_label", pd.Series("", index=t.index)).map(lambda x: SEVERITY.get(x, 9))
    if not gen:
        t = t[t["_answerable"]]
    else:
        t = t[generated_rows(t)]
    keys = ["_sev"]
    for col in (["correctness", "faithfulness"] if gen else []) + [
        "mrr",
        f"evidence_recall_at_{k}",
        f"ndcg_at_{k}",
    ]:
        if col in t.columns:
            keys.append(col)
    t = t.sort_values(keys + ["id"], kind="stable", na_position="last")
    return t.head(n)


def generated_rows(t: pd.DataFrame) -> pd.Series:
    """True for the rows a generator answered or failed on (an ``answer`` or an ``error``)."""
    got = pd.Series(False, index=t.index)
    for col in ("answer", "error"):
        if col in t.columns:
            got |= t[col].notna() & (t[col].astype(str) != "")
    return got if ("answer" in t.columns or "error" in t.columns) else ~got


def worst_query_headers(gen: bool) -> list[str]:
    headers = ["id", "query", "tags", "gold span(s)", "failure label", "first rel.", "top 3 retrieved"]
    return headers + (["correct.", "faithf.", "answer"] if gen else [])


def worst_rows(t: pd.DataFrame, gen: bool) -> list[list[str]]:
    """Rows for :func:`worst_query_headers`: top 3 chunks marked ✓ relevant / ✗ not, answers cut at 200."""
    rows = []
    for _, r in t.iterrows():
        ret = sorted(cell("retrieved", r.get("retrieved")), key=lambda x: x["rank"])[:3]
        rel = r["_rel"]
        top = "; ".join(
            f"{x['rank']}. {x['chunk_id']} {'✓' if i < len(rel) and rel[i] else '✗'}"
            for i, x in enumerate(ret)
        )
        gold = (
            "; ".join(f"{s['doc_id']}[{s['start']}:{s['end']}]" for s in cell("gold_spans", r.get("gold_spans")))
            or "(unanswerable)"
        )
        row = [
            str(r["id"]),
            str(r["query"]),
            ", ".join(tag_list(r.get("tags"))),
            gold,
            str(r.get("failure_label", "")),
            str(int(r["_first"])) if r["_first"] else "none",
            top,
        ]
        if gen:
            ans = str(r.get("answer") or "")
            row += [
                fmt_num(r.get("correctness"), 2),
                fmt_num(r.get("faithfulness"), 2),
                ans[:200] + ("…" if len(ans) > 200 else ""),
            ]
        rows.append(row)
    return rows


def worst_query_rows(c: Config, k: int, n: int, gen: bool) -> list[list[str]]:
    return worst_rows(worst(c, k, n, gen), gen)
