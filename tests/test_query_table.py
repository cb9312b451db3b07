"""The declared per-query table (core/query_table.py): nested columns survive parquet as lists and
dicts, a wrong-typed column is refused by name, a real run's artifact carries the schema, and runs
written before it (nested cells as JSON text) still read in compare, gate and report with the same
numbers as the new format."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.core.query_table import (
    COLUMNS,
    METADATA_KEY,
    NESTED,
    SCHEMA_VERSION,
    QueryTableError,
    declared_types,
    read_per_query,
    schema_version,
    write_per_query,
)
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


def _verdict(claim: str, label: str, stage: str | None = None) -> dict:
    return {"claim": claim, "label": label, "score": 0.5, "rationale": "r"} | (
        {"stage": stage} if stage else {}
    )


def _full_table() -> pd.DataFrame:
    """Three rows using every declared column: a judged answer, a retrieval-only row (nulls where the
    pipeline leaves a key out) and a failed generation."""
    chunk = {"rank": 1, "chunk_id": "d.md#0-5", "doc_id": "d.md", "start": 0, "end": 5, "score": 1.25}
    return pd.DataFrame(
        {
            "id": ["q1", "q2", "q3"],
            "query": ["a?", "b?", "c?"],
            "tags": [["exact", "boundary"], [], ["paraphrase"]],
            "gold_spans": [
                [{"doc_id": "d.md", "start": 0, "end": 5}],
                [],
                [{"doc_id": "e.md", "start": 3, "end": 9}],
            ],
            "retrieved": [[chunk, chunk | {"rank": 2, "score": 0.5}], [chunk], []],
            "search_queries": [["a?", "a rewritten"], None, []],
            "error": [None, None, "timeout"],
            "rerank_error": [None, None, None],
            "query_error": [None, "HTTP 500", None],
            "app_error": [None, None, "RuntimeError: down"],
            "app_trace_id": ["tr-1", None, None],
            "failure_label": ["ok", "retrieved", "generation_failure"],
            "answer": ["yes [1]", None, None],
            "context": ["hello", None, ""],
            "relevance_method": ["embedding", None, ""],
            "claims": [["yes", "no"], None, []],
            "verdicts": [[_verdict("yes", "supported"), _verdict("no", "unsupported", "llm")], None, []],
            "cited_chunk_ids": [["d.md#0-5"], None, []],
            "gold_claims": [["g1"], None, []],
            "answer_claim_classes": [["relevant", None], None, []],
            "diagnostics_nan_reason": [{}, None, {"claim_recall": "unanswerable item"}],
            "judge_repeat_labels": [[["supported", "supported"], ["unsupported", "supported"]], None, []],
            "assertions": [
                [{"index": 0, "type": "not_contains", "value": "never", "critical": True, "passed": False,
                  "detail": "contains 'never'"}],
                None,
                [],
            ],  # fmt: skip
            "declined": [False, None, True],
            "generated": [True, False, True],
            "answer_truncated": [False, False, False],
            "context_truncated": [False, False, True],
            "generation_cached": [True, False, False],
            "replicate": [0, 0, 0],
            "generation_seed": [7, 7, 7],
            "history_query": ["a standalone a?", "b?", None],
            "history_error": [None, "unparseable reply", None],
            "hit_at_5": [1.0, 0.0, math.nan],
            "first_stage/mrr": [1.0, 0.5, 0.0],
            "n_claims": [2, 0, 0],
            "faithfulness": [0.5, math.nan, math.nan],
        }
    )


def test_every_declared_column_round_trips_as_python_lists_and_dicts(tmp_path):
    df = _full_table()
    assert set(COLUMNS) <= set(df.columns)
    path = tmp_path / "per_query.parquet"
    write_per_query(df, path)
    schema = pq.read_schema(path)
    assert schema.metadata[METADATA_KEY] == SCHEMA_VERSION.encode() and schema_version(path) == SCHEMA_VERSION
    for name, typ in declared_types().items():
        assert schema.field(name).type == typ, name
    assert schema.field("hit_at_5").type == pa.float64() and schema.field("n_claims").type == pa.int64()
    assert str(schema.field("verdicts").type) == (
        "list<element: struct<claim: large_string, label: large_string, score: double, rationale: large_string, "
        "stage: large_string>>"
    )
    back = read_per_query(path)
    assert list(back.columns) == list(df.columns)
    for col in NESTED:
        for got, want in zip(back[col], df[col], strict=True):
            if want is None:
                assert got is None, col
                continue
            assert type(got) is type(want), (col, got)  # list / dict, never a numpy array
            if col == "verdicts":  # struct elements carry every declared field: an absent stage is None
                want = [{"stage": None} | v for v in want]
            assert got == want, col
    assert back["declined"].tolist() == [False, None, True]
    assert back["error"].tolist()[2] == "timeout" and pd.isna(back["error"].iloc[0])
    assert back["hit_at_5"].iloc[1] == 0.0 and math.isnan(back["hit_at_5"].iloc[2])


def test_a_table_without_the_optional_search_queries_column_still_writes(tmp_path):
    df = _full_table().drop(columns=["search_queries"])
    write_per_query(df, tmp_path / "t.parquet")
    assert "search_queries" not in read_per_query(tmp_path / "t.parquet").columns


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("verdicts", '[{"claim": "x"}]', "'verdicts': row 0 is str, expected a list"),  # the old JSON text
        ("gold_spans", [{"doc_id": "d", "start": "zero", "end": 5}], "'gold_spans'"),
        ("retrieved", [{"rank": 1, "chunk": "x"}], "'retrieved': row 0 has undeclared field(s) ['chunk']"),
        ("diagnostics_nan_reason", "{}", "'diagnostics_nan_reason': row 0 is str, expected a dict"),
        ("answer", 3.5, "'answer': row 0 is float, expected a string"),
        ("note", "free text", "'note' is not declared in core/query_table.py and is not numeric"),
    ],
)
def test_a_wrong_typed_column_is_refused_by_name(tmp_path, column, value, message):
    df = _full_table()
    df[column] = pd.Series([value] + [None] * (len(df) - 1), dtype=object)
    with pytest.raises(QueryTableError) as e:
        write_per_query(df, tmp_path / "t.parquet")
    assert message in str(e.value)
    assert not (tmp_path / "t.parquet").exists()


# --- real runs: the sweep's artifact, and the same runs in the format written before the schema ---


def _legacy(df: pd.DataFrame) -> pd.DataFrame:
    """The table as the previous code wrote it: ``gold_spans`` triples and ``retrieved`` as JSON
    text (``json.dumps`` in the pipeline), ``tags`` a list, pandas' own ``to_parquet``."""
    return df.assign(
        gold_spans=[json.dumps([[s["doc_id"], s["start"], s["end"]] for s in v]) for v in df["gold_spans"]],
        retrieved=[json.dumps(v) for v in df["retrieved"]],
    )


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory):
    """A real retrieval-only sweep (chunking=fixed,markdown), and a copy of it whose children carry
    their per_query.parquet in the pre-schema format (same params, metrics and tags)."""
    root = tmp_path_factory.mktemp("schema_sweep")
    docs, ev = make_tiny(root)
    run_sweep(root, "-m", "chunking=fixed,markdown", "generator=none", *sweep_args(root, docs, ev))
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("test").experiment_id
    parent = client.search_runs([exp], "tags.is_parent = 'true'")[0]
    kids = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(kids) == 2
    from mlflow.entities import Metric, Param

    ptags = {k: v for k, v in parent.data.tags.items() if not k.startswith("mlflow.")}
    old_parent = client.create_run(
        exp, run_name="old sweep", tags={**ptags, "sweep_id": "old-sweep"}
    ).info.run_id
    pairs = {}
    for kid in sorted(kids, key=lambda r: r.info.start_time):  # the sweep's order
        tags = {k: v for k, v in kid.data.tags.items() if not k.startswith("mlflow.")}
        run = client.create_run(
            exp,
            run_name=kid.info.run_name,
            tags={**tags, "sweep_id": "old-sweep", "mlflow.parentRunId": old_parent},
        )
        rid = run.info.run_id
        client.log_batch(rid, params=[Param(k, v) for k, v in kid.data.params.items()])
        client.log_batch(rid, metrics=[Metric(k, v, 0, 0) for k, v in kid.data.metrics.items()])
        new = read_per_query(
            client.download_artifacts(kid.info.run_id, "per_query.parquet", str(root / kid.info.run_id))
        )
        p = root / rid / "per_query.parquet"
        p.parent.mkdir()
        _legacy(new).to_parquet(p, index=False)
        client.log_artifact(rid, str(p))
        client.set_terminated(rid, "FINISHED")
        pairs[kid.data.params["chunking"]] = (kid.info.run_id, rid)
    client.set_terminated(old_parent, "FINISHED")
    return root, uri, client, parent, pairs


