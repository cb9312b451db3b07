"""``dry_run=true`` (``run.dry_run``, ``stages.dry_calls``): every config assembled and run in the
endpoint client's dry mode. Nothing reaches the endpoint, no MLflow run exists afterwards, the calls
it prints are the requests a real run then sends, and its budget verdict is what the real run with
that budget does (docs/endpoints.md, "Dry run")."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from rag_experiments.judge.claims import split_claims
from rag_experiments.stages import call_budget, dry_calls
from rag_experiments.stages.endpoint import Endpoint, endpoint_key
from tests.http_fakes import FakeHTTP, Request, completion
from tests.llm_fixtures import ChatServer, closed_port_url  # noqa: F401 - a fixture
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


def _reply(body: dict) -> str:
    """A deterministic model: a judge's verdict (constrained=none: max_tokens=8) is "yes", as a
    sound judge says; a decomposition lists the text's own sentence claims (as the dry run assumes);
    anything else three claim lines (as many as the dry run assumes, ``dry_calls.CLAIMS_PER_ANSWER``)
    that differ from one prompt to another, as answers do."""
    if body.get("max_tokens") == 8:
        return "yes"
    if "Break the answer below" in body["messages"][-1]["content"]:
        answer = re.search(r"<answer>\n(.*)\n</answer>", body["messages"][-1]["content"], re.S).group(1)
        return "\n".join(f"- {c}" for c in split_claims(answer))
    tag = hashlib.sha256(json.dumps(body["messages"]).encode()).hexdigest()[:8]
    return (f"- Webhooks are retried with backoff ({tag}).\n- The retry window lasts three days ({tag}).\n"
            f"- Each retry carries the same event id ({tag}).")  # fmt: skip


@pytest.fixture
def chat():
    s = ChatServer(_reply, usage=(100, 20))
    yield s
    s.close()


def test_dry_mode_records_the_request_and_sends_nothing(chat):
    call_budget.reset()
    ep = Endpoint(chat.url, "m")
    call_budget.set_price(endpoint_key(chat.url, "m"), 1.0, 2.0)
    body = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "x" * 400}]}
    dry_calls.start()
    try:
        reply = ep.post("/chat/completions", body)
        emb = ep.post("/embeddings", {"model": "m", "input": ["a", "b"]})
    finally:
        dry_calls.stop()
        call_budget.reset()
    assert chat.calls == 0
    assert reply.error is None and reply.data["choices"][0]["message"][
        "content"
    ] == dry_calls.placeholder_answer(body["messages"])
    assert len(emb.data["data"]) == 2
    chat_call, emb_call = dry_calls.calls()
    assert (chat_call.tokens_in, chat_call.tokens_out) == (100, 50)  # 400 chars / 4; max_tokens
    assert chat_call.usd == pytest.approx((100 * 1.0 + 50 * 2.0) / 1000)
    assert emb_call.tokens_in == 1 and emb_call.tokens_out == 0  # ceil(2 chars / 4)
    assert ep.post("/chat/completions", body).error is None and chat.calls == 1  # dry mode off: sent


def _rows(out: str) -> dict[str, int]:
    """config name → its calls, from the ``= config`` lines of the dry run's table."""
    rows, name = {}, None
    for line in out.splitlines():
        m = re.match(r"^(\S+)?\s+(\S.*?)\s{2,}(\d+)\s", line)
        if not m:
            continue
        name = m.group(1) or name
        if m.group(2) == "= config":
            rows[name] = int(m.group(3))
    return rows


def _runs(db):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    return [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]


