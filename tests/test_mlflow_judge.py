"""``judge=mlflow``: MLflow's built-in judges behind our Judge protocol.

Real plumbing: MLflow's own invocation against the packaged SmolLM2 on the embedded llama.cpp
server (quality irrelevant: SmolLM2 is at chance and often answers MLflow's literal "yes|no"),
and a real sweep that finishes with the verdicts recorded. Fakes only for faults: an endpoint
that answers garbage, one that always fails, a closed port.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from omegaconf import OmegaConf

from rag_experiments.core.types import VERDICTS
from rag_experiments.judge import faithfulness
from rag_experiments.run.config_schema import validate
from rag_experiments.tracking.mlflow_judge import GROUNDEDNESS, RELEVANCE, MLflowJudge, read_feedback_value
from rag_experiments.tracking.runs import load_per_query
from tests.http_fakes import FakeHTTP, Request, completion
from tests.llm_fixtures import closed_port_url, fake_llm, requires_smollm2, smollm2_path  # noqa: F401
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

CONF = Path(__file__).resolve().parent.parent / "rag_experiments" / "conf"
CONTEXT = (
    "Webhooks are retried up to 5 times with exponential backoff. "
    "Refunds take 5 to 10 business days to reach the customer's card."
)
CLAIMS = ["Webhooks are retried up to 5 times.", "Refunds are instant.", "The API is written in Rust."]


def test_feedback_values_other_than_yes_or_no_are_unparseable():
    assert read_feedback_value("yes") == read_feedback_value(" Yes ") == "supported"
    assert read_feedback_value("no") == read_feedback_value("NO") == "unsupported"
    for v in ("yes|no", "unknown", "", "maybe", None, 1, True):
        assert read_feedback_value(v) == "unparseable", v


# -- config validation: exit-2 messages name the key -----------------------------------------------


def _cfg(**judge) -> dict:
    return {
        "experiment_name": "t",
        "seed": 0,
        "metrics": {"ks": [1], "min_coverage": 0.5, "bootstrap_resamples": 200},
        "generator": {"_target_": "rag_experiments.stages.generation.LocalLlamaGenerator"},
        "judge": {"_target_": "rag_experiments.tracking.mlflow_judge.MLflowJudge", **judge},
    }


def test_config_validation_names_the_key():
    shipped = OmegaConf.to_container(OmegaConf.load(CONF / "judge" / "mlflow.yaml"))
    assert validate(_cfg(**{k: v for k, v in shipped.items() if k != "_target_"})) == []
    assert validate(_cfg(base_url="http://localhost:8000/v1", model="qwen")) == []
    (p,) = validate(_cfg(base_url="http://localhost:8000/v1", model=None))
    assert p.startswith("conf/judge: model: missing")
    (p,) = validate(_cfg(base_url="http://localhost:8000/v1", model="openai:/gpt-4o-mini"))
    assert p.startswith("conf/judge: model: must be a model name")
    (p,) = validate(_cfg(base_url="localhost:8000", model="m"))
    assert p.startswith("conf/judge: base_url: must be an http(s) URL")
    (p,) = validate(_cfg(base_url="http://localhost:8000/v1", model="m", api_key_env="sk-secretsecret"))
    assert p.startswith("conf/judge: api_key_env: must be the NAME") and "secret" not in p.split("(")[0]
    (p,) = validate(_cfg(num_retries=-1))
    assert p.startswith("conf/judge: num_retries: must be an integer >= 0")
    (p,) = validate(_cfg(max_tokenz=5))
    assert p.startswith("conf/judge: max_tokenz: unknown option for MLflowJudge")


def test_composed_judge_mlflow_config_is_checked_before_any_run():
    """Hydra's compose API on the real config tree, the same ``check`` the sweep runs (exit 2)."""
    from hydra import compose, initialize_config_dir

    import rag_experiments.run.sweep  # noqa: F401 - registers the sample_dir resolver
    from rag_experiments.run.config_schema import ConfigError, check

    with initialize_config_dir(str(CONF), version_base="1.3"):
        check(compose("config", overrides=["judge=mlflow"]))
        check(
            compose(
                "config", overrides=["judge=mlflow", "judge.base_url=http://127.0.0.1:9/v1", "judge.model=m"]
            )
        )
        for overrides, message in (
            (["judge.base_url=http://127.0.0.1:9/v1"], "conf/judge: model: missing"),
            (
                ["judge.base_url=http://127.0.0.1:9/v1", "judge.model='openai:/gpt-4o-mini'"],
                "conf/judge: model:",
            ),
            (["judge.max_tokens=0"], "conf/judge: max_tokens: must be an integer >= 1"),
            (["judge.rpm=0"], "conf/judge: rpm:"),  # the endpoint limits, as every endpoint's
        ):
            with pytest.raises(ConfigError) as e:
                check(compose("config", overrides=["judge=mlflow", *overrides]))
            assert any(p.startswith(message) for p in e.value.problems), e.value.problems


