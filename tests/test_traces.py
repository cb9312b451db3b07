"""Traces per eval item: tiny real sweeps (MiniLM, SmolLM2) into real sqlite stores, read back."""

from __future__ import annotations

import json
import math
import re

import mlflow
import pandas as pd
import pytest
from mlflow.entities import AssessmentSourceType
from mlflow.tracking import MlflowClient

from tests.llm_fixtures import requires_smollm2
from tests.mlflow_ui import SCREENSHOTS, chromium, mlflow_server
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


def _store(root):
    uri = f"sqlite:///{root}/mlflow.db"
    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("test")
    run = c.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])[0]  # the fixture's run
    mlflow.set_tracking_uri(uri)
    traces = mlflow.search_traces(locations=[exp.experiment_id], run_id=run.info.run_id, return_type="list")
    df = pd.read_parquet(c.download_artifacts(run.info.run_id, "per_query.parquet", str(root)))
    return c, exp, run, traces, df


@pytest.fixture(scope="module")
def retrieval_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    docs, ev = make_tiny(root)
    run_sweep(root, *sweep_args(root, docs, ev), "generator=none")
    return root, docs, ev


def _by_item(traces):
    return {t.info.tags["item_id"]: t for t in traces}


def _assessments(trace):
    fb = {a.name: a for a in trace.info.assessments if a.feedback is not None}
    ex = {a.name: a.value for a in trace.info.assessments if a.expectation is not None}
    return fb, ex


def test_one_trace_per_item_linked_to_the_run(retrieval_run):
    root, _, ev = retrieval_run
    c, exp, run, traces, df = _store(root)
    assert len(traces) == len(df) == sum(1 for _ in open(ev))
    assert set(_by_item(traces)) == set(df["id"])
    for t in traces:
        assert t.info.trace_metadata["mlflow.sourceRun"] == run.info.run_id
        assert t.info.experiment_id == exp.experiment_id
    tag = json.loads(run.data.tags["traces"])
    assert tag["n"] == len(df) and tag["seconds"] >= 0


def test_retriever_span_holds_the_ranked_chunks_as_documents(retrieval_run):
    root, docs, _ = retrieval_run
    *_, traces, df = _store(root)
    k = 5
    by = _by_item(traces)
    for _, row in df.iterrows():
        t = by[row["id"]]
        root_span = t.data._get_root_span()
        assert root_span.inputs["query"] == row["query"] and root_span.inputs["item_id"] == row["id"]
        retrieved = json.loads(row["retrieved"])
        assert root_span.outputs == [r["chunk_id"] for r in retrieved[:k]]
        (ret,) = [s for s in t.data.spans if s.span_type == "RETRIEVER"]
        assert ret.parent_id == root_span.span_id
        got = ret.outputs
        assert [d["metadata"]["chunk_id"] for d in got] == [r["chunk_id"] for r in retrieved]
        assert [d["metadata"]["rank"] for d in got] == list(range(1, len(retrieved) + 1))
        for d, r in zip(got, retrieved, strict=True):
            text = (docs / r["doc_id"]).read_text()
            assert d["page_content"] == text[r["start"] : r["end"]] and d["page_content"]
            assert d["metadata"]["score"] == pytest.approx(r["score"])
            assert (d["metadata"]["doc_id"], d["metadata"]["start"], d["metadata"]["end"]) == (
                r["doc_id"],
                r["start"],
                r["end"],
            )


def test_feedback_values_equal_the_per_query_table(retrieval_run):
    root, docs, _ = retrieval_run
    *_, traces, df = _store(root)
    by = _by_item(traces)
    metric_cols = [
        c for c in df.columns if c.startswith(("hit_at_", "mrr", "ndcg_at_", "evidence_recall_at_"))
    ]
    assert "mrr" in metric_cols and "hit_at_5" in metric_cols
    checked = 0
    for _, row in df.iterrows():
        fb, ex = _assessments(by[row["id"]])
        assert fb["failure_label"].value == row["failure_label"]
        assert "hit_at_5=" in fb["failure_label"].rationale
        gold = json.loads(row["gold_spans"])
        assert [[e["doc_uri"], e["start"], e["end"]] for e in ex["expected_retrieved_context"]] == gold
        for e in ex["expected_retrieved_context"]:
            assert e["content"] == (docs / e["doc_uri"]).read_text()[e["start"] : e["end"]]
        if not gold:  # unanswerable: retrieval metrics are not applicable, so no feedback
            assert not set(metric_cols) & set(fb)
            continue
        for col in metric_cols:
            assert fb[col].value == pytest.approx(row[col]), (row["id"], col)
            assert fb[col].source.source_type == AssessmentSourceType.CODE
            checked += 1
        assert fb["hit_at_5"].rationale.startswith("1 if any relevant chunk")
        assert fb["hit_at_5"].span_id == by[row["id"]].data._get_root_span().span_id
    assert checked >= 7 * len(metric_cols)


