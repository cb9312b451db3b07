"""Prompt templates in MLflow's Prompt Registry (tracking/prompt_registry.py) on a real sqlite store:
the {var} ↔ {{var}} round trip, content-addressed registration, prompt=registry by version and
alias, the identity that is the text (config_hash and generation cache), links through the public API."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.core.cache import StageCache
from rag_experiments.core.identity import semantic_config
from rag_experiments.core.types import Chunk
from rag_experiments.run.answer import generation_stage
from rag_experiments.run.config_schema import validate
from rag_experiments.run.types import Stages
from rag_experiments.stages.chunking import MarkdownChunker
from rag_experiments.stages.generation import OpenAICompatibleGenerator
from rag_experiments.stages.prompts import PromptRegistryError, PromptTemplate
from rag_experiments.stages.retrieval import BM25Retriever
from rag_experiments.tracking import prompt_registry as pr
from rag_experiments.tracking.writer import config_hash
from tests.llm_fixtures import fake_llm  # noqa: F401 - an OpenAI-compatible HTTP endpoint

CONCISE = "rag-experiments.concise"


@pytest.fixture(scope="module")
def blank_db(tmp_path_factory) -> Path:
    """An empty, migrated sqlite store, made once (creating the schema takes seconds)."""
    db = tmp_path_factory.mktemp("blank") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def store(tmp_path, blank_db):
    """A fresh copy of the blank store with one experiment; the per-process registration memo cleared."""
    pr._registered.clear()
    shutil.copy(blank_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    return client, client.create_experiment("prompts"), uri


def edited(t: PromptTemplate, extra: str = "\nAnswer in English.") -> PromptTemplate:
    return PromptTemplate(t.name, t.system, t.template + extra, t.decline_text)


def by_name(name: str) -> PromptTemplate:
    return next(t for t in pr.bundled_templates() if t.name == name)


def test_every_bundled_template_round_trips_through_mlflow_syntax():
    templates = pr.bundled_templates()
    assert sorted(t.name for t in templates) == ["cite", "concise", "concise_tagged", "quote_then_answer"]
    for t in templates:
        messages = pr.to_mlflow(t)
        assert [m["role"] for m in messages] == ["system", "user"]
        assert "{{context}}" in messages[1]["content"] and "{{question}}" in messages[1]["content"]
        assert "{{decline_text}}" in messages[0]["content"]
        assert not any("{context}" in m["content"].replace("{{context}}", "") for m in messages)
        assert pr.from_mlflow(messages, "x") == (t.system, t.template)


def test_templates_typed_in_the_ui_read_back_or_are_refused_naming_the_entry():
    # MLflow's UI allows spaces inside the braces and plain-text templates (no system message)
    assert pr.from_mlflow("Q: {{ question }}\n{{context}}", "w") == ("", "Q: {question}\n{context}")
    with pytest.raises(PromptRegistryError, match=r"prompts:/p/2: uses \{\{tone\}\}"):
        pr.from_mlflow([{"role": "user", "content": "{{context}} {{question}} {{tone}}"}], "prompts:/p/2")
    with pytest.raises(PromptRegistryError, match=r"must contain \{\{context\}\}"):
        pr.from_mlflow("only {{question}}", "prompts:/p/3")
    with pytest.raises(PromptRegistryError, match="roles"):
        pr.from_mlflow([{"role": "assistant", "content": "{{context}}{{question}}"}], "prompts:/p/4")
    with pytest.raises(ValueError, match="variable syntax"):
        pr.to_mlflow(PromptTemplate("x", "", "{{literal}} {context} {question}"))


def test_registering_twice_makes_one_version_and_an_edit_makes_version_2(store):
    client, exp, _ = store
    t = by_name("concise")
    assert pr.register(client, t, exp) == (CONCISE, 1)
    pr._registered.clear()  # a new process: the store, not the memo, answers
    assert pr.register(client, t, exp) == (CONCISE, 1)
    assert [int(v.version) for v in client.search_prompt_versions(CONCISE)] == [1]
    assert pr.register(client, edited(t), exp) == (CONCISE, 2)
    pr._registered.clear()
    assert pr.register(client, t, exp) == (CONCISE, 1)  # back to the original text: no version 3
    assert len(client.search_prompt_versions(CONCISE)) == 2
    v1 = client.get_prompt_version(CONCISE, "1")
    assert v1.tags[pr.DECLINE_TAG] == "I don't know" and v1.tags[pr.CONTENT_TAG]


def test_a_tagged_template_round_trips_through_the_registry(store):
    """context_format travels as a version tag: read back, the tagged template has the same text
    (no new version on the next run) and renders tagged; a plain template gets no such tag."""
    client, exp, uri = store
    t = by_name("concise_tagged")
    assert t.context_format == "tagged" and t.text.endswith("context_format: tagged")
    assert pr.register(client, t, exp) == ("rag-experiments.concise_tagged", 1)
    pr._registered.clear()
    assert pr.register(client, t, exp) == ("rag-experiments.concise_tagged", 1)
    got = pr.RegisteredPrompt("rag-experiments.concise_tagged", version=1, tracking_uri=uri)
    assert got.context_format == "tagged" and got.identity == t.text
    pr.register(client, by_name("concise"), exp)
    assert pr.CONTEXT_FORMAT_TAG not in client.get_prompt_version(CONCISE, "1").tags
    assert "context_format" not in by_name("concise").text  # the default's identity as before


def test_parallel_jobs_register_one_version(store):
    client, exp, uri = store
    t, got, errors = by_name("cite"), [], []

    def job():
        try:
            got.append(pr.register(MlflowClient(tracking_uri=uri), t, exp))
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=job) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and got == [("rag-experiments.cite", 1)] * 4
    assert len(client.search_prompt_versions("rag-experiments.cite")) == 1


def test_registered_prompt_by_version_and_alias_and_unknown_entries_named(store):
    client, exp, uri = store
    t = by_name("concise")
    pr.register(client, t, exp)
    pr.register(client, edited(t), exp)
    client.set_prompt_alias(CONCISE, "production", 1)
    v1 = pr.RegisteredPrompt(CONCISE, version=1, tracking_uri=uri)
    assert (v1.system, v1.template, v1.decline_text, v1.version) == (t.system, t.template, t.decline_text, 1)
    assert v1.render("q?", []) == t.render("q?", [])
    assert pr.RegisteredPrompt(CONCISE, alias="production", tracking_uri=uri).version == 1
    assert pr.RegisteredPrompt(CONCISE, alias="latest", tracking_uri=uri).version == 2
    assert pr.RegisteredPrompt(CONCISE, version=1, decline_text="n/a", tracking_uri=uri).decline_text == "n/a"
    cases = {
        "conf/prompt: version: prompts:/rag-experiments.concise/9 does not exist": {"version": 9},
        "conf/prompt: alias: prompts:/rag-experiments.concise@staging does not exist": {"alias": "staging"},
    }
    for message, kw in cases.items():
        with pytest.raises(PromptRegistryError, match=message.replace("/", ".")) as e:
            pr.RegisteredPrompt(CONCISE, tracking_uri=uri, **kw)
        assert uri in str(e.value) and ("versions: 1, 2" in str(e.value) or "production → 1" in str(e.value))
    with pytest.raises(PromptRegistryError, match="no prompt 'rag-experiments.nope'.*registered: rag-exp"):
        pr.RegisteredPrompt("rag-experiments.nope", version=1, tracking_uri=uri)


def test_registered_prompt_problems_read_a_plain_node(store):
    """The multirun's check before any run, on the job's resolved ``prompt`` node (no Hydra)."""
    client, exp, uri = store
    pr.register(client, by_name("concise"), exp)
    node = {"_target_": pr.REFERENCE_TARGETS[0], "name": CONCISE, "version": 9, "alias": None, "tracking_uri": uri}
    gen = {"_target_": "rag_experiments.stages.generation.LocalGenerator"}
    got = pr.registered_prompt_problems(gen, node)
    assert any("prompts:/rag-experiments.concise/9 does not exist" in p for p in got), got
    assert pr.registered_prompt_problems(gen, {**node, "version": 1}) == []
    assert pr.registered_prompt_problems(gen, {"_target_": "rag_experiments.stages.prompts.PromptTemplate"}) == []
    assert pr.registered_prompt_problems({}, node) == []  # generator=none: no prompt is used
    assert pr.is_registry_prompt(node) and not pr.is_registry_prompt(None)


def test_registry_config_is_checked_before_the_store_is_asked():
    node = {"_target_": pr.REFERENCE_TARGETS[0], "name": CONCISE, "version": None, "alias": None}
    cfg = {"experiment_name": "x", "seed": 0, "generator": {"_target_": "g"}, "prompt": node}
    assert any("set exactly one of prompt.version" in p for p in validate(cfg))
    assert any(
        "set exactly one" in p for p in validate({**cfg, "prompt": {**node, "version": 1, "alias": "a"}})
    )
    assert any(
        "version: must be a version number" in p for p in validate({**cfg, "prompt": {**node, "version": 0}})
    )
    assert not [p for p in validate({**cfg, "prompt": {**node, "version": 2}}) if p.startswith("conf/prompt")]
    yaml_prompt = {"_target_": "rag_experiments.stages.prompts.PromptTemplate", "name": "x", "system": ""}
    bad = {**yaml_prompt, "template": "{{json}} {context} {question}"}
    assert any("MLflow's prompt variable syntax" in p for p in validate({**cfg, "prompt": bad}))


def test_identity_is_the_template_text_not_the_version(store, tmp_path, fake_llm):  # noqa: F811
    """v1 and v3 hold one text: one config_hash, one set of generation cache entries; v2 differs."""
    client, exp, uri = store
    t = by_name("concise")
    pr.register(client, t, exp)
    pr.register(client, edited(t), exp)
    client.register_prompt(
        CONCISE, pr.to_mlflow(t), tags={pr.DECLINE_TAG: t.decline_text}
    )  # v3 = v1, via the UI
    prompts = {v: pr.RegisteredPrompt(CONCISE, version=v, tracking_uri=uri) for v in (1, 2, 3)}

    def chash(v: int) -> str:
        node = {"_target_": pr.REFERENCE_TARGETS[0], "name": CONCISE, "version": v, "tracking_uri": uri}
        stages = Stages(chunker=MarkdownChunker(), retriever=BM25Retriever(k=3), prompt=prompts[v])
        return config_hash({"prompt": node, "seed": 0}, "corpus", "evalset", stages.identities())

    assert semantic_config({"prompt": {"_target_": pr.REFERENCE_TARGETS[0], "version": 3}})["prompt"] == {
        "_target_": pr.REFERENCE_TARGETS[0]
    }
    assert chash(1) == chash(3) != chash(2)
    # the generation cache is keyed by the rendered prompt (pipeline.generation_stage)
    gen = OpenAICompatibleGenerator(base_url=fake_llm.base_url, model="ok", max_retries=0, timeout_s=10)
    cache = StageCache(tmp_path / "cache")
    chunks = [Chunk("a.md#0-5", "a.md", 0, 5, "Hello")]

    def misses(v: int) -> int:
        rendered = [prompts[v].render(q, chunks) for q in ("Who?", "When?")]
        return generation_stage(gen, rendered, cache, progress=False)[1]

    assert (misses(1), misses(3), misses(2)) == (2, 0, 2)


def test_runs_link_the_version_they_used_visible_through_the_public_api(store):
    client, exp, uri = store
    run_a, run_b = (client.create_run(exp).info.run_id for _ in range(2))
    ref = pr.register_for_run(client, exp, by_name("cite"))
    assert ref == ("rag-experiments.cite", 1)
    pr.link_run(client, run_a, *ref)
    pr.link_run(client, run_a, *ref)  # linking twice keeps one entry
    registered = pr.RegisteredPrompt("rag-experiments.cite", version=1, tracking_uri=uri)
    assert pr.register_for_run(client, exp, registered) == ("rag-experiments.cite", 1)
    pr.link_run(client, run_b, "rag-experiments.cite", 1)
    assert pr.linked_prompts(client, run_a) == [("rag-experiments.cite", 1)]
    listed = {p.name for p in client.search_prompts(filter_string=f'experiment_id = "{exp}"')}
    assert listed == {
        "rag-experiments.cite",
        "rag-experiments.concise",
        "rag-experiments.concise_tagged",
        "rag-experiments.quote_then_answer",
    }
    tags = client.get_prompt_version("rag-experiments.cite", "1").tags
    assert tags["mlflow.prompt.run_ids"].split(",") == [run_a, run_b]  # the version page's "MLflow runs"
    assert "0" not in client.get_prompt("rag-experiments.cite").tags["_mlflow_experiment_ids"].split(",")



def _link_at(uri: str, run_id: str, ref: tuple[str, int], start: float) -> None:
    """A sweep job's link step, started at wall-clock ``start`` (a separate process)."""
    import time

    client = MlflowClient(tracking_uri=uri)
    client.get_prompt_version(ref[0], str(ref[1]))  # the store opened before the start line
    time.sleep(max(0.0, start - time.time()))
    pr.link_run(client, run_id, *ref)


