"""The spot-check through MLflow's review queues: sample --to-mlflow, a reviewer's HUMAN feedback
written through the public API, score --from-mlflow giving exactly the CSV path's figures."""

from __future__ import annotations

import csv
import dataclasses
import json
import time
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow.entities import AssessmentSource

from rag_experiments import spotcheck
from rag_experiments.spotcheck import review
from rag_experiments.tracking import bounds
from rag_experiments.tracking import review_queue as rq
from tests.sweep_helpers import free_port
from tests.test_spotcheck import _per_query, judge_verdicts, judged_run

# the human's labels (item → verdict); items not listed stay blank
HUMAN = {"q2#0": "unsupported", "q4#2": "unsupported", "q1#1": "supported"}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """A judged run (12 claims, one unparseable) in a fresh sqlite store."""
    root = tmp_path_factory.mktemp("review_store")
    uri, client, exp, run_id = judged_run(root, {"judge_model": "j", "generator_model": "g"})
    return root, uri, client, exp, run_id


def _sample(uri: str, rid: str, out: Path, capsys, *extra: str) -> str:
    argv = ["--tracking-uri", uri, "sample", rid, "-n", "6", "--seed", "3", "--out", str(out), *extra]
    assert spotcheck.main([*argv, "--to-mlflow"]) == 0
    return capsys.readouterr().out


def _queue_id(out: str) -> str:
    return out.split("score --from-mlflow ")[1].split()[0]


def _human(item: str, judge: str) -> str:
    return HUMAN.get(item, judge if judge != "unparseable" else "supported")


def test_labeling_sessions_are_databricks_only_in_oss(judged):
    """Why review queues: mlflow.genai.labeling refuses every non-Databricks store in 3.17.2."""
    from mlflow.genai.labeling import create_labeling_session
    from mlflow.genai.labeling.stores import UnsupportedLabelingStoreURIException

    mlflow.set_tracking_uri(judged[1])
    with pytest.raises(UnsupportedLabelingStoreURIException, match="'databricks'"):
        create_labeling_session("x")