# -- faults: counted, never "no" ---------------------------------------------------------------------


def test_identity_names_the_judges_mlflow_and_the_endpoint_never_the_key(monkeypatch, fake_llm):  # noqa: F811
    import mlflow

    monkeypatch.setenv("MY_JUDGE_KEY", "s3cr3t-value")
    j = MLflowJudge(base_url=fake_llm.base_url, model="ok", api_key_env="MY_JUDGE_KEY")
    ident = json.loads(j.identity)
    assert ident["judges"] == [GROUNDEDNESS, RELEVANCE] and ident["mlflow"] == mlflow.__version__
    assert ident["base_url"] == fake_llm.base_url and ident["model"] == "ok" and ident["prompts"]
    assert "s3cr3t" not in j.identity
    assert MLflowJudge(base_url=fake_llm.base_url, model="other").identity != j.identity
    assert MLflowJudge(base_url=fake_llm.base_url, model="ok", max_tokens=9).identity != j.identity


def test_garbage_replies_and_failed_calls_are_unparseable_and_counted(monkeypatch, fake_llm, closed_port_url):  # noqa: F811
    monkeypatch.setenv("OPENAI_API_KEY", "user-key")
    garbage = MLflowJudge(base_url=fake_llm.base_url, model="garbage", num_retries=0)
    vs = garbage.verdicts(CLAIMS[:2], CONTEXT)
    assert [v.label for v in vs] == ["unparseable"] * 2
    assert all(v.error is None and v.raw == "banana split" for v in vs)  # a reply: cached, counted
    assert faithfulness(vs)[1:] == (2, 2) and math.isnan(faithfulness(vs)[0])
    assert math.isnan(garbage.answer_relevance("q?", "an answer")[0])

    for judge in (
        MLflowJudge(base_url=fake_llm.base_url, model="always503", num_retries=1),
        MLflowJudge(base_url=closed_port_url, model="m", num_retries=0),
        MLflowJudge(base_url=fake_llm.base_url, model="slow", num_retries=0, timeout_s=0.5),  # 2 s reply
    ):
        (v,) = judge.verdicts(CLAIMS[:1], CONTEXT)
        assert v.label == "unparseable" and v.error  # an error: not cached, asked again next run
    assert "failed after 1 attempts" in v.error and "timed out" in v.error  # our client's deadline decided
    assert fake_llm.attempts[("always503", next(p for (m, p) in fake_llm.attempts if m == "always503"))] == 2
    assert os.environ["OPENAI_API_KEY"] == "user-key"  # the batch's environment is restored


class _Scripted:
    """An endpoint replying MLflow's JSON with a fixed result per claim: it checks that MLflow's
    own request/parse path and our reading of its Feedback agree, which SmolLM2 (at chance)
    cannot show deterministically."""

    RESULTS = {"5 times": "yes", "instant": "no", "Rust": "yes|no"}

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.http = FakeHTTP(self._reply)
        self.server, self.base_url = self.http.server, self.http.url

    def _reply(self, r: Request) -> dict:
        req = r.body
        self.requests.append(req)
        prompt = req["messages"][-1]["content"]
        claim = prompt.split("<answer>", 1)[-1].split("</answer>", 1)[0]
        result = next((v for k, v in self.RESULTS.items() if k in claim), "yes")
        return completion(json.dumps({"rationale": "scripted", "result": result}), req["model"], (3, 2))


