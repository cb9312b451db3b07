"""Your application as a black box (app=python|http, docs/app.md): its contexts mapped onto corpus
spans, every metric family computed as for the built-in stages, unmapped contexts counted."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.core.types import Document
from rag_experiments.evalset.contexts import ContextMapper
from rag_experiments.judge.validity import build_judge
from rag_experiments.run.steps import failure_reason
from rag_experiments.stages.app import HttpApp, PythonApp, reply_of
from tests.llm_fixtures import send_body
from tests.sweep_helpers import REPO, make_tiny, run_sweep, sweep_args, tiny_pipeline


def sample_inputs(root, n: int):
    """The bundled sample's corpus (the example app indexes all of it) and its first ``n`` items."""
    from rag_experiments.core.cache import StageCache
    from rag_experiments.evalset.corpus import Corpus
    from rag_experiments.evalset.load import EvalSet, sample_dir

    corpus = Corpus(str(sample_dir() / "docs"))
    items = [it for it in EvalSet(str(sample_dir() / "evalset.jsonl"), corpus).items if it.answerable][:n]
    return corpus, items, StageCache(root / "cache")


DOC = Document("a.md", "A", "Webhooks retry.\n\nFailed   deliveries are\nretried for 24 hours.\n\nEnd.")


def test_contexts_map_onto_corpus_spans_by_offsets_text_normalised_text_or_not_at_all():
    m = ContextMapper([DOC, Document("b.md", "B", "Other text. Webhooks retry.")])
    s = DOC.text.index("Failed")
    assert m.map({"text": DOC.text[s : s + 6], "doc_id": "a.md", "start": s, "end": s + 6}) == ("a.md", s, s + 6)
    assert m.map({"text": "Webhooks retry.", "doc_id": "b.md"})[0] == "b.md"  # the named document first
    assert m.map({"text": "Webhooks retry."}) == ("a.md", 0, 15)  # else the corpus, in order
    got = m.map({"text": "Failed deliveries are retried for 24 hours."})  # whitespace-normalised
    assert got is not None and DOC.text[got[1] : got[2]].startswith("Failed") and DOC.text[got[1] : got[2]].endswith("hours.")
    assert m.map({"text": "wrong offsets: Webhooks retry.", "doc_id": "a.md", "start": 0, "end": 5}) is None
    assert m.map({"text": "not in the corpus"}) is None and m.map({"text": "  "}) is None


def test_an_app_reply_has_one_shape():
    assert reply_of(("yes", ["ctx"])).contexts == [{"text": "ctx"}]
    for bad in ("just text", {"answer": 3}, {"answer": "a", "contexts": [3]}):
        with pytest.raises(ValueError):
            reply_of(bad)


def test_python_app_runs_every_metric_family_and_counts_unmapped_contexts(tmp_path):
    app = PythonApp("tests.app_fixture:answer", {"generate": False, "junk": True})
    inputs = sample_inputs(tmp_path, 5)
    res = tiny_pipeline(inputs, app=app, judge=build_judge("heuristic"))
    df, agg = res.per_query, res.aggregates
    assert "retriever" not in res.records and res.records["app"].items == 5 and not failure_reason(res.records)
    assert agg["hit_at_3"] > 0 and "mrr" in agg and "evidence_recall_at_256tok" in agg  # retrieval, mapped
    assert agg["n_generated"] == 5 and "faithfulness" in agg and "correctness" in agg  # generation, judged
    assert df["n_unmapped_contexts"].eq(1).all() and agg["n_unmapped_contexts"] == 5  # the junk context
    assert df["failure_label"].notna().all() and (df["answer"].str.len() > 0).all()
    again = tiny_pipeline(inputs, app=app, judge=build_judge("heuristic"))
    assert again.records["app"].calls == {"app": 0}  # replies cached per (identity, question)


def test_an_app_that_raises_on_every_question_fails_the_run(tmp_path):
    res = tiny_pipeline(sample_inputs(tmp_path, 3), app=PythonApp("tests.app_fixture:broken"))
    assert "every one of the 3 questions asked to the app errored (app step" in failure_reason(res.records)
    assert res.per_query["app_error"].str.contains("RuntimeError").all()


