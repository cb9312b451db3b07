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

from rag_experiments.core.query_table import read_per_query
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
    df = read_per_query(c.download_artifacts(run.info.run_id, "per_query.parquet", str(root)))
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
    (version,) = c.get_run(run.info.run_id).inputs.model_inputs  # the config's app version (tracking.app_versions)
    for t in traces:
        assert t.info.trace_metadata["mlflow.sourceRun"] == run.info.run_id
        assert t.info.trace_metadata["mlflow.modelId"] == version.model_id
        assert t.info.experiment_id == exp.experiment_id
    model = c.get_logged_model(version.model_id)
    assert model.tags["config_hash"] == run.data.tags["config_hash"]
    on_model = {m.key: m.value for m in model.metrics if m.run_id == run.info.run_id}
    assert on_model["mrr"] == run.data.metrics["mrr"] and "mrr_ci_low" not in on_model
    tag = json.loads(run.data.tags["traces"])
    assert tag["n"] == len(df) and 0 <= tag["dataset_seconds"] <= tag["seconds"]


def test_retriever_span_holds_the_ranked_chunks_as_documents(retrieval_run):
    root, docs, _ = retrieval_run
    *_, traces, df = _store(root)
    k = 5
    by = _by_item(traces)
    for _, row in df.iterrows():
        t = by[row["id"]]
        root_span = t.data._get_root_span()
        assert root_span.inputs["query"] == row["query"] and root_span.inputs["item_id"] == row["id"]
        retrieved = row["retrieved"]
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
    from rag_experiments.tracking.assessments import assessed_columns

    metric_cols, more_cols = assessed_columns(df, 5)
    assert {"mrr", "hit_at_1", "hit_at_5", "ndcg_at_5", "evidence_recall_at_5"} <= set(metric_cols)
    assert "ndcg_at_3" in more_cols and "token_iou_at_5" in more_cols
    checked = 0
    for _, row in df.iterrows():
        fb, ex = _assessments(by[row["id"]])
        assert fb["failure_label"].value == row["failure_label"]
        assert "hit_at_5=" in fb["failure_label"].rationale
        gold = row["gold_spans"]
        assert [{"doc_id": e["doc_uri"], "start": e["start"], "end": e["end"]} for e in ex["expected_retrieved_context"]] == gold
        for e in ex["expected_retrieved_context"]:
            assert e["content"] == (docs / e["doc_uri"]).read_text()[e["start"] : e["end"]]
        if not gold:  # unanswerable: retrieval metrics are not applicable, so no feedback
            assert not set(metric_cols) & set(fb) and "more_metrics" not in fb
            continue
        for col in metric_cols:
            assert fb[col].value == pytest.approx(row[col]), (row["id"], col)
            assert fb[col].source.source_type == AssessmentSourceType.CODE
            checked += 1
        assert fb["more_metrics"].value == pytest.approx({c: row[c] for c in more_cols})
        assert fb["hit_at_5"].rationale is None  # definitions: once per run, metric_definitions.json
        assert fb["hit_at_5"].span_id == by[row["id"]].data._get_root_span().span_id
    assert checked >= 7 * len(metric_cols)
    c, _, run, *_ = _store(root)
    defs = json.loads(
        open(c.download_artifacts(run.info.run_id, "metric_definitions.json", str(root))).read()
    )
    assert defs["hit_at_5"].startswith("1 if any relevant chunk") and "ndcg_at_3" in defs


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
        unsupported = [v["claim"] for v in row["verdicts"] if v["label"] != "supported"]
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

    from rag_experiments.core.types import EvalItem
    from rag_experiments.tracking.mlflow_adapter import to_spans
    from rag_experiments.tracking.traces import build_spans

    retrieved = [{"chunk_id": "d#0-5", "doc_id": "d", "start": 0, "end": 5, "score": 1.0, "rank": 1}]
    row = {
        "id": "q1", "retrieved": retrieved, "answer": "hello", "verdicts": [], "claims": [],
        "latency_retrieval_s": 0.1, "latency_generation_s": 1.0, "latency_judge_s": 0.5,
        "tokens_in_generation": 100.0, "tokens_out_generation": 7.0,
        "tokens_in_judge": 40.0, "tokens_out_judge": 3.0,
    }  # fmt: skip
    item = EvalItem(id="q1", query="q?", gold_spans=[], tags=["exact"])
    spans = to_spans(build_spans(row, item, {"d": "hello world"}, 0, 1)[0])
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
    spans = to_spans(build_spans(row, item, {"d": "hello world"}, 0, 1)[0])
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


# what MLflow's public path adds and the fast path leaves out: the client's environment (user,
# git, entry point) and the trace's size statistics
PUBLIC_ONLY_METADATA = (
    "mlflow.user",
    "mlflow.source.name",
    "mlflow.source.type",
    "mlflow.source.git.branch",
    "mlflow.source.git.commit",
    "mlflow.source.git.repoURL",
    "mlflow.trace.sizeBytes",
    "mlflow.trace.sizeStats",
)