def test_eval_set_is_one_genai_dataset_linked_to_the_run(retrieval_run):
    root, _, ev = retrieval_run
    c, exp, run, *_ = _store(root)
    datasets = c.search_datasets(experiment_ids=[exp.experiment_id])
    assert len(datasets) == 1
    ds = datasets[0]
    assert ds.tags["evalset_digest"] == run.data.tags["evalset_digest"]
    records = ds.to_df()
    assert len(records) == sum(1 for _ in open(ev))
    first = json.loads(open(ev).readline())
    rec = records[records["inputs"].map(lambda i: i["item_id"]) == first["id"]].iloc[0]
    assert rec["inputs"]["query"] == first["query"]
    assert (
        rec["expectations"]["expected_retrieved_context"][0]["doc_uri"] == first["gold_evidence"][0]["doc_id"]
    )
    assert ds.name in [d.dataset.name for d in run.inputs.dataset_inputs]
    from rag_experiments.tracking.genai_dataset import run_input_entity

    with mlflow.tracking._tracking_service.utils._use_tracking_uri(c.tracking_uri):
        assert run_input_entity(ds).to_dictionary() == ds._to_mlflow_entity().to_dictionary()


def test_second_run_reuses_the_dataset_and_traces_off_writes_none(retrieval_run):
    root, docs, ev = retrieval_run
    run_sweep(root, *sweep_args(root, docs, ev), "generator=none", "retriever.k=3")
    run_sweep(root, *sweep_args(root, docs, ev), "generator=none", "retriever.k=4", "tracking.traces=false")
    c = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    exp = c.get_experiment_by_name("test")
    runs = {r.data.params["retriever.k"]: r for r in c.search_runs([exp.experiment_id])}
    assert len(c.search_datasets(experiment_ids=[exp.experiment_id])) == 1
    mlflow.set_tracking_uri(f"sqlite:///{root}/mlflow.db")

    def n_traces(run):
        return len(
            mlflow.search_traces(locations=[exp.experiment_id], run_id=run.info.run_id, return_type="list")
        )

    assert n_traces(runs["3"]) == n_traces(runs["5"]) == sum(1 for _ in open(ev))
    assert n_traces(runs["4"]) == 0 and "traces" not in runs["4"].data.tags


@requires_smollm2
def test_generating_run_has_chat_and_judge_spans_and_generation_feedback(tmp_path):
    docs, ev = make_tiny(tmp_path, n_items=3)
    run_sweep(tmp_path, *sweep_args(tmp_path, docs, ev), "generator=local", "generator.max_tokens=24")
    _, _, run, traces, df = _store(tmp_path)
    # the claim-level diagnostics reach MLflow with CIs and counts (docs/metrics.md)
    m = run.data.metrics
    for key in ("claim_recall", "context_utilization", "hallucination", "self_knowledge"):
        assert f"n_scored/{key}" in m and m[f"n_scored/{key}"] <= 3, key
    assert "claim_recall_ci_low" in m and "n_unparseable_diagnostic_verdicts" in m
    assert "tokens_in/judge" not in m  # the heuristic judge makes no model call: nothing to log
    by = _by_item(traces)
    assert len(traces) == len(df) == 3
    for _, row in df.iterrows():
        t = by[row["id"]]
        assert t.data._get_root_span().outputs == row["answer"]
        (chat,) = [s for s in t.data.spans if s.span_type == "CHAT_MODEL"]
        roles = [m["role"] for m in chat.inputs["messages"]]
        assert roles[-1] == "user" and row["query"].strip() in chat.inputs["messages"][-1]["content"]
        assert chat.outputs["choices"][0]["message"]["content"] == row["answer"]
        assert (chat.end_time_ns - chat.start_time_ns) / 1e9 == pytest.approx(
            row["latency_generation_s"], abs=1e-3
        )
        judges = {s.name for s in t.data.spans if s.span_type == "EVALUATOR"}
        assert judges == {"judge.faithfulness", "judge.answer_relevance"}
        fb, ex = _assessments(t)
        for col in ("correctness", "answer_relevance", "faithfulness"):
            if math.isnan(row[col]):
                assert fb[col].error is not None and fb[col].value is None
            else:
                assert fb[col].value == pytest.approx(row[col])
        assert fb["faithfulness"].source.source_id == "HeuristicJudge"
        unsupported = [v["claim"] for v in json.loads(row["verdicts"]) if v["label"] != "supported"]
        for claim in unsupported:
            assert claim in fb["faithfulness"].rationale
        assert fb["failure_label"].value == row["failure_label"]
        # token counts from the server's usage: on the chat span and the trace (the UI's Tokens column)
        usage = {
            "input_tokens": int(row["tokens_in_generation"]),
            "output_tokens": int(row["tokens_out_generation"]),
        }
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
        assert chat.get_attribute("mlflow.chat.tokenUsage") == usage
        assert t.info.token_usage == usage