def test_an_app_failing_on_some_questions_finishes_with_counted_error_rows(tmp_path):
    """Issue 42: one failing question is that question's error row (the table validates, the run
    finishes with the count), never a crash of the whole run."""
    from rag_experiments.core.query_table import to_arrow
    from rag_experiments.run.steps import step_summary

    corpus, items, cache = sample_inputs(tmp_path, 8)
    failing = sum("?" in it.query for it in items)
    assert 0 < failing < len(items)  # the fixture's premise: some questions ask with a "?"
    res = tiny_pipeline((corpus, items, cache), app=PythonApp("tests.app_fixture:flaky"), judge=build_judge("heuristic"))
    df, agg = res.per_query, res.aggregates
    assert not failure_reason(res.records) and agg["n_app_errors"] == failing
    assert any(ln.startswith("app:") for ln in step_summary(res.records))  # the same command redoes them
    assert df["generation_cached"].map(type).eq(bool).all()  # was the app's error text
    assert df["error"].notna().sum() == failing and df.loc[df["error"].notna(), "answer"].eq("").all()
    to_arrow(df)  # the declared per-query table accepts it (the run's table was refused: exit 1)


def test_an_app_that_traces_itself_is_linked_to_our_per_query_record(tmp_path):
    """app=python whose code uses ``@mlflow.trace``: each question's own trace id lands in the
    per-query column and on our trace of the item; a cached re-run keeps the links."""
    import mlflow

    from rag_experiments.tracking.traces import build_records

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/app.db")  # the app's own MLflow setup
    try:  # the store is not read back: a worker's tracer may keep an earlier test's destination
        inputs = sample_inputs(tmp_path, 3)
        res = tiny_pipeline(inputs, app=PythonApp("tests.app_fixture:traced", {"generate": False}))
        ids = res.per_query["app_trace_id"]
        assert ids.notna().all() and ids.nunique() == 3
        assert all(i.startswith("tr-") for i in ids)  # MLflow trace ids (where they land is the app's setup)
        again = tiny_pipeline(inputs, app=PythonApp("tests.app_fixture:traced", {"generate": False}))
        assert again.records["app"].calls == {"app": 0} and list(again.per_query["app_trace_id"]) == list(ids)
        recs = build_records(res.per_query, inputs[1], inputs[0].docs, 3, "digest")
        assert [r.tags["app_trace_id"] for r in recs] == list(ids)
        plain = tiny_pipeline(sample_inputs(tmp_path / "plain", 2), app=PythonApp("tests.app_fixture:answer"))
        assert plain.per_query["app_trace_id"].isna().all()  # an app that does not trace: no link
    finally:
        mlflow.set_tracking_uri(before)


def test_http_app_through_the_endpoint_client(tmp_path):
    from tests.app_fixture import answer

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            q = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["q"]
            out = answer(q, generate=False)
            reply = {"result": {"text": out["answer"], "docs": out["contexts"]}, "trace": f"tr-{len(q)}"}
            send_body(self, 200, json.dumps(reply).encode())

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        app = HttpApp(f"http://127.0.0.1:{srv.server_address[1]}/ask", {"q": "{question}"}, "result.text", "result.docs",
                      trace_id_field="trace")  # fmt: skip
        res = tiny_pipeline(sample_inputs(tmp_path, 3), app=app)
        assert res.records["app"].failed == 0 and res.aggregates["hit_at_3"] > 0
        assert list(res.per_query["app_trace_id"]) == [f"tr-{len(q)}" for q in res.per_query["query"]]
    finally:
        srv.shutdown()


@pytest.mark.slow
def test_app_python_end_to_end_and_a_bad_target_exits_2(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    docs, ev = make_tiny(tmp_path, n_items=4)
    base = [*sweep_args(tmp_path, docs, ev), "judge=heuristic", "judge_card.enabled=false"]
    base = [a for a in base if not a.startswith(("corpus=", "corpus.path="))]  # the sample: the app's corpus
    bad = run_sweep(tmp_path, "app=python", "app.target=tests.app_fixture:nope", *base, check=False)
    assert bad.returncode == 2 and "app.target" in bad.stderr + bad.stdout
    ok = run_sweep(tmp_path, "app=python", "app.target=tests.app_fixture:answer", "+app.params.generate=false",
                   "+app.params.junk=true", *base)  # fmt: skip
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    m = run.data.metrics
    assert run.info.status == "FINISHED" and m["n_unmapped_contexts"] == 4 and m["n_generated"] == 4
    assert "hit_at_5" in m and "faithfulness" in m and "app" in ok.stdout
