"""Prompts in the Prompt Registry end to end: a prompt ablation sweep registers and links the three
templates; a version edited "in the UI" is swept with ``prompt=registry -m prompt.version=1,2,3``;
MLflow's own UI (a real ``mlflow server``, headless Chromium) lists them with the runs that used them,
and a version's Traces view lists the traces of the answers it produced.

Generation goes to a local OpenAI-compatible HTTP endpoint (tests/llm_fixtures.FakeLLM) so the
sweep runs in seconds; its answers are deterministic per prompt, so cache reuse is visible.
"""

from __future__ import annotations

import html
import json
import re
import time

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from tests.llm_fixtures import FakeLLM
from tests.mlflow_ui import SCREENSHOTS, Page, chromium, mlflow_server, visible_text
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

CONCISE = "rag-experiments.concise"
NAMES = {"rag-experiments.cite", CONCISE, "rag-experiments.concise_tagged", "rag-experiments.quote_then_answer"}


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """The prompt ablation, then versions 1-3 of concise (v2 edited, v3 = v1's text) from the registry."""
    root = tmp_path_factory.mktemp("prompts")
    docs, ev = make_tiny(root, n_items=3)
    fake = FakeLLM()
    fake.thread.start()
    common = [
        *sweep_args(root, docs, ev),
        "generator=openai",
        f"generator.base_url={fake.base_url}",
        "generator.model=ok",
        "generator.api_key_env=null",
        "generator.max_retries=0",
        "retriever=bm25",
        "generation_subset=2",
        "metrics.bootstrap_resamples=100",
        "judge_card.enabled=false",
    ]
    try:
        run_sweep(root, "-m", *common, "prompt=concise,cite,quote_then_answer")
        client = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
        v1 = client.get_prompt_version(CONCISE, "1")
        v2 = [dict(m) for m in v1.template]
        v2[-1]["content"] += "\nAnswer in one word."
        client.register_prompt(CONCISE, v2, commit_message="edited in the UI")
        client.register_prompt(CONCISE, v1.template, commit_message="back to version 1")
        out = run_sweep(
            root, "-m", *common, "prompt=registry", f"prompt.name={CONCISE}", "prompt.version=1,2,3"
        ).stdout
    finally:
        fake.server.shutdown()
        fake.server.server_close()
    exp = client.get_experiment_by_name("test")
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("is_parent") != "true"]
    return root, client, exp.experiment_id, runs, out


def _linked(run) -> list[tuple[str, int]]:
    return [
        (p["name"], int(p["version"])) for p in json.loads(run.data.tags.get("mlflow.linkedPrompts", "[]"))
    ]


def test_the_three_templates_are_registered_once_and_each_run_links_its_version(sweeps):
    root, client, exp_id, runs, _ = sweeps
    assert {p.name for p in client.search_prompts(filter_string=f'experiment_id = "{exp_id}"')} == NAMES
    # two sweeps, five runs: the unchanged templates never made a second version
    for name in NAMES - {CONCISE}:
        assert [int(v.version) for v in client.search_prompt_versions(name)] == [1]
    yaml_runs = {r.data.params["prompt"]: r for r in runs if r.data.params["prompt"] != "registry"}
    assert set(yaml_runs) == {"concise", "cite", "quote_then_answer"}
    for option, run in yaml_runs.items():
        assert _linked(run) == [(f"rag-experiments.{option}", 1)]
        ids = client.get_prompt_version(f"rag-experiments.{option}", "1").tags["mlflow.prompt.run_ids"]
        assert run.info.run_id in ids.split(",")


def test_registry_versions_sweep_by_text_identity(sweeps):
    root, client, exp_id, runs, out = sweeps
    reg = {r.data.params["prompt.version"]: r for r in runs if r.data.params["prompt"] == "registry"}
    assert set(reg) == {"1", "2"}  # version 3 holds version 1's text: the same config, skipped
    (skip,) = [line for line in out.splitlines() if line.startswith("[skip]")]
    assert "prompt.version=3" in skip and "already FINISHED as run " + reg["1"].info.run_id in skip
    assert reg["1"].data.tags["config_hash"] != reg["2"].data.tags["config_hash"]
    assert _linked(reg["1"]) == [(CONCISE, 1), (CONCISE, 3)] and _linked(reg["2"]) == [(CONCISE, 2)]
    # v1 renders what prompt=concise rendered: its answers come from the cache, v2's from the model
    assert json.loads(reg["1"].data.tags["model_calls"]).get("generation") == 0
    assert json.loads(reg["2"].data.tags["model_calls"])["generation"] == 2
    template = client.download_artifacts(reg["2"].info.run_id, "prompt_template.txt", str(root))
    assert "Answer in one word." in open(template).read()