def test_judge_tokens_go_on_the_judge_span_and_into_the_trace_total():
    """``tokens_in_judge``/``tokens_out_judge`` (when a judge reports usage) are counted once."""
    from mlflow.tracing.utils import aggregate_usage_from_spans

    from rag_experiments.tracking.traces import _new_ids, build_spans
    from rag_experiments.types import EvalItem

    retrieved = [{"chunk_id": "d#0-5", "doc_id": "d", "start": 0, "end": 5, "score": 1.0, "rank": 1}]
    row = {
        "id": "q1", "retrieved": json.dumps(retrieved), "answer": "hello", "verdicts": "[]", "claims": "[]",
        "latency_retrieval_s": 0.1, "latency_generation_s": 1.0, "latency_judge_s": 0.5,
        "tokens_in_generation": 100.0, "tokens_out_generation": 7.0,
        "tokens_in_judge": 40.0, "tokens_out_judge": 3.0,
    }  # fmt: skip
    item = EvalItem(id="q1", query="q?", gold_spans=[], tags=["exact"])
    spans, _ = build_spans(_new_ids(), row, item, {"d": "hello world"}, 0, 1)
    usage = {s.name: s.get_attribute("mlflow.chat.tokenUsage") for s in spans}
    assert usage["generate"] == {"input_tokens": 100, "output_tokens": 7, "total_tokens": 107}
    assert usage["judge.faithfulness"] == {"input_tokens": 40, "output_tokens": 3, "total_tokens": 43}
    assert usage["judge.answer_relevance"] is None and usage["rag_query"] is None
    assert aggregate_usage_from_spans(spans) == {
        "input_tokens": 140,
        "output_tokens": 10,
        "total_tokens": 150,
    }
    row.update(tokens_in_judge=float("nan"), tokens_out_judge=float("nan"), tokens_in_generation=float("nan"))
    spans, _ = build_spans(_new_ids(), row, item, {"d": "hello world"}, 0, 1)
    usage = {s.name: s.get_attribute("mlflow.chat.tokenUsage") for s in spans}
    assert usage["judge.faithfulness"] is None  # no usage reported: no attribute, never 0
    assert usage["generate"] is None  # only one side reported: left out, not half-invented


def test_run_page_lists_headline_metrics_first(retrieval_run):
    root, *_ = retrieval_run
    c, _, run, *_ = _store(root)
    keys = list(c.get_run(run.info.run_id).data.metrics)  # the store's order = the run page's order
    detail = [i for i, k in enumerate(keys) if "_ci_" in k or k.startswith(("by_tag/", "n_scored/"))]
    head = [
        keys.index(k)
        for k in ("hit_at_5", "evidence_recall_at_5", "mrr", "ndcg_at_5", "rate_retrieval_failure")
    ]
    assert detail and max(head) < min(detail)
    assert keys[:4] == ["hit_at_1", "hit_at_3", "hit_at_5", "hit_at_10"]
    assert keys.index("mrr_ci_low") + 1 == keys.index("mrr_ci_high")


def test_mlflow_ui_shows_the_runs_traces_with_assessments(retrieval_run, tmp_path):
    """A real ``mlflow server`` on the store; headless Chromium renders the run's Traces tab.

    Screenshots: ``reports/screenshots/run_traces.png``, ``run_overview.png``.
    """
    root, *_ = retrieval_run
    c, exp, run, traces, df = _store(root)
    with mlflow_server(root) as base:
        run_url = f"{base}/#/experiments/{exp.experiment_id}/runs/{run.info.run_id}"
        dom = chromium(f"{run_url}/traces", tmp_path / "p1", SCREENSHOTS / "run_traces.png")
        overview = chromium(f"{run_url}/overview", tmp_path / "p0", SCREENSHOTS / "run_overview.png")
    queries = [q for q in df["query"] if q[:40] in dom]
    assert len(queries) == len(df), "the run's Traces tab lists every eval query"
    names = {a.name for t in traces for a in t.info.assessments if a.feedback is not None}
    m = re.search(r"Assessments\W*\((\d+)/(\d+)\)", re.sub(r"<[^>]+>", " ", dom))
    assert m and int(m.group(2)) == len(names), "every feedback name is an assessment column"
    assert "expected_retrieved_context" in dom and "Expected facts" in dom
    text = re.sub(r"<[^>]+>", "|", overview[overview.index("Metrics (") :])
    listed = [k for k in re.split(r"\|+", text) if re.fullmatch(r"[a-z][a-z_/0-9]*", k)]
    assert listed[:4] == ["hit_at_1", "hit_at_3", "hit_at_5", "hit_at_10"], (
        "the run page lists headline metrics first"
    )
    assert listed.index("mrr") < min(i for i, k in enumerate(listed) if "_ci_" in k)


