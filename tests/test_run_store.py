"""The run store is the job's one door to tracking (issue 36 item 7, docs/architecture.md "The run
store"). The real pipeline (tiny corpus, real MiniLM and BM25, real fake endpoints on 127.0.0.1)
runs through ``run.sweep.run_job`` into the in-memory store, so the resume rule is checked without
an MLflow store; the contract tests hold the in-memory store and the MLflow one (a sqlite store
in a temp dir) to the same assertions, so the two cannot drift."""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import sys
import uuid
from dataclasses import FrozenInstanceError

import pandas as pd
import pytest

from rag_experiments.core.identity import code_fingerprint
from rag_experiments.run.assemble import HydraContext
from rag_experiments.run.sweep import register_prompts, run_job, start_run
from rag_experiments.stages.prompts import PromptTemplate
from rag_experiments.tracking.memory import MemoryStore
from rag_experiments.tracking.resume import original_run_id
from rag_experiments.tracking.run_reader import MemoryRunReader, MlflowRunReader, RunReader
from rag_experiments.tracking.run_store import MemoryRunStore, RunStore
from rag_experiments.tracking.run_writer import MlflowRunWriter, RunResults
from tests.llm_fixtures import closed_port_url, fake_llm  # noqa: F401 - fixtures
from tests.sweep_helpers import tiny_job


def _memory(tmp_path) -> tuple[RunStore, RunReader]:
    store = MemoryRunStore(MemoryStore(), "test")
    return store, MemoryRunReader(store.store)


def _mlflow(tmp_path) -> tuple[RunStore, RunReader]:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    return MlflowRunWriter.open(uri, "test", str(tmp_path / "mlruns")), MlflowRunReader(uri)


STORES = [
    pytest.param(_memory, id="memory"),
    pytest.param(_mlflow, id="mlflow", marks=pytest.mark.slow),  # a real sqlite MLflow store
]


def _runs(store: MemoryRunStore, status: str | None = None) -> list:
    """The store's runs, oldest first (``status``: only those)."""
    runs = sorted(store.store.runs.values(), key=lambda r: r.start_time)
    return [r for r in runs if status is None or r.status == status]


def _query_llm(url: str, model: str) -> tuple[str, ...]:
    """``query=rewrite`` with its own chat model at ``url`` (no retries): a remote step before the search."""
    return (
        "query=rewrite", "+generator@query.llm=openai", f"query.llm.base_url={url}", f"query.llm.model={model}",
        "query.llm.max_retries=0", "query.llm.timeout_s=5", "query.llm.api_key_env=null",
    )  # fmt: skip


# ---------------------------------------------------------------------------- the run path, in memory


def test_a_finished_run_is_skipped_and_force_reruns_it(tmp_path, capsys) -> None:
    """Real MiniLM dense retrieval, no generator: FINISHED; the same job again is a ``[skip]`` that
    starts no run and returns the same value; ``force=true`` runs it again."""
    store, _ = _memory(tmp_path)
    job = tiny_job(tmp_path, "retriever=dense", "generator=none")
    first = run_job(job, store)
    out = capsys.readouterr().out
    (run,) = _runs(store)
    assert run.status == "FINISHED" and "[skip]" not in out and f"(run {run.run_id}," in out
    assert run.metrics[f"hit_at_{job.k}"] == first and run.table is not None and len(run.table) == 8
    assert run.tags["config_hash"] == job.chash and run.tags["code_fingerprint"] == code_fingerprint()

    again = run_job(job, store)
    out = capsys.readouterr().out
    assert out.startswith("[skip] ") and f"already FINISHED as run {run.run_id}" in out, out
    assert again == first and len(_runs(store)) == 1  # nothing computed, nothing written

    forced = run_job(tiny_job(tmp_path, "retriever=dense", "generator=none", "force=true"), store)
    out = capsys.readouterr().out
    assert "[skip]" not in out and forced == first
    assert [r.status for r in _runs(store)] == ["FINISHED", "FINISHED"]
    assert _runs(store)[1].tags["config_hash"] == job.chash  # force is a place key: the same config