def test_queue_labels_score_exactly_like_the_csv(judged, tmp_path, capsys):
    root, uri, client, exp, rid = judged
    csv_path = tmp_path / "labels.csv"
    out = _sample(uri, rid, csv_path, capsys)
    qid = _queue_id(out)
    assert "6 new traces, 0 already there" in out
    rows = list(csv.DictReader(open(csv_path, encoding="utf-8")))
    assert len(rows) == 6 and len({r["inclusion_prob"] for r in rows}) > 1  # π differ: weighting matters

    # re-running the same sample: the same queue, no new trace, no new item
    again = _sample(uri, rid, tmp_path / "again.csv", capsys)
    assert _queue_id(again) == qid and "0 new traces, 6 already there" in again
    mlflow.set_tracking_uri(uri)
    queue = rq.find_queue(uri, qid, [exp])
    items = rq.queue_items(uri, qid)
    assert len(items) == 6
    traces = client.search_traces(locations=[exp], filter_string=f"tags.`{rq.QUEUE_TAG}` = '{queue.name}'")
    assert len(traces) == 6
    (schema,) = [s for s in mlflow.genai.label_schemas.list_label_schemas(exp) if s.name == review.SCHEMA]
    assert schema.input.options == ["supported", "unsupported"] and "context" in schema.instruction
    assert queue.schema_ids == [schema.schema_id]
    by_item = {t.info.tags[review.ITEM]: t for t in traces}
    for r in rows:  # π recorded exactly, and the claim the reviewer sees is the CSV's
        t = by_item[r["item_id"]]
        assert float(t.info.tags[review.PI]) == float(r["inclusion_prob"])
        assert t.info.tags[review.RUN] == rid
        (rec,) = [sp.inputs for sp in t.data.spans if sp.name == rq.RECORD_SPAN]
        assert (rec["claim"], rec["context"]) == (r["claim"], r["context"])  # exact, as the judge saw it
        assert not any(k.startswith("spotcheck.judge_") and k != "spotcheck.judge_model" for k in t.info.tags)
        assert "why claim" not in json.dumps(t.data.spans[0].inputs)  # blind: no judge verdict or rationale
        shown = t.data.spans[0].inputs["messages"][0]["content"]
        assert "**Claim:**" in shown and 'second chunk, "quoted"  \nacross lines' in shown  # lines kept
        assert "marked failed\\." in shown  # Markdown punctuation escaped: shown literally

    # a reviewer labels all but one claim in the Review tab: HUMAN feedback named after the schema
    blank = rows[-1]["item_id"]
    judge = judge_verdicts()  # the blind CSV carries no judge column
    for r in rows:
        human = _human(r["item_id"], judge[r["item_id"]])
        if r["item_id"] != blank:
            r["human_verdict"] = human
            mlflow.log_feedback(
                trace_id=by_item[r["item_id"]].info.trace_id,
                name=review.SCHEMA,
                value=human,
                source=AssessmentSource(source_type="HUMAN", source_id="alice"),
            )
    # noise the reader must ignore: the judge's own feedback under the same name
    mlflow.log_feedback(
        trace_id=by_item[blank].info.trace_id,
        name=review.SCHEMA,
        value="supported",
        source=AssessmentSource(source_type="LLM_JUDGE", source_id="judge"),
    )
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    # one scoring function, two readers: the same figures to the last bit
    claims = spotcheck.judged_claims(_per_query())
    from_csv = spotcheck.read_labels(csv_path, claims)
    ql = review.read_queue(uri, qid, [exp])
    from_queue = review.queue_labels(ql, claims, tmp_path / "exported.csv")
    assert from_queue.n_blank == from_csv.n_blank == 1 and from_queue.weighted and ql.run_id == rid
    pd.testing.assert_frame_equal(
        from_csv.rows.sort_values("item_id").reset_index(drop=True),
        from_queue.rows.sort_values("item_id").reset_index(drop=True),
    )
    a, b = (spotcheck.score_labels(x, seed=1, n_resamples=300) for x in (from_csv, from_queue))
    a.ppi, a.judge_only = spotcheck.faithfulness_estimates(from_csv, claims)
    b.ppi, b.judge_only = spotcheck.faithfulness_estimates(from_queue, claims)
    da, db = dataclasses.asdict(a), dataclasses.asdict(b)
    pd.testing.assert_frame_equal(da.pop("confusion"), db.pop("confusion"))
    assert json.dumps(da, default=str) == json.dumps(db, default=str)
    assert a.ppi.value != a.judge_only.value  # the human disagrees: PPI corrects the judge

    # through the CLI: the same summary, and the run gets the queue's labels as spotcheck/labels.csv
    assert spotcheck.main(["--tracking-uri", uri, "score", rid, str(csv_path), "--no-log"]) == 0
    via_csv = capsys.readouterr().out
    assert spotcheck.main(["--tracking-uri", uri, "score", "--from-mlflow", qid]) == 0
    via_queue = capsys.readouterr().out
    drop = lambda s: [ln for ln in s.splitlines() if not ln.startswith(("Labels:", "logged"))]  # noqa: E731
    assert drop(via_csv) == drop(via_queue) and f"review queue `{queue.name}`" in via_queue
    logged = client.get_run(rid).data.metrics
    if a.kappa_too_few:  # fewer than 5 labels in a class: κ is "too few to say", not logged (NaN)
        assert "spotcheck/kappa" not in logged and "too few to say" in via_queue
    else:
        assert logged["spotcheck/kappa"] == a.kappa
    assert client.get_run(rid).data.tags["spotcheck.queue"] == qid
    logged = Path(client.download_artifacts(rid, "spotcheck/labels.csv", str(tmp_path / "dl")))
    re_read = spotcheck.read_labels(logged, claims)  # the logged file re-scores identically via CSV
    again = spotcheck.score_labels(re_read, seed=1, n_resamples=300)
    assert again.kappa_too_few == a.kappa_too_few and (again.kappa == a.kappa or a.kappa_too_few)


def test_second_reviewer_disagreeing_is_named_and_the_latest_answer_scored(judged, tmp_path, capsys):
    root, uri, client, exp, rid = judged
    qid = _queue_id(_sample(uri, rid, tmp_path / "s.csv", capsys, "--queue", "two reviewers"))
    items = rq.read_items(uri, rq.find_queue(uri, qid, [exp]), review.SCHEMA)
    first = items[0].trace_id
    mlflow.set_tracking_uri(uri)
    for who, value in (("alice", "supported"), ("bob", "unsupported")):
        mlflow.log_feedback(
            trace_id=first, name=review.SCHEMA, value=value, source=AssessmentSource("HUMAN", who)
        )
        time.sleep(0.01)
    ql = review.read_queue(uri, "two reviewers", [exp])
    (rec,) = [r for _, r in ql.records if r["human_verdict"]]
    assert rec["human_verdict"] == "unsupported"
    assert any("different answers from different reviewers" in w for w in ql.warnings)


def test_missing_or_unlabelled_queue_exits_2_naming_it(judged, tmp_path, capsys):
    root, uri, client, exp, rid = judged
    assert spotcheck.main(["--tracking-uri", uri, "score", "--from-mlflow", "no such queue"]) == 2
    assert "review queue 'no such queue' does not exist" in capsys.readouterr().err
    _sample(uri, rid, tmp_path / "u.csv", capsys, "--queue", "nobody labelled")
    assert spotcheck.main(["--tracking-uri", uri, "score", "--from-mlflow", "nobody labelled"]) == 2
    err = capsys.readouterr().err
    assert "review queue 'nobody labelled'" in err and "no claim labelled (6 blank rows)" in err
    # a named queue that already holds another sample is not silently extended
    rc = spotcheck.main(
        ["--tracking-uri", uri, "sample", rid, "-n", "4", "--out", str(tmp_path / "v.csv"), "--to-mlflow"]
        + ["--queue", "nobody labelled"]
    )
    assert rc == 2 and "already holds another sample" in capsys.readouterr().err