def test_fast_and_public_paths_store_the_same(retrieval_run, tmp_path):
    """The adapter's fast paths (one SQL transaction; per-trace client calls) store what MLflow's
    public API stores: read back through the public API and as raw rows. This is the check that
    puts an MLflow version into ``mlflow_adapter.VERIFIED``."""
    import mlflow as _mlflow

    from rag_experiments.evalset.corpus import Corpus
    from rag_experiments.evalset.load import EvalSet
    from rag_experiments.tracking import mlflow_adapter
    from rag_experiments.tracking.traces import TraceJob, TraceSettings, write_traces

    assert _mlflow.__version__ in mlflow_adapter.VERIFIED, "re-run this test, then add the version"
    root, docs, ev = retrieval_run
    *_, df = _store(root)
    # answers for every other item (the rest as outside generation_subset): only answered items
    # used the prompt, so only their traces are linked to its version
    df = df.assign(
        answer=[f"answer {i}" if i % 2 else None for i in range(len(df))],
        latency_generation_s=0.5,
        latency_judge_s=0.2,
    )
    answered = set(df.loc[df["answer"].notna(), "id"])
    corpus = Corpus(str(docs))
    evalset = EvalSet(str(ev), corpus)
    uri = f"sqlite:///{tmp_path}/m.db"
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("x", artifact_location=(tmp_path / "a").as_uri())
    mlflow.set_tracking_uri(uri)
    got, runs, durations = {}, {}, {}
    for path in ("fast", "fast-per-trace", "public"):
        run = runs[path] = c.create_run(exp).info.run_id
        model = c.create_logged_model(exp, name=path).model_id  # the traces' app version
        prompt = c.register_prompt(f"p-{path}", "Context: {{context}} Q: {{question}}")  # one per path
        job = TraceJob(
            TraceSettings(k=5, path=path), evalset.items, corpus.docs, evalset.digest, model_id=model,
            prompt_version=(prompt.name, 1),
        )  # fmt: skip
        write_traces(uri, run, exp, df, job)
        traces = mlflow.search_traces(locations=[exp], run_id=run, return_type="list")
        assert len(mlflow.search_traces(locations=[exp], model_id=model, return_type="list")) == len(df)
        # what the prompt version's Traces view asks the server (the entity associations)
        linked = mlflow.search_traces(locations=[exp], filter_string=f"prompt = 'p-{path}/1'", return_type="list")
        assert answered and {t.info.tags["item_id"] for t in linked} == answered and len(linked) == len(answered)
        for t in traces:  # the tag MLflow's own link writes: the path's name stands in for PATH below
            if "mlflow.linkedPrompts" in t.info.tags:
                t.info.tags["mlflow.linkedPrompts"] = t.info.tags["mlflow.linkedPrompts"].replace(path, "PATH")
        got[path] = {
            t.info.tags["item_id"]: (
                sorted(
                    (a.name, json.dumps(a.value), a.rationale or "", a.source.source_type, a.span_id is None)
                    for a in t.info.assessments
                    if a.feedback is not None or a.expectation is not None
                ),
                [(s.name, s.span_type, json.dumps(s.outputs), s.status.status_code) for s in t.data.spans],
                t.info.request_preview,
                t.info.response_preview,
                t.info.state,
                {k: v for k, v in t.info.tags.items() if k != "mlflow.artifactLocation"},
            )
            for t in traces
        }
        durations[path] = {t.info.tags["item_id"]: t.info.execution_duration for t in traces}
    assert len(got["fast"]) == len(df) and got["fast"] == got["public"] == got["fast-per-trace"]
    for item, ms in durations["fast"].items():  # MLflow moves a span's start by its API latency: ±1 ms
        assert abs(ms - durations["public"][item]) <= 1 and abs(ms - durations["fast-per-trace"][item]) <= 1
    # the raw rows too: span content, tags and metadata keys, trace columns, as MLflow's log_spans writes
    import sqlite3

    def content(c: str) -> str:  # without what differs between two writes: ids and start times
        d = json.loads(c)
        d["attributes"].pop("mlflow.traceRequestId")
        d["attributes"].pop("mlflow.spanStartTimeNs")
        d["duration"] = d.pop("end_time_unix_nano") - d.pop("start_time_unix_nano")
        return json.dumps({k: v for k, v in d.items() if not k.endswith("_id")}, sort_keys=True)

    db = sqlite3.connect(tmp_path / "m.db")
    rows = {}
    for path, run in runs.items():
        ids = [
            r[0] for r in db.execute("SELECT request_id FROM trace_request_metadata WHERE value = ?", (run,))
        ]
        q = ",".join("?" * len(ids))
        skip = ",".join("?" * len(PUBLIC_ONLY_METADATA))
        spans = db.execute(
            f"SELECT name, type, status, model_name, content FROM spans WHERE trace_id IN ({q})", ids
        )
        rows[path] = (
            sorted((n, t, st, m, content(c)) for n, t, st, m, c in spans),
            sorted(
                db.execute(
                    f"SELECT key, COUNT(*) FROM trace_tags WHERE request_id IN ({q}) GROUP BY key", ids
                )
            ),
            sorted(
                db.execute(
                    f"SELECT key, COUNT(*) FROM trace_request_metadata WHERE request_id IN ({q}) "
                    f"AND key NOT IN ({skip}) GROUP BY key",
                    [*ids, *PUBLIC_ONLY_METADATA],
                )
            ),
            sorted(
                db.execute(
                    f"SELECT status, request_preview, response_preview, trace_name FROM trace_info WHERE request_id IN ({q})",
                    ids,
                )
            ),
            sorted(
                tuple(str(v).replace(run, "RUN") for v in r)
                for r in db.execute(
                    "SELECT name, assessment_type, value, error, source_type, source_id, rationale, "
                    "assessment_metadata, span_id IS NULL, aggregate_value, is_numeric_value, valid, "
                    f"overrides, run_id FROM assessments WHERE trace_id IN ({q})",
                    ids,
                )
            ),
            sorted(  # the root's inputs/outputs as the UI's Request/Response columns read them
                db.execute(
                    f"SELECT key, value FROM trace_request_metadata WHERE request_id IN ({q}) "
                    "AND key IN ('mlflow.traceInputs', 'mlflow.traceOutputs')",
                    ids,
                )
            ),
            sorted(
                tuple(str(v).replace(path, "PATH") for v in r)
                for r in db.execute(
                    "SELECT source_type, destination_type, destination_id, length(association_id), "
                    f"created_time > 0 FROM entity_associations WHERE source_id IN ({q})",
                    ids,
                )
            ),
        )
    assert rows["fast"][0] and rows["fast"][-1] and rows["fast"] == rows["public"] == rows["fast-per-trace"]