def test_mlflow_feedback_maps_to_labels_through_mlflows_own_parsing():
    ep = _Scripted()
    try:
        judge = MLflowJudge(
            base_url=ep.base_url, model="judge-7b", temperature=0.0, max_tokens=77, concurrency=2
        )
        vs = judge.verdicts(CLAIMS, CONTEXT)
        assert [v.label for v in vs] == ["supported", "unsupported", "unparseable"]
        assert all(v.error is None for v in vs) and vs[0].rationale == "scripted"
        assert faithfulness(vs) == (0.5, 3, 1)  # the unreadable "yes|no" is counted, not a "no"
        assert judge.answer_relevance("How often are webhooks retried?", CLAIMS[0]) == (
            1.0,
            "mlflow:relevance_to_query(yes=1,no=0)",
        )
    finally:
        ep.server.shutdown()
    req = ep.requests[0]  # what MLflow sent: our model name and knobs, its prompt and JSON format
    assert req["model"] == "judge-7b" and req["max_tokens"] == 77 and req["temperature"] == 0.0
    assert "<document>" in req["messages"][-1]["content"] and CONTEXT in req["messages"][-1]["content"]
    assert req["response_format"]["type"] == "json_schema"


class _Facts(_Scripted):
    """MLflow's correctness prompt answered by the expected fact it carries (``<claim>``): a fact
    about "5 times" yes, "instant" no, "Rust" the literal "yes|no", one about "down" a dead call;
    every other judge (groundedness, relevance) yes."""

    def _reply(self, r: Request):
        req = r.body
        self.requests.append(req)
        prompt = req["messages"][-1]["content"]
        if "The response is correct" not in prompt:  # not the correctness judge
            return completion(json.dumps({"rationale": "scripted", "result": "yes"}), req["model"])
        fact = prompt.split("<claim>", 1)[-1].split("</claim>", 1)[0]
        if "down" in fact:
            from tests.http_fakes import Reply

            return Reply(500, b"down")
        result = next((v for k, v in self.RESULTS.items() if k in fact), "yes")
        return completion(json.dumps({"rationale": "scripted", "result": result}), req["model"])


def test_key_facts_are_judged_by_mlflows_correctness_scorer_with_the_fact_as_expected_fact():
    ep = _Facts()
    try:
        from rag_experiments.stages.endpoint import usage, usage_since

        judge = MLflowJudge(base_url=ep.base_url, model="judge-7b", num_retries=0)
        before = usage()
        facts = ["retried 5 times", "refunds are instant", "written in Rust", "the API is down"]
        vs = judge.fact_verdicts("Webhooks are retried 5 times; refunds take days.", facts)
        assert [v.label for v in vs] == ["supported", "absent", "unparseable", "unparseable"]
        assert (
            vs[0].rationale == "scripted" and vs[2].error is None and vs[3].error
        )  # a reply vs a failed call
        from mlflow.genai.judges.prompts.correctness import get_prompt

        # the scorer's own prompt, the fact as its one expected fact; through our endpoint client
        sent = [q["messages"][-1]["content"] for q in ep.requests]
        assert get_prompt(request="", response="Webhooks are retried 5 times; refunds take days.",
                          expected_facts=["retried 5 times"]) in sent  # fmt: skip
        assert (
            len(sent) == 4 and sum(u["calls"] for u in usage_since(before).values()) == 4
        )  # counted by the client
        assert json.loads(judge.fact_identity)["judge"] == judge.identity
    finally:
        ep.server.shutdown()


class _FactsByAnswer(_Scripted):
    """MLflow's correctness prompt answered by the answer it carries: "never" → no, "maybe" → the
    literal "yes|no" (unparseable), else yes; every other judge yes."""

    def _reply(self, r: Request):
        prompt = r.body["messages"][-1]["content"]
        doc = prompt.split("<document>", 1)[-1] if "The response is correct" in prompt else ""
        result = "no" if "never" in doc else "yes|no" if "maybe" in doc else "yes"
        return completion(json.dumps({"rationale": "scripted", "result": result}), r.body["model"])


