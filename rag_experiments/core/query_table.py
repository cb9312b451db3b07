"""The per-query table, declared: one row per eval item (per replicate), written by a run as the
MLflow artifact ``per_query.parquet`` and read back by compare, gate, select, report, spotcheck and
the traces. Nested cells are plain Python lists and dicts from the moment the pipeline builds a row
to every reader; parquet stores them as nested Arrow types, never as JSON text.

Declared columns (``COLUMNS``; a missing optional column is simply absent, a cell may be null):

==========================  =================================================================
column                      type (what it holds)
==========================  =================================================================
``id``                      string: the eval item id (required)
``query``                   string: the question as asked
``tags``                    list<string>: the item's tags
``gold_spans``              list<struct<doc_id: string, start: int64, end: int64>>: the gold
                            evidence spans (empty: an unanswerable item)
``retrieved``               list<struct<rank: int64, chunk_id: string, doc_id: string,
                            start: int64, end: int64, score: float64>>: the ranked chunks shown
``search_queries``          list<string>: the queries sent to the retriever when a query
                            transformation rewrote or expanded the question (optional)
``error``                   string: the generation error, null when none
``rerank_error``            string: the reranker's error, null when none
``query_error``             string: the query transformation's error (the question was searched
                            as it is), null when none
``app_error``               string: the application's error (app=python|http), null when none
``app_trace_id``            string: the application's own MLflow trace of the question
                            (app=python|http, docs/app.md), null when it made none
``failure_label``           string: ``evaluation.labels`` (``ok``, ``retrieval_failure`` …)
``answer``                  string: the generated answer
``context``                 string: exactly the context the generator and the judge saw
``relevance_method``        string: how answer relevance was scored
``claims``                  list<string>: the answer split into claims by the judge
``verdicts``                list<struct<claim: string, label: string, score: float64,
                            rationale: string, stage: string>>: one verdict per claim (``stage``
                            only for judge=cascade)
``cited_chunk_ids``         list<string>: the chunks the answer cites (citation prompts)
``gold_claims``             list<string>: the gold answer's claims (claim-level diagnostics)
``answer_claim_classes``    list<string>: per answer claim its diagnostic class (null: unparseable)
``diagnostics_nan_reason``  map<string, string>: metric → why it is undefined for this query
``judge_repeat_labels``     list<list<string>>: per claim, the label of each judge repeat
``assertions``              list<struct<index: int64, type: string, value: string, critical:
                            bool, passed: bool, detail: string>>: each check of the item's
                            ``assert`` list on this answer (``evaluation.assertions``; only
                            when some item has checks)
``declined``                bool: the answer declines (null: no answer)
``generated``, ``answer_truncated``, ``context_truncated``, ``generation_cached``
                            bool
``replicate``, ``generation_seed``
                            int64
``history_query``           string: what the history step made of the conversation (history=window,
                            rewrite, oracle; docs/conversations.md), the text later steps search
``history_error``           string: the history rewrite's error (the last question was searched),
                            null when none
==========================  =================================================================

Every other column is a number: the per-query metrics (``hit_at_5``, ``mrr``, ``faithfulness``,
``first_stage/…``, ``rate_<label>`` …, names declared in ``evaluation/metric_table.py``), counts
(``n_claims`` …), latencies and token counts. They are written as float64 (int64 and bool kept as
they are); a column that is neither declared nor numeric is an error naming it, so a new nested or
text column has to be declared here first.

The file carries ``SCHEMA_VERSION`` under the parquet metadata key ``rag_experiments.per_query``.
Tables written before it (nested cells as JSON text, ``gold_spans`` as ``[doc_id, start, end]``
triples, ``tags`` possibly a comma-separated string) are upgraded on read, so old runs still read.

The collapsed view of a replicated run adds ``replicates`` (``evaluation.replicates``: a list of
dicts, one per replicate) after reading; it is never written.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: Bumped whenever a declared column changes type; 1 is the first declared schema.
SCHEMA_VERSION = "1"
#: The parquet key-value metadata key that carries ``SCHEMA_VERSION``.
METADATA_KEY = b"rag_experiments.per_query"


class QueryTableError(ValueError):
    """A per-query table that does not match the declared schema (the message names the column)."""


def _types() -> dict[str, Any]:
    import pyarrow as pa

    s, i, f = pa.large_string(), pa.int64(), pa.float64()
    span = pa.struct([("doc_id", s), ("start", i), ("end", i)])
    chunk = pa.struct([("rank", i), ("chunk_id", s), ("doc_id", s), ("start", i), ("end", i), ("score", f)])
    verdict = pa.struct([("claim", s), ("label", s), ("score", f), ("rationale", s), ("stage", s)])
    b = pa.bool_()
    check = pa.struct(
        [("index", i), ("type", s), ("value", s), ("critical", b), ("passed", b), ("detail", s)]
    )
    strings = pa.list_(s)
    return {
        "id": s,
        "query": s,
        "tags": strings,
        "gold_spans": pa.list_(span),
        "retrieved": pa.list_(chunk),
        "search_queries": strings,
        "error": s,
        "rerank_error": s,
        "query_error": s,
        "app_error": s,
        "app_trace_id": s,
        "failure_label": s,
        "answer": s,
        "context": s,
        "relevance_method": s,
        "claims": strings,
        "verdicts": pa.list_(verdict),
        "cited_chunk_ids": strings,
        "gold_claims": strings,
        "answer_claim_classes": strings,
        "diagnostics_nan_reason": pa.map_(s, s),
        "judge_repeat_labels": pa.list_(strings),
        "assertions": pa.list_(check),
        "declined": pa.bool_(),
        "generated": pa.bool_(),
        "answer_truncated": pa.bool_(),
        "context_truncated": pa.bool_(),
        "generation_cached": pa.bool_(),
        "replicate": i,
        "generation_seed": i,
        "history_query": s,
        "history_error": s,
    }


@cache
def declared_types() -> dict:
    """Column name → its pyarrow type, for every declared column (the module docstring)."""
    return _types()


#: The declared columns, in table order.
COLUMNS: tuple[str, ...] = (
    "id", "query", "tags", "gold_spans", "retrieved", "search_queries", "error", "rerank_error",
    "query_error", "app_error", "app_trace_id", "failure_label", "answer", "context", "relevance_method", "claims", "verdicts", "cited_chunk_ids",
    "gold_claims", "answer_claim_classes", "diagnostics_nan_reason", "judge_repeat_labels", "assertions",
    "declined", "generated", "answer_truncated", "context_truncated", "generation_cached", "replicate", "generation_seed",
    "history_query", "history_error",
)  # fmt: skip

#: Declared columns whose cells are lists or dicts (Python data in a DataFrame, nested in parquet).
NESTED: tuple[str, ...] = (
    "tags", "gold_spans", "retrieved", "search_queries", "claims", "verdicts", "cited_chunk_ids",
    "gold_claims", "answer_claim_classes", "diagnostics_nan_reason", "judge_repeat_labels", "assertions",
)  # fmt: skip


def _is_null(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _check_nested(col: str, typ, values: list) -> None:
    """Every cell of a nested column is null or the declared shape (a list, a dict per struct
    element with only declared keys, a dict for a map): JSON text is the old format, not accepted."""
    import pyarrow as pa

    for n, v in enumerate(values):
        if _is_null(v):
            continue
        if pa.types.is_map(typ):
            if not isinstance(v, dict):
                raise QueryTableError(
                    f"per-query column {col!r}: row {n} is {type(v).__name__}, expected a dict"
                )
            continue
        if not isinstance(v, list | tuple | np.ndarray):
            raise QueryTableError(
                f"per-query column {col!r}: row {n} is {type(v).__name__}, expected a list ({typ})"
            )
        elem = typ.value_type
        if pa.types.is_struct(elem):
            names = {elem.field(k).name for k in range(elem.num_fields)}
            for x in v:
                if not isinstance(x, dict):
                    raise QueryTableError(
                        f"per-query column {col!r}: row {n} holds a {type(x).__name__}, expected a dict ({elem})"
                    )
                if extra := set(x) - names:
                    raise QueryTableError(
                        f"per-query column {col!r}: row {n} has undeclared field(s) {sorted(extra)}"
                    )


def _number_array(s: pd.Series, col: str):
    """An undeclared column: bool, int64 or float64 by its values; anything else is an error."""
    import pyarrow as pa

    if pd.api.types.is_bool_dtype(s.dtype):
        return pa.array(s, type=pa.bool_(), from_pandas=True)
    if pd.api.types.is_integer_dtype(s.dtype):
        return pa.array(s, type=pa.int64(), from_pandas=True)
    if pd.api.types.is_float_dtype(s.dtype) or s.isna().all():
        return pa.array(s.astype(float), type=pa.float64(), from_pandas=True)
    cells = [v for v in s if not _is_null(v)]
    if all(isinstance(v, bool | np.bool_) for v in cells):  # bools with nulls (object dtype)
        return pa.array([None if _is_null(v) else bool(v) for v in s], type=pa.bool_())
    if all(isinstance(v, int | float | np.number) and not isinstance(v, bool | np.bool_) for v in cells):
        return pa.array(pd.to_numeric(s).astype(float), type=pa.float64(), from_pandas=True)
    bad = next(
        v for v in cells if not isinstance(v, int | float | np.number) or isinstance(v, bool | np.bool_)
    )
    raise QueryTableError(
        f"per-query column {col!r} is not declared in core/query_table.py and is not numeric "
        f"(a cell is {type(bad).__name__}: {str(bad)[:60]!r}); declare it there"
    )


def _column_array(s: pd.Series, col: str):
    """One column as a pyarrow array of its declared type (or int64/float64/bool when undeclared)."""
    import pyarrow as pa

    typ = declared_types().get(col)
    if typ is None:
        return _number_array(s, col)
    values = s.tolist()
    if col in NESTED:
        _check_nested(col, typ, values)
        values = [None if _is_null(v) else v.tolist() if isinstance(v, np.ndarray) else v for v in values]
    elif pa.types.is_boolean(typ) and pd.api.types.is_float_dtype(s.dtype):
        values = [None if _is_null(v) else bool(v) for v in values]
    elif pa.types.is_large_string(typ):
        for n, v in enumerate(values):
            if not (_is_null(v) or isinstance(v, str)):
                raise QueryTableError(
                    f"per-query column {col!r}: row {n} is {type(v).__name__}, expected a string"
                )
    try:
        return pa.array(values, type=typ, from_pandas=True)
    except (TypeError, ValueError, pa.ArrowException) as e:
        raise QueryTableError(f"per-query column {col!r}: expected {typ}: {e}") from None


def to_arrow(df: pd.DataFrame):
    """``df`` as a pyarrow Table with the declared schema (validated: ``QueryTableError`` names the
    first column whose values do not fit) and the schema version in its metadata."""
    import pyarrow as pa

    if "id" not in df.columns:
        raise QueryTableError("per-query table has no 'id' column")
    if dup := [c for c in df.columns[df.columns.duplicated()]]:
        raise QueryTableError(f"per-query table repeats column(s) {dup}")
    arrays = [_column_array(df[c], str(c)) for c in df.columns]
    table = pa.Table.from_arrays(arrays, names=[str(c) for c in df.columns])
    return table.replace_schema_metadata({METADATA_KEY: SCHEMA_VERSION.encode()})


def write_per_query(df: pd.DataFrame, path: str | Path) -> None:
    """Validate ``df`` against the declared schema and write it as parquet (see :func:`to_arrow`)."""
    import pyarrow.parquet as pq

    pq.write_table(to_arrow(df), str(path))


def schema_version(path: str | Path) -> str | None:
    """The schema version a per-query parquet file was written with; None: written before it."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(str(path)).metadata or {}
    v = meta.get(METADATA_KEY)
    return v.decode() if v is not None else None


