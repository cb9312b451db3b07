"""Every config an app version, seen in MLflow's own UI: a real ``mlflow server``, headless Chromium.

A two-config multirun (BM25, retrieval only) and a forced re-run of one config: the experiment's
**Agent versions** tab (``#/experiments/<id>/models``, mlflow 3.17.2) lists one version per config,
and the re-run config's version page lists both of its runs (its "Runs" section and the source run
of each metric); the **Judges** tab lists the scorers a ``judge=mlflow`` run registers. Screenshots:
``reports/screenshots/agent_versions.png``, ``agent_version.png``, ``judges.png``.
"""

from __future__ import annotations

import json

import mlflow
from mlflow.tracking import MlflowClient

from rag_experiments.tracking.judges_tab import register_judges
from rag_experiments.tracking.mlflow_judge import MLflowJudge
from tests.mlflow_ui import SCREENSHOTS, Page, mlflow_server
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

# JS: the run ids the page links to (``#/runs/<id>`` and ``#/experiments/<e>/runs/<id>``)
_RUN_LINKS = """Array.from(new Set(Array.from(document.querySelectorAll('a'))
  .map(a => (a.getAttribute('href') || '').match(/runs\\/([0-9a-f]{32})/)).filter(m => m).map(m => m[1])))"""


def test_agent_versions_lists_each_config_and_a_version_page_shows_its_runs(tmp_path):
    docs, ev = make_tiny(tmp_path)
    common = [*sweep_args(tmp_path, docs, ev), "generator=none", "retriever=bm25"]
    run_sweep(tmp_path, "-m", *common, "chunking=fixed,sentence")
    run_sweep(tmp_path, *common, "chunking=fixed", "force=true")  # a second run of one config
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = c.get_experiment_by_name("test").experiment_id
    runs = [r for r in c.search_runs([exp]) if "config_hash" in r.data.tags]  # not the parent
    by_config: dict[str, list[str]] = {}
    for r in runs:
        by_config.setdefault(r.data.tags["config_hash"], []).append(r.info.run_id)
    assert sorted(map(len, by_config.values())) == [1, 2]
    versions = {m.tags["config_hash"]: m for m in c.search_logged_models([exp])}
    assert set(versions) == set(by_config), "one app version per config"
    rerun = next(h for h, ids in by_config.items() if len(ids) == 2)
    # the Judges tab: what a judge=mlflow run registers (never called here: no endpoint needed)
    mlflow.set_tracking_uri(c.tracking_uri)
    judges = register_judges(exp, MLflowJudge(base_url="http://127.0.0.1:9/v1", model="qwen2.5-7b-instruct"))
    with mlflow_server(tmp_path) as base:
        page = Page(tmp_path / "profile", size="1600,1400")
        try:
            page.open_mlflow(base)
            page.goto(f"{base}/#/experiments/{exp}/models")
            names = [m.name for m in versions.values()]
            page.wait_for(" && ".join(f"document.body.innerText.includes({json.dumps(n)})" for n in names))
            listing = page.js("document.body.innerText")
            page.screenshot(SCREENSHOTS / "agent_versions.png")
            page.goto(f"{base}/#/experiments/{exp}/models/{versions[rerun].model_id}")
            page.wait_for(f"({_RUN_LINKS}).length >= 2 && document.body.innerText.includes('Runs')")
            linked = set(page.js(_RUN_LINKS))
            text = page.js("document.body.innerText")
            page.screenshot(SCREENSHOTS / "agent_version.png")
            page.goto(f"{base}/#/experiments/{exp}/judges")
            page.wait_for(" && ".join(f"document.body.innerText.includes({json.dumps(n)})" for n in judges))
            page.screenshot(SCREENSHOTS / "judges.png")
        finally:
            page.close()
    assert "Agent versions" in listing, "the GenAI side nav's tab"
    assert set(by_config[rerun]) <= linked, "the version page links both runs of its config"
    assert not set(sum((ids for h, ids in by_config.items() if h != rerun), [])) & linked
    assert versions[rerun].model_id in text and "hit_at_5" in text, "its id and evaluation metrics"
