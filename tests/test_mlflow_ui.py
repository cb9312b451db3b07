"""Two runs compared side by side in MLflow's own UI: a real ``mlflow server``, headless Chromium.

The route is the experiment's evaluation-runs view with a selected run and a second run to compare
to (``#/experiments/<id>/evaluation-runs?selectedRunUuid=<a>&compareToRunUuid=<b>``, the URL the UI
itself builds in mlflow 3.17.2): one pair of rows per request, each cell holding both runs' values.
Screenshots go to ``reports/screenshots/`` (gitignored; docs/tracing.md describes them).
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests.mlflow_ui import SCREENSHOTS, Page, chromium, mlflow_server, visible_text
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

# JS: the traces table (the one with a "Request" header) as {headers, rows: [[cell text, ...]]}
_TABLE = """(() => {
  const t = Array.from(document.querySelectorAll('[role=table]')).find(t =>
    Array.from(t.querySelectorAll('[role=columnheader]')).some(h => h.innerText.trim().startsWith('Request')));
  if (!t) return null;
  const text = e => e.innerText.trim();
  return {headers: Array.from(t.querySelectorAll('[role=columnheader]')).map(text),
          rows: Array.from(t.querySelectorAll('[role=row]')).map(r =>
            Array.from(r.querySelectorAll('[role=cell]')).map(text)).filter(r => r.length)};
})()"""
# JS: tick the named entries of the open "Columns" menu (what a user does to pick hit_at_1)
_TOGGLE = """(names => { const opts = Array.from(document.querySelectorAll('[role=option]'));
  return names.map(n => { const o = opts.find(e => e.innerText.trim() === n); if (o) o.click(); return !!o; });
})(%s)"""


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """One multirun: the same eval set chunked two ways (BM25, no models to load), retrieval only."""
    root = tmp_path_factory.mktemp("ui")
    docs, ev = make_tiny(root)
    out = run_sweep(
        root, "-m", *sweep_args(root, docs, ev), "generator=none", "retriever=bm25", "chunking=fixed,sentence"
    ).stdout
    c = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    exp = c.get_experiment_by_name("test")
    runs = [r for r in c.search_runs([exp.experiment_id]) if "traces" in r.data.tags]  # not the parent
    assert len(runs) == 2, [r.info.run_name for r in runs]
    tables = [
        pd.read_parquet(c.download_artifacts(r.info.run_id, "per_query.parquet", str(root / r.info.run_id)))
        for r in runs
    ]
    return root, exp.experiment_id, runs, tables, out


def _differing_item(tables: list[pd.DataFrame]) -> tuple[str, str, float, float]:
    """(item id, query, hit@1 of run a, of run b) of an item where the two configs differ."""
    a, b = (t.set_index("id") for t in tables)
    for item in a.index:
        ha, hb = a.at[item, "hit_at_1"], b.at[item, "hit_at_1"]
        if ha == ha and hb == hb and ha != hb:  # not NaN (unanswerable), and different
            return item, a.at[item, "query"], ha, hb
    raise AssertionError("the two chunkings give the same hit@1 on every item: pick another pair")


def test_ui_command_points_at_the_evaluation_runs_view(tmp_path, monkeypatch):
    from rag_experiments.tracking.writer import ui_command

    monkeypatch.chdir(tmp_path)
    cmd = ui_command("sqlite:///mlflow.db", "mlruns", "7")
    assert f"--backend-store-uri sqlite:///{tmp_path}/mlflow.db" in cmd
    assert cmd.endswith("# then open http://127.0.0.1:5000/#/experiments/7/evaluation-runs")
    assert (
        ui_command("http://host:5000/", None, "7") == "open http://host:5000/#/experiments/7/evaluation-runs"
    )
    assert ui_command("http://host:5000", None) == "open http://host:5000"


def test_two_runs_side_by_side_differ_in_hit_and_response(two_runs, tmp_path):
    root, exp_id, (run_a, run_b), tables, out = two_runs
    item, query, hit_a, hit_b = _differing_item(tables)
    top = [[r["chunk_id"] for r in t.set_index("id").at[item, "retrieved"][:5]] for t in tables]
    assert top[0] != top[1]
    # the sweep's last lines: the UI command and the experiment's evaluation-runs view
    printed = re.search(r"# then open (http://127\.0\.0\.1:5000(/\S*))", out.split("Open the MLflow UI:")[-1])
    assert printed and printed.group(2) == f"/#/experiments/{exp_id}/evaluation-runs", out[-800:]
    with mlflow_server(root) as base:
        # the printed view, as a user first sees it: both runs listed
        dom = chromium(base + printed.group(2), tmp_path / "p0", SCREENSHOTS / "evaluation_runs.png")
        assert "Evaluation runs" in dom
        assert run_a.info.run_name in dom and run_b.info.run_name in dom
        url = (
            f"{base}/#/experiments/{exp_id}/evaluation-runs"
            f"?selectedRunUuid={run_a.info.run_id}&compareToRunUuid={run_b.info.run_id}"
        )
        # pick the hit_at_1 and failure_label assessment columns (a real click), read the pair of rows
        page = Page(tmp_path / "p1", size="2200,1300")
        try:
            page.open_mlflow(base)
            page.goto(url)
            page.wait_for(f"document.body.innerText.includes({json.dumps(query)})")
            page.js(
                "Array.from(document.querySelectorAll('button'))"
                ".find(b => /^Columns\\s*\\d+\\/\\d+/.test(b.innerText.trim())).click()"
            )
            page.wait_for("document.querySelectorAll('[role=option]').length > 0")
            hide = [
                "Trace ID",
                "Expected facts",
                "expected_retrieved_context",
                "context_precision_at_1",
                "context_precision_at_10",
            ]
            # hit_at_1 and failure_label must exist; the clutter columns are hidden where MLflow shows
            # them (non-headline metrics sit inside one more_metrics assessment, docs/tracing.md)
            found = page.js(_TOGGLE % json.dumps(["hit_at_1", "failure_label", *hide]))
            assert found[:2] == [True, True], found
            page.js(
                "document.activeElement.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape', bubbles: true}))"
            )
            page.wait_for(f"({_TABLE}).headers.some(h => h.startsWith('hit_at_1'))")
            table = page.js(_TABLE)
            text = visible_text(page.html())
            page.screenshot(SCREENSHOTS / "compare_runs.png")
        finally:
            page.close()
    m = re.search(r"Comparing\s+(?:#\w+\s+)?(\S+)\s+to\s+(?:#\w+\s+)?(\S+)", text)
    assert m and m.groups() == (run_a.info.run_name, run_b.info.run_name), "both runs named in the header"
    assert query in text, "the query is a row of the comparison"
    (row,) = [r for r in table["rows"] if f'"item_id": "{item}"' in "".join(r)]
    # the header rows start with the column groups (Expectations, Assessments, ...): leaf headers last
    headers = [h.split("\n")[0] for h in table["headers"][-len(row) :]]
    cell = dict(zip(headers, row, strict=True))
    assert cell["hit_at_1"].split() == [f"{hit_a:g}", f"{hit_b:g}"], "each run's hit@1 on the same query"
    labels = {t.set_index("id").at[item, "failure_label"] for t in tables}
    assert set(cell["failure_label"].split()) == labels
    # retrieval-only runs answer with their top chunk ids (the root span's output): they differ
    resp = cell["Response"]
    assert top[0][0] in resp and top[1][0] in resp and resp.count("[") == 2