def test_the_job_is_immutable_and_its_prompt_versions_come_from_the_store(tmp_path) -> None:
    store, _ = _memory(tmp_path)
    job = tiny_job(tmp_path, "generator=openai", "generator.base_url=http://127.0.0.1:9/v1", "judge=heuristic")
    with pytest.raises(FrozenInstanceError):
        job.prompt_version = ("x", 1)  # type: ignore[misc]
    registered = register_prompts(store, job)
    assert job.prompt_version is None and registered is not job
    assert registered.prompt_version == (f"rag-experiments.{job.inputs.stages.prompt.name}", 1)
    assert registered.prompt_refs == (registered.prompt_version,)
    assert register_prompts(store, job).prompt_version == registered.prompt_version  # by content


@pytest.mark.parametrize("step", ["generate", "query"])
def test_a_step_failing_on_every_item_fails_the_run_and_the_same_job_reruns_it(
    tmp_path, capsys, closed_port_url, step  # noqa: F811
) -> None:
    """A dead endpoint (nothing listens): every item fails, the run is FAILED naming the step and
    a single run exits 1; the same job again is no ``[skip]``: it runs (and fails) again."""
    store, _ = _memory(tmp_path)
    if step == "generate":
        overrides = ("generator=openai", f"generator.base_url={closed_port_url}", "generator.max_retries=0",
                     "generator.api_key_env=null", "generation_subset=null", "judge=none")  # fmt: skip
    else:
        overrides = ("generator=none", *_query_llm(closed_port_url, "ok"))
    job = tiny_job(tmp_path, *overrides, n_items=4)
    with pytest.raises(SystemExit) as exit_:
        run_job(job, store)
    assert exit_.value.code == 1
    (run,) = _runs(store)
    assert run.status == "FAILED" and step in run.tags["failure_reason"], run.tags.get("failure_reason")
    assert f"[failed] {job.run_name}: " in capsys.readouterr().err

    with pytest.raises(SystemExit):
        run_job(job, store)
    out = capsys.readouterr().out
    assert "[skip]" not in out and [r.status for r in _runs(store)] == ["FAILED", "FAILED"]


def test_partial_failures_finish_and_the_same_job_redoes_only_those_items(tmp_path, capsys, fake_llm) -> None:  # noqa: F811
    """The query transform's endpoint refuses the first try of every second question (HTTP 400):
    FINISHED with the count; the same job reruns (no ``[skip]``), asks only the failed questions
    again, and then, complete, is skipped."""
    store, _ = _memory(tmp_path)
    job = tiny_job(tmp_path, "generator=none", *_query_llm(fake_llm.base_url, "flaky400"), n_items=4)
    run_job(job, store)
    (run,) = _runs(store)
    failed = int(run.metrics["n_query_errors"])
    assert run.status == "FINISHED" and 0 < failed < len(job.inputs.evalset.items), run.metrics
    asked = sorted(fake_llm.attempts.values())
    assert asked == [1] * len(asked)
    assert f"query errors {failed}" in capsys.readouterr().out

    run_job(job, store)
    out = capsys.readouterr().out
    assert "[skip]" not in out and f"[rerun] {job.run_name}: run {run.run_id} is FINISHED but incomplete" in out
    assert sorted(fake_llm.attempts.values()) == [1] * (len(asked) - failed) + [2] * failed  # those only
    assert [r.status for r in _runs(store)] == ["FINISHED", "FINISHED"]
    assert _runs(store)[1].metrics["n_query_errors"] == 0

    run_job(job, store)
    assert capsys.readouterr().out.startswith("[skip] ") and len(_runs(store)) == 2


# ---------------------------------------------------------------------------- one contract, two stores