def test_parallel_jobs_linking_one_version_keep_every_run(store):
    """Jobs of a sweep that used one prompt link their runs at once (processes, as joblib's are):
    every run id is kept, and no job fails on the store's select-then-insert of the new tag (CI saw
    a UNIQUE-constraint error here)."""
    import multiprocessing as mp
    import time

    client, exp, uri = store
    ref = pr.register_for_run(client, exp, by_name("cite"))
    runs = [client.create_run(exp).info.run_id for _ in range(4)]
    ctx = mp.get_context("spawn")
    start = time.time() + 8  # after every process has imported and opened the store
    procs = [ctx.Process(target=_link_at, args=(uri, r, ref, start)) for r in runs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * len(runs)
    tags = client.get_prompt_version(ref[0], str(ref[1])).tags
    assert sorted(tags["mlflow.prompt.run_ids"].split(",")) == sorted(runs)


def test_an_app_version_links_each_prompt_version_once(store, monkeypatch):
    """The config's LoggedModel names the prompt version its runs use (``mlflow.linkedPrompts``), and
    a later job (a new process: memo empty) finds the link and writes nothing."""
    from rag_experiments.tracking.prompt_links import model_prompts

    client, exp, uri = store
    ref = pr.register_for_run(client, exp, by_name("cite"))
    model = client.create_logged_model(exp, name="cfg").model_id
    writes = []
    real = MlflowClient.link_prompt_version_to_model
    monkeypatch.setattr(
        MlflowClient, "link_prompt_version_to_model", lambda self, *a: writes.append(a) or real(self, *a)
    )
    pr._model_links.clear()
    pr.link_model(client, model, *ref)
    pr._model_links.clear()  # another job of the config, in another process
    pr.link_model(client, model, *ref)
    pr.link_model(client, model, "rag-experiments.concise", 1)
    assert model_prompts(client, model) == [ref, ("rag-experiments.concise", 1)]
    assert writes == [(ref[0], "1", model), ("rag-experiments.concise", "1", model)]


def _link_model_at(uri: str, model_id: str, version: int, start: float, lock_dir: str | None) -> None:
    """A job linking ``version`` to the app version at wall-clock ``start``; ``lock_dir``: its own
    host-lock directory (plays another host: no shared lock)."""
    import tempfile
    import time

    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    if lock_dir:
        tempfile.tempdir = lock_dir
    write = SqlAlchemyStore.set_logged_model_tags

    def slow_write(self, *a, **k):  # fault injection: a slow store widens MLflow's read-modify-write
        time.sleep(0.3)
        return write(self, *a, **k)

    SqlAlchemyStore.set_logged_model_tags = slow_write
    pr._model_links.clear()
    client = MlflowClient(tracking_uri=uri)
    client.get_logged_model(model_id)  # the store opened before the start line
    time.sleep(max(0.0, start - time.time()))
    pr.link_model(client, model_id, CONCISE, version)


def test_concurrent_jobs_linking_versions_to_one_app_version_keep_every_link(store):
    """Four jobs on one host link four versions of one prompt to one LoggedModel at once (processes;
    a slow store widens MLflow's read-modify-write of the model's tag): the host lock keeps every
    link. (Without it, in separate lock directories, this test loses links: docs/tracing.md.)"""
    import multiprocessing as mp
    import time

    from rag_experiments.tracking.prompt_links import model_prompts

    client, exp, uri = store
    t = by_name("concise")
    for i in range(4):
        pr.register(client, edited(t, f"\nVariant {i}.") if i else t, exp)
    model = client.create_logged_model(exp, name="cfg").model_id
    ctx = mp.get_context("spawn")
    start = time.time() + 8
    procs = [ctx.Process(target=_link_model_at, args=(uri, model, v, start, None)) for v in range(1, 5)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    assert sorted(model_prompts(client, model)) == [(CONCISE, v) for v in range(1, 5)]