def test_prompts_tab_lists_the_templates_with_the_runs_that_used_them(sweeps, tmp_path):
    root, client, exp_id, runs, _ = sweeps
    used_v1 = [r.info.run_name for r in runs if (CONCISE, 1) in _linked(r)]
    assert len(used_v1) == 2
    with mlflow_server(root) as base:
        tab = chromium(
            f"{base}/#/experiments/{exp_id}/prompts", tmp_path / "p", SCREENSHOTS / "prompts_tab.png"
        )
        page = chromium(
            f"{base}/#/experiments/{exp_id}/prompts/{CONCISE}?promptVersion=1",
            tmp_path / "p",
            SCREENSHOTS / "prompt_version_runs.png",
        )
    listed = html.unescape(" ".join(visible_text(tab).split()))
    assert all(name in listed for name in NAMES), listed[-1500:]
    assert "Version 3" in listed  # concise's latest
    text = html.unescape(" ".join(visible_text(page).split()))
    assert "Viewing version 1" in text and "MLflow runs:" in text, text[-2000:]
    assert all(name in text for name in used_v1), text[-2000:]
    assert "{{context}}" in text and "{{question}}" in text


def _generated_traces(run, exp_id) -> set[str]:
    """The run's traces of the items it answered (the rest lie outside ``generation_subset``)."""
    traces = mlflow.search_traces(locations=[exp_id], run_id=run.info.run_id, return_type="list")
    return {t.info.trace_id for t in traces if any(s.span_type == "CHAT_MODEL" for s in t.data.spans)}


def test_each_version_lists_the_traces_that_used_it_and_its_app_versions_link_it(sweeps, tmp_path):
    """A prompt version's Traces view (what a user sees: the page's "Traces" switch, a real
    ``mlflow server``, headless Chromium) lists exactly the traces of the answers it produced; its
    runs' app versions (LoggedModels) name it among their linked prompts, and an app version's page
    shows them in its "Prompts" table."""
    root, client, exp_id, runs, _ = sweeps
    mlflow.set_tracking_uri(client.tracking_uri)
    expected: set[str] = set()
    for run in runs:
        generated = _generated_traces(run, exp_id)
        assert len(generated) == 2  # generation_subset=2 of the 3 items
        (model,) = client.get_run(run.info.run_id).inputs.model_inputs  # search_runs omits them
        models = json.loads(client.get_logged_model(model.model_id).tags["mlflow.linkedPrompts"])
        for name, version in _linked(run):
            linked = mlflow.search_traces(
                locations=[exp_id], filter_string=f"prompt = '{name}/{version}'", return_type="list"
            )
            # v3 was skipped (v1's text): v1's run, its app version and its traces stand for it too
            assert generated <= {t.info.trace_id for t in linked}
            assert {"name": name, "version": str(version)} in models
            if (name, version) == (CONCISE, 1):
                expected |= generated
    linked_v1 = mlflow.search_traces(locations=[exp_id], filter_string=f"prompt = '{CONCISE}/1'", return_type="list")
    assert {t.info.trace_id for t in linked_v1} == expected and len(expected) == 4  # two runs, two answers each
    (reg_v1,) = [r for r in runs if r.data.params.get("prompt.version") == "1"]
    (v1_model,) = client.get_run(reg_v1.info.run_id).inputs.model_inputs  # linked to v1 and v3
    with mlflow_server(root) as base:
        page = Page(tmp_path / "profile", size="1600,1400")
        try:
            page.open_mlflow(base)
            page.goto(f"{base}/#/experiments/{exp_id}/prompts/{CONCISE}?promptVersion=1")
            page.wait_for("document.body.innerText.includes('Viewing version 1')")
            page.js(  # the page's Preview / Compare / Traces switch
                "Array.from(document.querySelectorAll('button,label,[role=radio]'))"
                ".find(b => b.innerText.trim() === 'Traces').click()"
            )
            page.wait_for("document.body.innerText.includes('Request time')")
            page.js(  # the Traces view opens on the latest version (3): pick version 1 in its list
                "Array.from(document.querySelectorAll('div,span,a,button'))"
                ".filter(e => e.innerText && e.innerText.trim() === 'Version 1').pop().click()"
            )
            page.wait_for(" && ".join(f"document.body.innerText.includes('{t}')" for t in expected))
            time.sleep(1)  # a late row would show here
            text = page.js("document.body.innerText")
            page.js(  # MLflow's "Detect Issues" tip covers the table in the screenshot
                "Array.from(document.querySelectorAll('button')).find(b => b.innerText.trim() === 'Got it')?.click()"
            )
            page.screenshot(SCREENSHOTS / "prompt_version_traces.png")
            page.goto(f"{base}/#/experiments/{exp_id}/models/{v1_model.model_id}")  # its app version
            page.wait_for("document.body.innerText.includes('Prompt Name')")
            model_page = page.js("document.body.innerText").splitlines()
        finally:
            page.close()
    assert set(re.findall(r"tr-[0-9a-f]{32}", text)) == expected, "exactly the version's traces"
    assert f"{len(expected)} of " in text  # the view's count of traces matching its prompt filter
    rows = model_page[model_page.index("Prompt Name") + 2 :][:4]  # the version page's "Prompts" table
    assert rows == [CONCISE, "1", CONCISE, "3"], model_page[-80:]