def test_both_stores_have_every_method_of_the_door_with_its_parameters() -> None:
    members = [n for n in dir(RunStore) if not n.startswith("_") and callable(getattr(RunStore, n))]
    assert {"config_lock", "resume_decision", "reuse_in_sweep", "register_prompt", "start", "end"} <= set(members)
    for cls in (MlflowRunWriter, MemoryRunStore):
        for name in members:
            method = getattr(cls, name, None)
            assert callable(method), f"{cls.__name__} lacks {name}"
            want = list(inspect.signature(getattr(RunStore, name)).parameters)
            assert list(inspect.signature(method).parameters) == want, f"{cls.__name__}.{name}"


def _finished(store: RunStore, chash: str, fingerprint: str, evalset, metrics=None, status="FINISHED") -> str:
    """A run of ``chash`` logged through the writer's protocol: ``metrics`` (default a complete
    run's), a one-row table, no traces expected, then ``status``."""
    tags = {"config_hash": chash, "code_fingerprint": fingerprint, "evalset_digest": "e" * 16}
    run_id, _ = store.start(f"run-{chash}", tags, {"k": "3"})
    table = pd.DataFrame({"id": ["q1", "q2"], "query": ["a", "b"], "hit_at_3": [1.0, 0.0]})
    evalset_table = pd.DataFrame({"id": ["q1", "q2"], "query": ["a", "b"]})
    results = RunResults(
        {"hit_at_3": 0.5, "n_queries": 2.0, **(metrics or {})}, table, evalset_table, str(evalset), "e" * 16,
        {"config.yaml": "k: 3\n"}, {"traces_expected": "0"},
    )  # fmt: skip
    store.log_results(run_id, results)
    store.end(run_id, status)
    return run_id


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("make", STORES)
def test_resume_heal_and_pilot_follow_one_contract(tmp_path, make) -> None:
    store, reader = make(tmp_path)
    evalset = tmp_path / "evalset.jsonl"
    evalset.write_text("{}\n")
    assert tuple(store.resume_decision("c1", "fp")) == (None, "")  # nothing ran

    a = _finished(store, "c1", "fp", evalset)
    done, why = store.resume_decision("c1", "fp")
    assert done is not None and done.run_id == a and done.status == "FINISHED", why
    assert why == f"config_hash c1 and code_fingerprint fp already FINISHED as run {a} (force=true re-runs)"
    assert done.metrics["hit_at_3"] == 0.5 and done.tags["config_hash"] == "c1"
    assert store.per_query(done)["hit_at_3"].tolist() == [1.0, 0.0]
    assert store.resume_decision("c1", "fp2") == (None, f"code changed since run {a} (fingerprint fp -> fp2)")

    b = _finished(store, "c2", "fp", evalset, metrics={"n_errors": 2.0})  # items to retry
    assert store.resume_decision("c2", "fp") == (
        None, f"run {b} is FINISHED but incomplete (2 generation errors to retry (n_errors))"
    )  # fmt: skip
    for status in ("FAILED", "KILLED"):  # never reused, never named
        _finished(store, f"c-{status}", "fp", evalset, status=status)
        assert store.resume_decision(f"c-{status}", "fp") == (None, "")
    assert store.latest_finished_of_evalset("e" * 16).run_id == b  # the newest FINISHED (the pilot)
    assert store.latest_finished_of_evalset("f" * 16) is None

    host = socket.gethostname()
    dead, _ = store.start("dead", {"config_hash": "c3", "runner": f"{host}:{_dead_pid()}"}, {})
    alive, _ = store.start("alive", {"config_hash": "c3", "runner": f"{host}:{os.getppid()}"}, {})
    with store.config_lock("c3"):
        assert store.heal_stale_runs("c3") == [dead]
    assert reader.get(dead).status == "KILLED" and "healed" in reader.get(dead).tags
    assert reader.get(alive).status == "RUNNING"
    assert store.heal_stale_runs("c3") == []