def test_unreachable_server_exits_2_within_the_budget(monkeypatch, capsys):
    for key in (bounds.TIMEOUT, bounds.RETRIES, bounds.BACKOFF, bounds.JITTER, bounds.RETRY_AFTER):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv(bounds.RETRIES, "1")
    uri = f"http://127.0.0.1:{free_port()}"
    t0 = time.perf_counter()
    assert spotcheck.main(["--tracking-uri", uri, "score", "--from-mlflow", "q"]) == 2
    err = capsys.readouterr().err
    assert f"tracking server {uri} is unreachable" in err and "Traceback" not in err
    assert time.perf_counter() - t0 < 60


def test_killed_between_writing_and_attaching_does_not_duplicate(judged, tmp_path, capsys, monkeypatch):
    root, uri, client, exp, rid = judged

    def killed(*a, **k):
        raise KeyboardInterrupt  # fault injection: the process dies before the traces are attached

    monkeypatch.setattr(rq, "attach", killed)
    argv = ["--tracking-uri", uri, "sample", rid, "-n", "5", "--out", str(tmp_path / "k.csv"), "--to-mlflow"]
    with pytest.raises(KeyboardInterrupt):
        spotcheck.main([*argv, "--queue", "killed"])
    monkeypatch.undo()
    assert spotcheck.main([*argv, "--queue", "killed"]) == 0
    assert "0 new traces, 5 already there" in capsys.readouterr().out
    assert len(rq.queue_items(uri, rq.find_queue(uri, "killed", [exp]).queue_id)) == 5
    traces = client.search_traces(locations=[exp], filter_string=f"tags.`{rq.QUEUE_TAG}` = 'killed'")
    assert len(traces) == 5


def test_a_claim_support_schema_with_other_options_is_refused(judged):
    from mlflow.genai import label_schemas

    uri, client = judged[1], judged[2]
    exp = client.create_experiment("other schema")
    mlflow.set_tracking_uri(uri)
    label_schemas.create_label_schema(
        review.SCHEMA,
        type="feedback",
        input=label_schemas.InputCategorical(options=["yes", "no"]),
        experiment_id=exp,
    )
    with pytest.raises(spotcheck.claims.RunInputError, match="exists with another input"):
        rq.ensure_schema(uri, exp, review.SCHEMA, spotcheck.HUMAN_LABELS, review.INSTRUCTION)


def test_score_needs_labels_or_a_queue_not_both(judged, tmp_path, capsys):
    uri, rid = judged[1], judged[4]
    assert spotcheck.main(["--tracking-uri", uri, "score", rid]) == 2
    assert "score needs RUN labels.csv, or --from-mlflow QUEUE" in capsys.readouterr().err
    argv = ["--tracking-uri", uri, "score", rid, str(tmp_path / "x.csv"), "--from-mlflow", "q"]
    assert spotcheck.main(argv) == 2 and "not both" in capsys.readouterr().err


def test_a_label_whose_trace_was_deleted_is_counted_not_dropped_silently(judged, tmp_path, capsys):
    """Issue 31 item 12. Deleting a trace in MLflow removes its queue item and its HUMAN feedback
    too, so the queue alone shrinks without a word; the manifest ``publish`` logs on the run names
    the items whose trace is gone, in the output and in the logged summary, and n is the rest."""
    root, uri, client, exp, rid = judged
    qid = _queue_id(_sample(uri, rid, tmp_path / "d.csv", capsys, "--queue", "deleted traces"))
    items = rq.read_items(uri, rq.find_queue(uri, qid, [exp]), review.SCHEMA)
    assert len(items) == 6
    mlflow.set_tracking_uri(uri)
    for it in items:  # every claim labelled
        mlflow.log_feedback(trace_id=it.trace_id, name=review.SCHEMA, value="supported", source=AssessmentSource("HUMAN", "alice"))  # fmt: skip
    gone = [it.tags[review.ITEM] for it in items[:2]]
    client.delete_traces(experiment_id=exp, trace_ids=[it.trace_id for it in items[:2]])
    assert len(rq.queue_items(uri, qid)) == 4  # MLflow took the items with the traces: nothing else says so

    assert spotcheck.main(["--tracking-uri", uri, "score", "--from-mlflow", qid]) == 0
    out = capsys.readouterr().out
    line = "2 of the 6 sampled item(s) of review queue 'deleted traces'"
    assert line in out and "refer to deleted traces" in out and all(g in out for g in gone)
    summary = Path(client.download_artifacts(rid, "spotcheck/summary.md", str(tmp_path / "dl"))).read_text()
    assert line in summary
    labelled = client.get_run(rid).data.metrics
    assert labelled["spotcheck/n"] + labelled.get("spotcheck/n_judge_unparseable", 0) + labelled["spotcheck/n_blank"] == 4