def test_a_run_with_judge_mlflow_logs_correctness_judged_and_counts_unparseable_fact_replies(tmp_path):
    from rag_experiments.stages.app import PythonApp
    from tests import test_fact_judge
    from tests.sweep_helpers import tiny_inputs, tiny_pipeline

    corpus, items, cache = tiny_inputs(tmp_path, n_items=4)
    answerable = [it for it in items if it.answerable][:3]
    test_fact_judge._answers.replies = {
        it.query: f"{' '.join(it.strong_key_facts) or it.gold_answer}. {tail}"
        for it, tail in zip(answerable, ("Yes.", "It is never so.", "maybe"), strict=True)
    }
    ep = _FactsByAnswer()
    try:
        judge = MLflowJudge(base_url=ep.base_url, model="judge-7b", num_retries=0)
        res = tiny_pipeline(
            (corpus, answerable, cache), app=PythonApp("tests.test_fact_judge:_answers"), judge=judge
        )
    finally:
        ep.server.shutdown()
    df = res.per_query.set_index("id")
    got = [df.loc[it.id, "correctness_judged"] for it in answerable]
    assert got[0] == 1.0 and got[1] == 0.0 and math.isnan(got[2])  # supported, "no", unread
    n_facts = len(answerable[2].strong_key_facts) or 1
    assert res.aggregates["n_unparseable_fact_verdicts"] == n_facts and res.calls["judge_facts"] > 0


# -- real: the packaged SmolLM2 on the embedded llama.cpp server --------------------------------------


@pytest.fixture(scope="module")
def smol_url():
    """The generator's own server (same file and ctx_size as conf/generator/local.yaml), 1 thread."""
    from rag_experiments.stages.generation import local_server

    return local_server(smollm2_path(), ctx_size=4096, n_threads=1, n_parallel=1)


@requires_smollm2
def test_smollm2_verdicts_through_mlflow(smol_url):
    judge = MLflowJudge(base_url=smol_url, model="smollm2", max_tokens=96)
    t0 = time.perf_counter()
    vs = judge.verdicts(CLAIMS[:2], CONTEXT)
    rel, method = judge.answer_relevance("How often are webhooks retried?", CLAIMS[0])
    dt = time.perf_counter() - t0
    assert [v.claim for v in vs] == CLAIMS[:2] and {v.label for v in vs} <= set(VERDICTS)
    assert all(v.error is None for v in vs), [v.error for v in vs]  # every call got a reply
    assert all(v.raw for v in vs)  # the feedback value (or the reply MLflow could not read)
    score, n, n_unp = faithfulness(vs)
    assert n == 2 and n_unp == sum(v.label == "unparseable" for v in vs)
    assert math.isnan(score) == (n_unp == 2)
    assert method.startswith("mlflow:") and (rel in (0.0, 1.0) or math.isnan(rel))
    # base_url: null = the embedded server on the GGUF (this same server: same file and ctx_size);
    # identity is the file's bytes, not the port
    embedded = MLflowJudge()
    assert embedded.base_url == smol_url and embedded.model == smollm2_path().name
    ident = json.loads(embedded.identity)
    assert (
        len(ident["model_sha256"]) == 64
        and "base_url" not in ident
        and str(smol_url) not in embedded.identity
    )
    print(f"\nSmolLM2 via MLflow: 3 calls in {dt:.1f} s; relevance {rel}")
    print("\n".join(f"  {v.label}: raw={v.raw[:80]!r} {v.rationale[:60]!r}" for v in vs))