@pytest.mark.parametrize("make", STORES)
def test_reuse_in_a_sweep_and_prompts_follow_one_contract(tmp_path, make) -> None:
    store, reader = make(tmp_path)
    evalset = tmp_path / "evalset.jsonl"
    evalset.write_text("{}\n")
    a = _finished(store, "c1", "fp", evalset)
    done = store.resume_decision("c1", "fp").done
    inv = uuid.uuid4().hex[:8]  # the parent's lock file is named by the invocation
    sweep = {"invocation": inv, "sweep_hash": inv * 2, "sweep_id": f"20260101-000000-{inv}", "varying": []}
    start = lambda: store.start("c1 again", {"config_hash": "c1", "code_fingerprint": "fp"}, {}, sweep)  # noqa: E731
    copy = store.reuse_in_sweep(done, "c1", sweep, False, start)
    assert copy is not None and copy != a
    got = reader.get(copy)
    assert got.status == "FINISHED" and got.parent_id is not None and got.tags["reused_from"] == a
    assert got.metrics["hit_at_3"] == 0.5 and reader.per_query(got)["hit_at_3"].tolist() == [1.0, 0.0]
    assert store.reuse_in_sweep(done, "c1", sweep, False, start) is None  # the parent holds it already
    again = store.resume_decision("c1", "fp").done  # the newest FINISHED run: the copy
    assert again.run_id == copy and original_run_id(again.tags, again.run_id) == a

    prompt = PromptTemplate("concise", "Answer briefly.", "{context}\n\n{question}")
    name, version = store.register_prompt(prompt)
    assert name == "rag-experiments.concise" and store.register_prompt(prompt) == (name, version)
    edited = PromptTemplate("concise", "Answer in one word.", "{context}\n\n{question}")
    assert store.register_prompt(edited) == (name, version + 1)
    store.link_reused_run(a, (name, version + 1))  # a run standing for another version too: no error


@pytest.mark.slow  # a real sqlite MLflow store
def test_the_run_path_skips_through_either_store_alike(tmp_path, capsys) -> None:
    """``run_job`` through the MLflow store prints the same decisions as through memory."""
    outs = {}
    for name, make in (("memory", _memory), ("mlflow", _mlflow)):
        store, reader = make(tmp_path / name)
        job = tiny_job(tmp_path / name, "generator=none", ctx=HydraContext(overrides=("generator=none",)))
        run_job(job, store)
        run_job(job, store)
        outs[name] = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
        run_id, _ = start_run(store, job)  # the protocol's start: RUNNING until ended
        assert reader.get(run_id).status == "RUNNING"
        store.end(run_id, "KILLED")
    assert outs["memory"] == outs["mlflow"] == ["[skip] generator=none"]



@pytest.mark.parametrize("make", STORES)
def test_the_job_opens_with_the_power_line_of_the_pilot_in_its_store(tmp_path, capsys, make) -> None:
    """``run.pilot``: the latest FINISHED run of the same eval set in the store is the pilot."""
    store, _ = make(tmp_path)
    job = tiny_job(tmp_path, "generator=none")
    metric = f"hit_at_{job.k}"
    pilot, _ = store.start("pilot", {"evalset_digest": job.inputs.evalset.digest}, {})
    table = pd.DataFrame({"id": [f"q{i}" for i in range(12)], metric: [float(i % 3 == 0) for i in range(12)]})
    evalset = tmp_path / "pilot.jsonl"
    evalset.write_text("{}\n")
    store.log_results(pilot, RunResults({metric: 1 / 3}, table, table[["id"]], str(evalset), "p" * 16, {}, {}))
    store.end(pilot, "FINISHED")
    run_job(job, store)
    out = capsys.readouterr().out
    assert out.startswith(f"[plan] {metric}: minimum detectable paired effect "), out[:500]
    assert f"python -m rag_experiments.plan --pilot {pilot} for the rest" in out.splitlines()[0]