def test_a_real_runs_artifact_carries_the_declared_schema(two_sweeps):
    root, _, client, _, pairs = two_sweeps
    new_id, old_id = pairs["fixed"]
    path = client.download_artifacts(new_id, "per_query.parquet", str(root / "check"))
    schema = pq.read_schema(path)
    assert schema_version(path) == SCHEMA_VERSION
    for name in ("id", "query", "tags", "gold_spans", "retrieved", "failure_label", "error"):
        assert schema.field(name).type == declared_types()[name], name
    assert pa.types.is_struct(schema.field("retrieved").type.value_type)
    assert schema.field("hit_at_5").type == pa.float64()
    # the MLflow table view (per_query.json): nested cells are JSON arrays and objects, not JSON text
    table = json.loads(
        Path(client.download_artifacts(new_id, "per_query.json", str(root / "json"))).read_text()
    )
    i = table["columns"].index("retrieved")
    first = table["data"][0][i]
    assert isinstance(first, list) and {"rank", "chunk_id", "doc_id", "start", "end", "score"} <= set(
        first[0]
    )
    # the old-format copy reads back as the same Python data
    old = client.download_artifacts(old_id, "per_query.parquet", str(root / "check_old"))
    assert schema_version(old) is None
    a, b = read_per_query(path), read_per_query(old)
    assert (
        a["gold_spans"].tolist() == b["gold_spans"].tolist()
        and a["retrieved"].tolist() == b["retrieved"].tolist()
    )
    assert isinstance(b["tags"].iloc[0], list)