@requires_smollm2
def test_sweep_with_judge_mlflow_finishes_and_records_verdicts(tmp_path, smol_url):
    """A real sweep (subprocess): MiniLM retrieval, SmolLM2 answers on 2 items, judged by MLflow's
    judges on the SmolLM2 server of this test process. BM25, k=2 and short answers keep it small
    (about 90 s on the shared, loaded 2-core machine: 4 judge calls at ~10 s, 2 answers)."""
    docs, ev = make_tiny(tmp_path, n_items=2)
    p = run_sweep(
        tmp_path,
        *sweep_args(tmp_path, docs, ev),
        "judge=mlflow",
        f"judge.base_url={smol_url}",
        "judge.model=smollm2",
        "judge.max_tokens=48",
        "generator.max_tokens=24",
        "retriever=bm25",
        "retriever.k=2",
        "generation_subset=2",
        "tracking.traces=false",
        "judge_card.max_pairs_model=4",  # the card's default 40 pairs would be 40 more SmolLM2 calls
    )
    assert "github.com" not in p.stderr  # no model-catalog fetch: offline
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = c.search_runs([c.get_experiment_by_name("test").experiment_id])
    assert run.info.status == "FINISHED", p.stdout[-2000:]
    assert run.data.tags["judge_model"] == "smollm2"
    df = load_per_query(c, run)
    assert len(df) == 2 and df["answer"].str.len().gt(0).all()
    verdicts = [v for s in df["verdicts"] for v in s]
    assert {v["label"] for v in verdicts} <= set(VERDICTS)
    assert df["n_claims"].sum() == len(verdicts)
    n_unp = sum(v["label"] == "unparseable" for v in verdicts)
    assert df["n_unparseable"].sum() == n_unp == run.data.metrics["n_unparseable_verdicts"]
    assert set(df["relevance_method"]) == {"mlflow:relevance_to_query(yes=1,no=0)"}
    # the judge in the experiment's Judges tab: MLflow's own built-in scorers (tracking/judges_tab.py)
    import mlflow
    from mlflow.genai.scorers import list_scorers

    mlflow.set_tracking_uri(c.tracking_uri)
    got = {(s.name, s.model) for s in list_scorers(experiment_id=run.info.experiment_id)}
    assert got == {
        ("groundedness-smollm2", "openai:/smollm2"),
        ("relevance_to_query-smollm2", "openai:/smollm2"),
    }
    # an unreadable relevance reply is NaN, left out of the mean and visible in its n
    n_rel = int(df["answer_relevance"].notna().sum())
    assert run.data.metrics.get("n_scored/answer_relevance", 0) == n_rel
    print(f"\nsweep: {len(verdicts)} verdicts, {n_unp} unparseable, relevance scored {n_rel}/2")
    print(
        "\n".join(
            line for line in p.stdout.splitlines() if line.startswith(("judging", "generation", "total"))
        )
    )


def test_judge_mlflow_calls_go_through_the_endpoint_client_dry_run_and_budget_hold(tmp_path):
    """MLflow's judge called its model itself: with a dry run it sent 85 real requests, with
    budget.max_calls=3 it sent 57, and judge.rpm was unknown (issue 42). Its requests now go
    through our endpoint client (a shim on 127.0.0.1): a dry run sends none, the budget stops it."""
    ep = _Scripted()
    try:
        docs, ev = make_tiny(tmp_path, n_items=2)
        args = [*sweep_args(tmp_path, docs, ev), "generator=openai", f"generator.base_url={ep.base_url}",
                "generator.model=m", "generator.api_key_env=null", "judge=mlflow", f"judge.base_url={ep.base_url}",
                "judge.model=m", "judge_card.enabled=false", "judge.rpm=600", "judge.max_concurrency=2"]  # fmt: skip
        dry = run_sweep(tmp_path, *args, "dry_run=true", check=False)
        assert dry.returncode == 0 and ep.http.count() == 0, (dry.returncode, dry.stderr[-1500:])
        assert re.search(r"^\S*\s+judging\s+[1-9]", dry.stdout, re.M), dry.stdout  # its calls counted, not sent
        capped = run_sweep(tmp_path, *args, "budget.max_calls=3", check=False)
        assert ep.http.count() <= 3, ep.http.count()  # generator and judge together: at most the limit
        assert capped.returncode != 0 and "budget" in capped.stderr, capped.stderr[-1500:]
    finally:
        ep.http.close()
