"""Artifacts survive any text (issue 36, item 6): answers and gold answers of deep brackets, control
characters and lone surrogates go into traces, assessments and the per-query table of a real
sqlite MLflow store; what the store cannot hold as it is is stored as plain text and counted."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient

from rag_experiments.core.query_table import read_per_query, write_per_query
from rag_experiments.tracking import traces
from rag_experiments.tracking.store_values import as_text, storable
from tests.sweep_helpers import tiny_inputs, tiny_pipeline

BRACKETS = "[" * 1000 + "x" + "]" * 1000  # 2,001 characters: RecursionError in MLflow's store before
BRACES = "{" * 1000 + "}" * 1000
PARENS = "(" * 1000 + ")" * 1000
MIXED = ("[{(\x00\x01\x1b\u202e" * 600)[:4096]  # 4,096 characters of brackets and control characters
SURROGATES = ("[\udfff\ud800" * 1400)[:4096]  # lone surrogates (a JSON reply's "\ud800" escapes)
JSON_LIST = "[1]"  # MLflow's store would read it back as the list [1]
ANSWERS = [BRACKETS, BRACES, PARENS, MIXED, SURROGATES, JSON_LIST, "plain answer [1]"]


def test_storable_keeps_plain_values_and_replaces_what_the_store_cannot_hold() -> None:
    assert storable("plain answer [1]") == ("plain answer [1]", 0)
    assert storable(PARENS) == (PARENS, 0) and storable(BRACES) == (BRACES, 0)  # not JSON: kept
    assert storable(BRACKETS) == (as_text(BRACKETS), 1)
    assert storable(JSON_LIST) == ('"[1]"', 1)
    assert storable({"a": BRACKETS, "b": [JSON_LIST, 2]}) == ({"a": BRACKETS, "b": [JSON_LIST, 2]}, 0)
    nested, n = storable({"q": "ok", "c": ["a\ud800b", {"d": "\udfff"}]})
    assert n == 2 and nested == {"q": "ok", "c": ['"a\\ud800b"', {"d": '"\\udfff"'}]}
    assert json.dumps(nested, ensure_ascii=False).encode("utf-8")  # encodable now
    assert storable(7) == (7, 0) and storable(None) == (None, 0)


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("adversarial")
    inputs = tiny_inputs(root, n_items=len(ANSWERS))
    corpus, items, _ = inputs
    res = tiny_pipeline(inputs)
    assert len(res.per_query) == len(ANSWERS)
    by_id = dict(zip(res.per_query["id"], ANSWERS, strict=True))
    items = [dataclasses.replace(it, gold_answer=by_id[it.id]) for it in items]
    df = res.per_query.copy()
    df["answer"] = pd.Series(
        ANSWERS, dtype=object, index=df.index
    )  # object: pandas' str dtype refuses surrogates
    df = df.assign(latency_generation_s=0.1, latency_judge_s=0.1)
    return root, corpus, items, df, by_id


@pytest.mark.parametrize("path", ["fast", "public"])
def test_traces_and_assessments_accept_any_answer(run_inputs, path) -> None:
    root, corpus, items, df, by_id = run_inputs
    uri = f"sqlite:///{root}/{path}.db"
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("x", artifact_location=(root / f"a-{path}").as_uri())
    run = c.create_run(exp).info.run_id
    job = traces.TraceJob(traces.TraceSettings(k=3, path=path), items, corpus.docs, "d" * 16)
    traces.log_traces(c, run, exp, df, job)  # the run's one call: RecursionError here before
    # counted: the root's output when MLflow would parse it (brackets, [1]) or cannot encode it
    # (surrogates); nested copies only when unencodable: the chat choice, both judge spans' inputs
    # and the expected_response
    n = c.get_run(run).data.metrics[traces.N_AS_TEXT]
    per_item = {BRACKETS: 1, JSON_LIST: 1, SURROGATES: 1 + 1 + 2 + 1}
    assert n == sum(per_item.values())
    mlflow.set_tracking_uri(uri)
    got = mlflow.search_traces(locations=[exp], run_id=run, return_type="list")
    assert len(got) == len(ANSWERS)
    for t in got:
        answer = by_id[t.info.tags["item_id"]]
        spans = {s.name: s for s in t.data.spans}
        assert spans["rag_query"].outputs == answer  # read back as the very string, not a list
        content = spans["generate"].outputs["choices"][0]["message"]["content"]
        assert content == (as_text(answer) if answer == SURROGATES else answer)
        (expected,) = [a.value for a in t.info.assessments if a.name == "expected_response"]
        assert expected == (as_text(answer) if answer == SURROGATES else answer)
    # every span reached the store's spans table (the public exporter drops a batch it cannot store)
    db = sqlite3.connect(root / f"{path}.db")
    n_spans = db.execute("SELECT COUNT(*) FROM spans").fetchone()[0]
    assert n_spans == sum(len(t.data.spans) for t in got) and n_spans >= 4 * len(ANSWERS)


def test_per_query_table_holds_deep_brackets_and_control_characters(run_inputs, tmp_path) -> None:
    *_, df, _ = run_inputs
    keep = df[df["answer"] != SURROGATES].copy()
    write_per_query(keep, tmp_path / "per_query.parquet")
    back = read_per_query(tmp_path / "per_query.parquet")
    assert list(back["answer"]) == list(keep["answer"])