def test_unverified_mlflow_falls_back_to_the_public_path_with_one_warning(monkeypatch, tmp_path, caplog):
    from rag_experiments.tracking import mlflow_adapter, traces
    from tests.sweep_helpers import tiny_inputs, tiny_pipeline

    inputs = tiny_inputs(tmp_path, n_items=3)
    res = tiny_pipeline(inputs)
    corpus, items, _ = inputs
    uri = f"sqlite:///{tmp_path}/m.db"
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("x", artifact_location=(tmp_path / "a").as_uri())
    monkeypatch.setattr(mlflow_adapter, "VERIFIED", ())
    monkeypatch.setattr(mlflow_adapter, "write_fast", lambda *a, **k: pytest.fail("fast path used"))
    monkeypatch.setattr(traces, "_warned", set())
    for _ in range(2):
        run = c.create_run(exp).info.run_id
        job = traces.TraceJob(traces.TraceSettings(k=3), items, corpus.docs, "d" * 16)
        ids = traces.write_traces(uri, run, exp, res.per_query, job)
        assert len(ids) == 3
    warned = [r for r in caplog.records if "not one the fast path was verified against" in r.message]
    assert len(warned) == 1, "one warning per process, not one per run"
    mlflow.set_tracking_uri(uri)
    got = mlflow.search_traces(locations=[exp], run_id=run, return_type="list")
    names = {a.name for t in got for a in t.info.assessments}
    assert len(got) == 3 and names >= {
        "hit_at_1",
        "more_metrics",
        "failure_label",
        "expected_retrieved_context",
    }


def test_trace_sample_rule():
    """All items up to the cap; beyond it exactly ``cap``: a seeded half shared by every run, then
    failures, then the seeded fill."""
    from rag_experiments.tracking.traces import select_traced

    n = 1000
    df = pd.DataFrame({"id": [f"q{i}" for i in range(n)], "error": None}).sample(frac=1, random_state=1)
    df["failure_label"] = ["retrieval_failure" if int(i[1:]) % 10 == 0 else "retrieved" for i in df["id"]]
    same, rec = select_traced(df, 1000, 0)
    assert len(same) == n and rec["rule"] == "all"
    got, rec = select_traced(df, 200, 0)
    assert len(got) == 200 and rec["failures"] == 100 and rec["failures_traced"] == 100
    assert (got["failure_label"] == "retrieval_failure").sum() == 100
    other = df.assign(failure_label="retrieved")  # another run of the same eval set: no failures
    got2, rec2 = select_traced(other, 200, 0)
    assert len(got2) == 200 and rec2["failures_traced"] == 0
    assert len(set(got["id"]) & set(got2["id"])) >= 100, "the seeded half is common to both runs"
    assert select_traced(df, 200, 0)[0]["id"].tolist() == got["id"].tolist()  # deterministic
    assert set(select_traced(df, 200, 1)[0]["id"]) != set(got["id"])  # the seed matters
    many = df.assign(failure_label="retrieval_failure")
    got3, rec3 = select_traced(many, 200, 0)
    assert len(got3) == 200 and rec3["failures_traced"] == 200


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
            # token columns are written whichever item comes first (answered or not)
            assert t.info.token_usage["input_tokens"] == int(row["tokens_in_generation"]) > 0
        else:
            assert chats == [] and fb["faithfulness"].value is None and fb["faithfulness"].error is not None