def _same_text(a: str, b: str, ids: dict[str, str]) -> tuple[str, str]:
    """Both texts with the run ids (whole or their 8-character prefix) and the copies' names masked."""
    for new, old in ids.items():
        a = a.replace(new, "RUN").replace(new[:8], "RUN")
        b = b.replace(old, "RUN").replace(old[:8], "RUN")
    return a, b.replace("old-sweep", "SWEEP")


def test_old_format_runs_give_the_same_compare_gate_and_report(two_sweeps, tmp_path, capsys):
    from rag_experiments.cli import compare, gate
    from rag_experiments.report import cli as report_cli

    root, uri, client, parent, pairs = two_sweeps
    (new_a, old_a), (new_b, old_b) = pairs["fixed"], pairs["markdown"]
    ids = {new_a: old_a, new_b: old_b}

    outs = []
    for a, b in ((new_a, new_b), (old_a, old_b)):
        md = tmp_path / f"{a}.md"
        assert compare.main([a, b, "--tracking-uri", uri, "--out", str(md)]) == 0
        capsys.readouterr()
        outs.append(md.read_text())
    new_md, old_md = _same_text(*outs, ids)
    assert "## Flipped queries: hit_at_5" in new_md or "| hit_at_5 |" in new_md
    assert new_md == old_md

    gates = []
    for a, b in ((new_a, new_b), (old_a, old_b)):
        code = gate.main(["--baseline", a, "--candidate", b, "--tracking-uri", uri, "--margin", "0.5"])
        gates.append((code, capsys.readouterr().out))
    assert gates[0][0] == gates[1][0]
    assert "hit_at_5" in gates[0][1]
    assert _same_text(gates[0][1], gates[1][1], ids)[0] == _same_text(gates[0][1], gates[1][1], ids)[1]

    reports = []
    for target, name in ((parent.data.tags["sweep_id"], "new"), ("old-sweep", "old")):
        out = tmp_path / name
        assert (
            report_cli.main(
                [target, "--tracking-uri", uri, "--out", str(out), "--resamples", "199", "--no-log"]
            )
            == 0
        )
        capsys.readouterr()
        reports.append((out / "report.md").read_text())
    new_r, old_r = _same_text(*reports, ids)
    new_r = new_r.replace(parent.data.tags["sweep_id"], "SWEEP")
    for heading in ("## Results per config", "## Worst queries"):
        sec_new = new_r.split(heading)[1].split("\n## ")[0]
        sec_old = old_r.split(heading)[1].split("\n## ")[0]
        assert sec_new == sec_old, heading
    # the recomputed hit curve (from ``retrieved`` and ``gold_spans``) agrees with the logged metrics
    assert "≠ logged" not in new_r and "≠ logged" not in old_r
    worst = new_r.split("## Worst queries")[1]
    assert re.search(r"\.md\[\d+:\d+\]", worst)  # gold spans rendered from the declared dicts