def read_per_query(path: str | Path) -> pd.DataFrame:
    """A per-query parquet file as a DataFrame whose nested cells are Python lists and dicts (struct
    elements carry every declared field, None where absent); scalar columns as pandas reads them.
    A table written before the schema (no version key) is upgraded: :func:`upgrade_cells`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(str(path))
    nested = [
        f.name
        for f in table.schema
        if pa.types.is_list(f.type)
        or pa.types.is_large_list(f.type)
        or pa.types.is_map(f.type)
        or pa.types.is_struct(f.type)
    ]
    df = table.drop_columns(nested).to_pandas()
    for name in nested:
        df[name] = pd.Series(
            table.column(name).to_pylist(maps_as_pydicts="strict"), index=df.index, dtype=object
        )
    df = df[[f.name for f in table.schema]]
    if (table.schema.metadata or {}).get(METADATA_KEY) is None:
        df = upgrade_cells(df)
    return df


def cell(col: str, v: Any, default: Any = ...) -> Any:
    """One cell of the nested column ``col`` as its declared Python value, whatever wrote it: a list
    or dict as is, JSON text of a table written before the schema parsed, ``gold_spans`` triples
    ``[doc_id, start, end]`` as ``{"doc_id", "start", "end"}``, a comma-separated ``tags`` string
    split, a numpy array as a list. A null cell (None, NaN) gives ``default``: by default an empty
    list (an empty dict for ``diagnostics_nan_reason``)."""
    if _is_null(v):
        if default is not ...:
            return default
        return {} if col == "diagnostics_nan_reason" else []
    if isinstance(v, str):
        if col == "tags":
            return [x for x in v.split(",") if x]
        try:
            v = json.loads(v)
        except ValueError:
            raise QueryTableError(
                f"per-query column {col!r}: a cell is neither JSON nor a list: {v[:60]!r}"
            ) from None
    elif isinstance(v, np.ndarray):  # a list column read by pandas
        v = v.tolist()
    if col == "gold_spans":
        return [
            s if isinstance(s, dict) else {"doc_id": s[0], "start": int(s[1]), "end": int(s[2])} for s in v
        ]
    if col == "diagnostics_nan_reason" and isinstance(v, list):  # map cells as (key, value) pairs
        return dict(v)
    return v


def upgrade_cells(df: pd.DataFrame) -> pd.DataFrame:
    """A table of the old format with its nested columns as Python data (:func:`cell`; a null cell
    stays None, except ``tags``: []). Cells already in the declared form stay as they are."""
    df = df.copy()
    for col in NESTED:
        if col in df.columns:
            default = [] if col == "tags" else None
            df[col] = pd.Series([cell(col, v, default) for v in df[col]], index=df.index, dtype=object)
    return df
