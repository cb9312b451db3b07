"""The answer matrix: eval items (rows) × configs (columns), each cell the config's answer to the
item with its failure label, correctness, faithfulness, assertion results, whether the top k held
gold evidence, and a link to the item's MLflow trace (issue 45; promptfoo's output matrix).

``answer_matrix`` builds plain data from the report's configs; ``render_answer_matrix`` lays it out
as one self-contained HTML page (``templates/answers.html.j2``: the data as JSON in the page, a small
inline script for the filters and the config chooser; no network, no external file), so a 30-config
sweep stays readable: the page shows the configs chosen in its control, ordered by the sweep's
factors, and filters rows by tag, by label, by "differs across the shown configs" and by "fails an
assertion".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rag_experiments.core.query_table import cell
from rag_experiments.report.render import render_page

#: Configs shown when the page opens (the control shows the others).
SHOWN = 6


@dataclass(frozen=True)
class MatrixConfig:
    label: str
    levels: dict[str, str]  # factor → level
    run_id: str
    k: int  # the chunks this config handed the generator (its retriever.k): "gold in top k"


@dataclass(frozen=True)
class MatrixCell:
    answer: str | None  # None: not generated for this config (retrieval only, outside the subset)
    label: str
    error: str
    correctness: float | None
    faithfulness: float | None
    hit: bool | None  # the top k held gold evidence (None: unanswerable)
    checks: list[dict[str, Any]] = field(default_factory=list)  # type, value, critical, passed, detail
    trace: str = ""  # the item's trace in the MLflow UI ("" when the run has none)


@dataclass(frozen=True)
class MatrixRow:
    id: str
    query: str
    tags: list[str]
    cells: list[MatrixCell | None]  # per config, in AnswerMatrix.configs order; None: item not in the run


@dataclass(frozen=True)
class AnswerMatrix:
    title: str
    k: int
    factors: list[str]
    configs: list[MatrixConfig]
    rows: list[MatrixRow]
    labels: list[str]  # every failure label seen
    tags: list[str]  # every tag seen
    # the page opens on the items some config answered when the others were never generated
    # (generation_subset): a 168-item sweep that generated 6 answers per config is 6 rows, not 168
    answered_only: bool = False


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else round(f, 4)


def _cell(row: Mapping[str, Any], k: int, trace: str) -> MatrixCell:
    answer = row.get("answer")
    generated = isinstance(answer, str) and row.get("generated", True) is not False
    hit = _num(row.get(f"hit_at_{k}"))
    checks = [
        {key: c.get(key) for key in ("type", "value", "critical", "passed", "detail")}
        for c in cell("assertions", row.get("assertions"), [])
        if isinstance(c, Mapping)
    ]
    error = row.get("error")
    return MatrixCell(
        answer=answer if generated else None,
        label=str(row.get("failure_label") or ""),
        error=error if isinstance(error, str) else "",
        correctness=_num(row.get("correctness")),
        faithfulness=_num(row.get("faithfulness")),
        hit=None if hit is None else hit == 1.0,
        checks=checks,
        trace=trace,
    )


def _k(params: Mapping[str, Any], default: int) -> int:
    try:
        return int(params.get("retriever.k", default))
    except (TypeError, ValueError):
        return default


def answer_matrix(
    configs: Sequence[Any],
    factors: Sequence[str],
    k: int,
    title: str = "",
    traces: Mapping[str, Mapping[str, str]] | None = None,
) -> AnswerMatrix:
    """The matrix of ``configs`` (``report.load.Config``: ``label``, ``table``, ``run``), columns
    ordered by their levels of ``factors``; ``traces``: per run id, item id → trace URL. Replicate
    rows of an item: the first replicate's answer (the one its trace shows)."""
    traces = traces or {}
    order = sorted(
        configs, key=lambda c: tuple(str(c.run.params.get(f, c.label)) for f in factors) + (c.label,)
    )
    cols = [
        MatrixConfig(
            c.label, {f: str(c.run.params.get(f, "")) for f in factors}, c.run.run_id, _k(c.run.params, k)
        )
        for c in order
    ]
    by_config = [{str(r["id"]): r for r in c.table.drop_duplicates("id").to_dict("records")} for c in order]
    items: dict[str, dict[str, Any]] = {}
    for table in by_config:
        for item_id, r in table.items():
            items.setdefault(item_id, r)
    rows = []
    for item_id, first in items.items():
        tags = [str(t) for t in cell("tags", first.get("tags"), [])]
        cells = [
            _cell(t[item_id], c.k, traces.get(c.run_id, {}).get(item_id, "")) if item_id in t else None
            for c, t in zip(cols, by_config, strict=True)
        ]
        rows.append(MatrixRow(item_id, str(first.get("query", "")), tags, cells))
    labels = sorted({c.label for r in rows for c in r.cells if c is not None and c.label})
    tags = sorted({t for r in rows for t in r.tags})
    answered = [any(c is not None and c.answer is not None for c in r.cells) for r in rows]
    return AnswerMatrix(
        title, k, list(factors), cols, rows, labels, tags, any(answered) and not all(answered)
    )


def matrix_json(m: AnswerMatrix) -> str:
    """The matrix as JSON safe inside a ``<script>`` element (no ``</script>`` can close it)."""
    text = json.dumps(
        asdict(m) | {"shown": SHOWN}, ensure_ascii=False, separators=(",", ":"), allow_nan=False
    )
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_answer_matrix(m: AnswerMatrix) -> str:
    """The matrix as one self-contained HTML page (``templates/answers.html.j2``)."""
    factors = ", ".join(m.factors) or "run"
    return render_page(
        "answers.html.j2", title=m.title, data=matrix_json(m), shown=SHOWN, factors_text=factors
    )
