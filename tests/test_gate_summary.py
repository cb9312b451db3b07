"""``gate --summary-md``: the PR Markdown parses as CommonMark (+ GFM tables) and holds the right rows.

A real temporary MLflow store (sqlite) with two runs, their per-query tables and one trace per
eval item, as the sweep writes them (tag ``item_id``, linked to the run).
"""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd
import pytest
from markdown_it import MarkdownIt
from mlflow.tracking import MlflowClient

from rag_experiments.cli import gate

N = 60
IDS = [f"q{i:02d}" for i in range(N)]


def parse(md: str) -> list:
    """CommonMark with GFM tables (what GitHub renders); strict: a broken table is not a table."""
    return MarkdownIt("commonmark").enable("table").parse(md)


def tables(tokens) -> list[list[list[str]]]:
    """Every table as rows of cell texts as rendered (markup and escapes gone), header row first."""
    out, row, rows = [], None, None
    for i, t in enumerate(tokens):
        if t.type == "table_open":
            rows = []
        elif t.type == "tr_open":
            row = []
        elif t.type in ("th_open", "td_open"):
            kids = tokens[i + 1].children or []
            row.append("".join(c.content for c in kids if c.type in ("text", "code_inline")))
        elif t.type == "tr_close":
            rows.append(row)
        elif t.type == "table_close":
            out.append(rows)
    return out


def links(tokens) -> list[str]:
    return [
        c.attrs["href"]
        for t in tokens
        if t.type == "inline"
        for c in t.children or []
        if c.type == "link_open"
    ]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate_md")
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(uri)  # the trace exporter writes where the fluent API points
    exp = client.create_experiment("rag", artifact_location=str(tmp / "mlruns"))

    def log(name, size, hits):
        rid = client.create_run(exp, run_name=name, tags={"evalset_digest": "e1"}).info.run_id
        for k, v in {"chunking": "fixed", "chunking.size": size, "retriever": "dense"}.items():
            client.log_param(rid, k, v)
        table = pd.DataFrame(
            {
                "id": IDS,
                "query": [f"How do I | use feature {i}?" for i in range(N)],
                "hit_at_5": hits,
                "mrr": hits / 2,
            }
        )
        path = tmp / rid / "per_query.parquet"
        path.parent.mkdir()
        table.to_parquet(path)
        client.log_artifact(rid, str(path))
        traces = {}
        for item in IDS:
            span = client.start_trace("rag_query", experiment_id=exp, tags={"item_id": item}, run_id=rid)
            client.end_trace(span.trace_id)
            traces[item] = span.trace_id
        mlflow.flush_trace_async_logging()
        client.set_terminated(rid)
        return rid, traces

    hits = np.array([1.0 if i % 3 else 0.0 for i in range(N)])
    worse = hits.copy()
    worse[np.flatnonzero(hits == 1)[:20]] = 0.0  # 20 hits lost: −33 points
    base = log("base", "256", hits)
    cand = log("cand", "512", worse)
    return {
        "uri": uri,
        "exp": exp,
        "base": base,
        "cand": cand,
        "lost": [IDS[i] for i in np.flatnonzero(hits != worse)],
    }


def test_failing_gate_summary_has_verdict_rows_diff_and_trace_links(store, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "summary.md"
    (base, base_traces), (cand, cand_traces) = store["base"], store["cand"]
    args = ["--tracking-uri", store["uri"], "--baseline", base, "--candidate", cand, "--metric", "hit_at_5",
            "--metric", "mrr", "--resamples", "500", "--summary-md", str(out),
            "--allow-incomparable"]  # the two runs' chunk sizes differ: hit@5 and mrr on purpose  # fmt: skip
    assert gate.main(args) == 1
    md = out.read_text()
    toks = parse(md)
    heading = next(toks[i + 1].content for i, t in enumerate(toks) if t.type == "heading_open")
    assert heading == "Regression gate: ❌ FAIL"
    metrics, diff, flips = tables(toks)
    assert metrics[0][:4] == ["metric", "better", "baseline", "candidate"]
    rows = {r[0]: r for r in metrics[1:]}
    assert list(rows) == ["hit_at_5", "mrr"]
    assert rows["hit_at_5"][2:4] == ["0.6667", "0.3333"]
    assert rows["hit_at_5"][4].startswith("-0.3333 [") and rows["hit_at_5"][6].startswith("score test (Tango")
    assert rows["hit_at_5"][8] == "FAIL" and "bootstrap" in rows["mrr"][6]
    assert diff[1:] == [["chunking.size", "256", "512"]]
    # the 20 lost queries are worse; the first 10 listed, each with both runs' trace links
    assert "20 queries worse" in md and len(flips) == 11
    assert [r[1] for r in flips[1:]] == store["lost"][:10]
    assert flips[1][2] == "How do I | use feature 1?"  # the pipe survives, escaped, in its cell
    hrefs = links(toks)
    exp = store["exp"]
    assert f"#/experiments/{exp}/runs/{cand}" in hrefs and f"#/experiments/{exp}/runs/{base}" in hrefs
    for item in store["lost"][:10]:
        assert f"#/experiments/{exp}/traces?selectedEvaluationId={base_traces[item]}" in hrefs
        assert f"#/experiments/{exp}/traces?selectedEvaluationId={cand_traces[item]}" in hrefs


def test_passing_gate_summary_and_bad_input_writes_nothing(store, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "pass.md"
    base = store["base"][0]
    common = ["--tracking-uri", store["uri"], "--metric", "hit_at_5", "--summary-md", str(out)]
    assert gate.main([*common, "--baseline", base, "--candidate", base]) == 0
    md = out.read_text()
    toks = parse(md)
    assert "Regression gate: ✅ PASS" in md and "No query is worse on a gated metric." in md
    assert "(identical configs)" in md
    assert len(tables(toks)) == 1
    # the power note: 60 queries cannot resolve the default margin of 1/sqrt(60)? it is stated either way
    assert "**Power.**" in md
    bad = tmp_path / "bad.md"
    assert gate.main([*common[:-1], str(bad), "--baseline", base, "--candidate", "nope"]) == 2
    assert not bad.exists()