def test_batched_and_per_trace_writes_store_the_same(retrieval_run, tmp_path):
    """The one-transaction SQL path and the public per-trace path give identical traces."""
    from rag_experiments.datasets.corpus import Corpus
    from rag_experiments.evalset import EvalSet
    from rag_experiments.tracking.traces import write_traces

    root, docs, ev = retrieval_run
    *_, df = _store(root)
    corpus = Corpus(str(docs))
    evalset = EvalSet(str(ev), corpus)
    uri = f"sqlite:///{tmp_path}/m.db"
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("x", artifact_location=(tmp_path / "a").as_uri())
    got, runs = {}, {}
    for batch in (True, False):
        run = runs[batch] = c.create_run(exp).info.run_id
        write_traces(uri, run, exp, df, evalset.items, corpus.docs, 5, evalset.digest, batch=batch)
        mlflow.set_tracking_uri(uri)
        traces = mlflow.search_traces(locations=[exp], run_id=run, return_type="list")
        got[batch] = {
            t.info.tags["item_id"]: (
                sorted(
                    (a.name, json.dumps(a.value), a.rationale or "", a.source.source_type)
                    for a in t.info.assessments
                    if a.feedback is not None or a.expectation is not None
                ),
                [(s.name, s.span_type, json.dumps(s.outputs)) for s in t.data.spans],
                t.info.request_preview,
                t.info.state,
            )
            for t in traces
        }
    assert len(got[True]) == len(df) and got[True] == got[False]
    # the raw rows too: span content, tags and metadata keys, trace columns, as MLflow's log_spans writes
    import sqlite3

    def content(c: str) -> str:  # without what differs between two writes: ids and start times
        d = json.loads(c)
        d["attributes"].pop("mlflow.traceRequestId")
        d["duration"] = d.pop("end_time_unix_nano") - d.pop("start_time_unix_nano")
        return json.dumps({k: v for k, v in d.items() if not k.endswith("_id")}, sort_keys=True)

    db = sqlite3.connect(tmp_path / "m.db")
    rows = {}
    for batch, run in runs.items():
        ids = [
            r[0] for r in db.execute("SELECT request_id FROM trace_request_metadata WHERE value = ?", (run,))
        ]
        q = ",".join("?" * len(ids))
        spans = db.execute(
            f"SELECT name, type, status, model_name, content FROM spans WHERE trace_id IN ({q})", ids
        )
        rows[batch] = (
            sorted((n, t, st, m, content(c)) for n, t, st, m, c in spans),
            sorted(
                db.execute(
                    f"SELECT key, COUNT(*) FROM trace_tags WHERE request_id IN ({q}) GROUP BY key", ids
                )
            ),
            sorted(
                db.execute(
                    f"SELECT key, COUNT(*) FROM trace_request_metadata WHERE request_id IN ({q}) GROUP BY key",
                    ids,
                )
            ),
            sorted(
                db.execute(
                    f"SELECT status, request_preview, trace_name FROM trace_info WHERE request_id IN ({q})",
                    ids,
                )
            ),
        )
    assert rows[True][0] and rows[True] == rows[False]


@requires_smollm2
def test_generation_subset_run_traces_every_item(tmp_path):
    """Items outside ``generation_subset`` have no answer (NaN cells): still one trace each, no chat
    span, generation feedback marked as not scored; the run FINISHES."""
    docs, ev = make_tiny(tmp_path, n_items=4)
    run_sweep(
        tmp_path,
        *sweep_args(tmp_path, docs, ev),
        "generator=local",
        "generator.max_tokens=16",
        "generation_subset=2",
    )
    _, _, run, traces, df = _store(tmp_path)
    assert run.info.status == "FINISHED"
    assert len(traces) == len(df) == 4
    by = _by_item(traces)
    answered = df["answer"].map(lambda a: isinstance(a, str))
    assert answered.sum() == 2
    for _, row in df.iterrows():
        t = by[row["id"]]
        chats = [s for s in t.data.spans if s.span_type == "CHAT_MODEL"]
        fb, _ = _assessments(t)
        if isinstance(row["answer"], str):
            assert len(chats) == 1
        else:
            assert chats == [] and fb["faithfulness"].value is None and fb["faithfulness"].error is not None