def test_dry_run_counts_what_the_real_sweep_sends_and_its_budget_verdict_holds(chat, tmp_path):
    docs, ev = make_tiny(tmp_path, n_items=4)
    common = ["generator=openai", f"generator.base_url={chat.url}", "generator.model=m", "generator.api_key_env=null",
              "judge=openai", f"judge.base_url={chat.url}", "judge.model=m", "judge.api_key_env=null",
              "judge.use_logprobs=false", "judge.constrained=none", "retriever=bm25", "generation_subset=3",
              "metrics.bootstrap_resamples=100", "judge_card.max_pairs_model=5", "prompt=concise,cite"]  # fmt: skip
    dry = run_sweep(tmp_path, "-m", *sweep_args(tmp_path, docs, ev), *common, "dry_run=true")
    assert chat.calls == 0, dry.stdout  # nothing reached the endpoint
    assert not (tmp_path / "mlflow.db").exists()  # no store, so no run
    assert not (tmp_path / "cache" / "kv.sqlite").exists()  # no placeholder reached the stage cache
    rows = _rows(dry.stdout)
    assert set(rows) == {"prompt=concise", "prompt=cite"}, dry.stdout
    total = int(re.search(r"^total: (\d+) calls", dry.stdout, re.M).group(1))
    assert total == sum(rows.values()) > 6, dry.stdout
    assert "budget: none set" in dry.stdout

    real = tmp_path / "real"
    real.mkdir()
    run_sweep(real, "-m", *sweep_args(real, docs, ev), *common)
    assert chat.calls == total, dry.stdout  # the printed calls are the requests the real sweep sent
    assert {r.info.status for r in _runs(real / "mlflow.db")} == {"FINISHED"}
    again = run_sweep(real, "-m", *sweep_args(real, docs, ev), *common, "dry_run=true")
    assert "total: 0 calls" in again.stdout and again.stdout.count("skipped: run") == 2, again.stdout
    forced = run_sweep(real, "-m", *sweep_args(real, docs, ev), *common, "dry_run=true", "force=true")
    assert "total: 0 calls" in forced.stdout and "3 of 3 hit" in forced.stdout, forced.stdout  # all cached

    # a budget that the first config fits and the second passes: the verdict, then the real sweep
    first = rows["prompt=concise"]
    budget = f"budget.max_calls={first + 2}"
    verdict = run_sweep(tmp_path, "-m", *sweep_args(tmp_path, docs, ev), *common, "dry_run=true", budget)
    assert (
        "exceeds budget.max_calls" in verdict.stdout
        and "stop after config 1 (prompt=concise)" in verdict.stdout
    )
    assert "config 2 (prompt=cite) is FAILED at its call 3 of" in verdict.stdout, verdict.stdout
    capped = tmp_path / "capped"
    capped.mkdir()
    chat.calls = 0
    run_sweep(capped, "-m", *sweep_args(capped, docs, ev), *common, budget, check=False)
    assert chat.calls == first + 2
    by_name = {r.info.run_name: r for r in _runs(capped / "mlflow.db") if r.data.tags.get("config_hash")}
    status = {n: r.info.status for n, r in by_name.items()}
    assert status == {"prompt=concise": "FINISHED", "prompt=cite": "FAILED"}, status
    assert by_name["prompt=cite"].data.tags["failure_reason"].startswith("budget: budget.max_calls")
    fits = run_sweep(
        tmp_path, "-m", *sweep_args(tmp_path, docs, ev), *common, "dry_run=true", f"budget.max_calls={total}"
    )
    assert f"budget: fits budget.max_calls={total} ({total} calls)" in fits.stdout


def test_a_bad_dry_run_value_exits_2(tmp_path):
    p = run_sweep(tmp_path, "dry_run=maybe", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", check=False)
    assert p.returncode == 2 and "conf/config: dry_run: must be true or false" in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists()


def test_every_remote_step_is_counted_against_an_unreachable_endpoint_and_nothing_is_stored(tmp_path, closed_port_url):  # noqa: F811
    """The embeddings API (its config probe too, and the retriever's requests), query transform,
    LLM reranker, generator and judge all run on placeholders: the endpoint cannot be reached, yet every step is counted, and
    neither placeholder vectors nor answers reach the stage cache."""
    url = closed_port_url
    docs, ev = make_tiny(tmp_path, n_items=4)
    p = run_sweep(tmp_path, "-m", *sweep_args(tmp_path, docs, ev), "retriever.k=2,3", "generator=openai",
                  f"generator.base_url={url}", "generator.api_key_env=null", "judge=openai", f"judge.base_url={url}",
                  "judge.api_key_env=null", "query=rewrite", "rerank=llm", f"rerank.base_url={url}", "rerank.model=r",
                  "rerank.candidates=4", "embedding=openai", f"embedding.base_url={url}", "embedding.api_key_env=null",
                  "embedding.price_per_1k_tokens=0.00002", "generation_subset=2", "judge_card.enabled=false",
                  "dry_run=true")  # fmt: skip
    for step in ("checks", "retrieval", "query", "rerank", "generation", "judging"):  # by the steps' names
        assert re.search(rf"^\S*\s+{step}\s+[1-9]", p.stdout, re.M), (step, p.stdout)
    for step in ("checks", "retrieval"):  # the embeddings API's probe, then the retriever's requests
        line = next(line for line in p.stdout.splitlines() if re.search(rf"\s{step}\s", line))
        assert "n/a" not in line, p.stdout  # priced by embedding.price_per_1k_tokens, its probe too
    assert "from an earlier config" in p.stdout  # config 2 reuses config 1's transforms, as a real sweep does
    assert not [f for f in (tmp_path / "cache").rglob("*") if f.is_file()], (
        "the dry run wrote to the stage cache"
    )
    assert not (tmp_path / "mlflow.db").exists()


def _sound_model(r: Request) -> dict:
    """A chat model that behaves as the dry run assumes: one-sentence answers, a decomposer that
    lists an answer's own sentence claims, "yes" verdicts, three questions, "supported" facts."""
    text = "\n".join(str(m.get("content") or "") for m in r.body.get("messages") or [])
    if "Break the answer below" in text:
        answer = re.search(r"<answer>\n(.*)\n</answer>", text, re.S).group(1)
        return completion("\n".join(f"- {c}" for c in split_claims(answer)))
    if "Write 3 different questions" in text:
        return completion("What is retried?\nFor how long?\nWith which id?")
    if "reference fact" in text:
        return completion("supported")
    if "Is the claim supported" in text:
        return completion("yes")
    return completion("Failed webhook deliveries are retried with exponential backoff for three days.")


def test_the_judge_calls_counted_on_cached_answers_are_the_ones_a_real_run_makes(tmp_path):
    """With the answers in the cache, the dry run counted a placeholder's 3 claims for each: 2-3x
    the judge calls a real run then made (issue 42). It counts the cached answer's own claims."""
    docs, ev = make_tiny(tmp_path, n_items=4)
    with FakeHTTP(_sound_model) as ep:
        args = [*sweep_args(tmp_path, docs, ev), "generator=openai", f"generator.base_url={ep.url}", "generator.model=m",
                "generator.api_key_env=null", "retriever=bm25", "generation_subset=3", "judge_card.enabled=false",
                "metrics.bootstrap_resamples=100"]  # fmt: skip
        judge = ["judge=openai", f"judge.base_url={ep.url}", "judge.model=m", "judge.api_key_env=null",
                 "judge.use_logprobs=false", "judge.constrained=none"]  # fmt: skip
        run_sweep(tmp_path, *args, "judge=none")  # the answers, cached
        assert ep.count() == 3
        dry = run_sweep(tmp_path, *args, *judge, "dry_run=true")
        assert ep.count() == 3, dry.stdout
        assert re.search(r"^\S+\s+generation\s+0\s.*3 of 3 hit", dry.stdout, re.M), dry.stdout
        total = int(re.search(r"^total: (\d+) calls", dry.stdout, re.M).group(1))
        run_sweep(tmp_path, *args, *judge)
        assert ep.count() - 3 == total, dry.stdout  # the judge's requests, as counted


def test_a_retriever_on_a_local_model_is_not_run_and_its_cached_ranking_is_used(tmp_path):
    """A dry run embedded the corpus with MiniLM for every chunking (issue 45: 7 minutes for 12
    configs). It loads no model: each question's chunks are drawn, said as an estimate, the calls
    exact. Once a real run cached the ranking, it is used and the tokens are the real requests'."""

    def tokens(bodies) -> int:
        return sum(dry_calls.request_tokens("/chat/completions", b) for b in bodies)

    docs, ev = make_tiny(tmp_path, n_items=4)
    with FakeHTTP(_sound_model) as ep:
        args = [*sweep_args(tmp_path, docs, ev), "retriever=dense", "generator=openai", f"generator.base_url={ep.url}",
                "generator.model=m", "generator.api_key_env=null", "judge=none", "generation_subset=3",
                "judge_card.enabled=false", "metrics.bootstrap_resamples=100"]  # fmt: skip
        dry = run_sweep(tmp_path, *args, "dry_run=true")
        assert ep.count() == 0 and "Loading weights" not in dry.stderr, dry.stderr[-2000:]  # no MiniLM
        assert "estimates: 1 of 1 config(s) rank with a local model" in dry.stdout, dry.stdout
        assert re.search(r"^\S+\s+generation\s+3\s", dry.stdout, re.M), dry.stdout

        run_sweep(tmp_path, *args)  # the ranking and the concise prompt's answers, cached
        assert ep.count() == 3
        cite = run_sweep(tmp_path, *args, "prompt=cite", "dry_run=true")
        assert "estimates" not in cite.stdout, cite.stdout  # the cached ranking, not drawn chunks
        dry_in = int(re.search(r"^\S+\s+generation\s+3\s+(\d+)", cite.stdout, re.M).group(1))
        run_sweep(tmp_path, *args, "prompt=cite")
        sent = [r.body for _, r in ep.requests[3:]]
        assert len(sent) == 3 and dry_in == tokens(sent), cite.stdout  # the requests the real run sent
