"""``budget.max_calls`` / ``budget.max_usd`` (``stages.call_budget``), counted by the endpoint client:
a call that would pass the budget is never sent, the run is FAILED with a ``budget`` reason, and
the same command with a larger budget resumes it; a budget smaller than the first call exits 2."""

from __future__ import annotations

import json

import pytest

from rag_experiments.run.config_schema import ConfigError, check
from rag_experiments.stages import call_budget, endpoint
from rag_experiments.stages.endpoint import Endpoint
from tests.llm_fixtures import ChatServer
from tests.sweep_helpers import REPO, make_tiny, run_sweep, sweep_args


@pytest.fixture(autouse=True)
def _fresh_budget():
    call_budget.reset()
    yield
    call_budget.reset()


@pytest.fixture
def chat():
    s = ChatServer(lambda body: "an answer", usage=(100, 20))
    yield s
    s.close()


def _ask(ep: Endpoint, text: str = "hi", max_tokens: int = 50):
    return ep.post("/chat/completions", {"model": ep.model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]})


def test_max_calls_refuses_the_call_past_it_without_sending_it(chat):
    call_budget.set_budget(max_calls=3)
    ep = Endpoint(chat.url, "budget-calls")
    before = endpoint.usage()
    replies = [_ask(ep, str(i)) for i in range(5)]
    assert [r.error is None for r in replies] == [True, True, True, False, False]
    assert replies[3].error.startswith("budget: budget.max_calls=3 reached") and replies[3].attempts == 0
    assert chat.calls == 3  # the refused calls were never sent
    used = endpoint.usage_since(before)[f"{chat.url}#budget-calls"]
    assert used["calls"] == 3 and used["budget_refused"] == 2
    assert call_budget.stop_reason().startswith("budget: budget.max_calls=3") and "same command" in call_budget.stop_reason()
    call_budget.set_budget(max_calls=3)  # a multirun's next job, same budget: still stopped
    assert call_budget.stop_reason()
    call_budget.set_budget(max_calls=10)  # raised: the stop is lifted and calls go again
    assert call_budget.stop_reason() == ""
    assert _ask(ep, "again").error is None and chat.calls == 4


def test_max_usd_counts_the_replies_cost_and_refuses_before_passing_it(chat):
    key = endpoint.endpoint_key(chat.url, "budget-usd")
    call_budget.set_price(key, 1.0, 2.0)  # USD per 1000 tokens: a reply of (100, 20) costs 0.14
    body = {"model": "budget-usd", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    bound = call_budget.call_bound(key, body)
    assert bound == pytest.approx((len(json.dumps(body)) / 4 + 2 * 50) / 1000)
    call_budget.set_budget(max_usd=0.14 * 3 + bound - 1e-9)  # room for 3 replies, not a 4th call's bound
    ep = Endpoint(chat.url, "budget-usd")
    before = endpoint.usage()
    ok = [_ask(ep).error is None for _ in range(5)]
    assert ok == [True, True, True, False, False] and chat.calls == 3
    used = endpoint.usage_since(before)[key]
    assert used["usd"] == pytest.approx(0.42) and used["tokens"] == 360
    assert call_budget.spent()["usd"] == pytest.approx(0.42) and "max_usd" in call_budget.stop_reason()


def _cfg(**b) -> dict:
    return {"experiment_name": "t", "seed": 0, "metrics": {"ks": [1], "bootstrap_resamples": 1000}, "budget": b,
            "generator": {"_target_": "rag_experiments.stages.generation.OpenAICompatibleGenerator",
                          "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": None, "max_tokens": 256,
                          "pricing": {"price_per_1k_in": 0.00015, "price_per_1k_out": 0.0006}}}  # fmt: skip


@pytest.mark.parametrize(
    ("budget_node", "message"),
    [
        ({"max_calls": 0}, "conf/config: budget.max_calls: must be an integer >= 1 or null (got 0)"),
        ({"max_usd": -1}, "conf/config: budget.max_usd: must be a number > 0 or null (got -1)"),
        ({"max_usd": 0.0001}, "conf/config: budget.max_usd: 0.0001 USD is less than the first generation can cost"),
        ({"max_calls": 5, "max_dollars": 3}, "conf/config: budget.max_dollars: unknown key"),
    ],
)
def test_bad_budgets_are_named(budget_node, message):
    with pytest.raises(ConfigError) as e:
        check(_cfg(**budget_node))
    assert any(p.startswith(message) for p in e.value.problems), e.value.problems


def test_max_usd_is_checked_against_the_first_generations_input_too():
    """The check compared ``max_usd`` with the first generation's output alone (issue 42): a budget
    its prompt's input tokens pass was accepted, and the sweep then stopped at its first call. The
    check's cost is at most what the budget reserves for that call (``call_budget.call_bound``)."""
    import yaml

    from rag_experiments.stages.prompts import PromptTemplate

    prompt = yaml.safe_load((REPO / "rag_experiments/conf/prompt/concise.yaml").read_text())
    cfg = _cfg(max_usd=0.0005)
    cfg["prompt"] = prompt
    cfg["generator"]["pricing"] = {"price_per_1k_in": 0.01, "price_per_1k_out": 0.0006}  # output: 0.0001536 USD
    with pytest.raises(ConfigError) as e:
        check(cfg)
    (why,) = [p for p in e.value.problems if "less than the first generation can cost" in p]
    from rag_experiments.run.endpoint_checks import prompt_chars

    tokens = -(-prompt_chars(prompt) // 4)
    assert f"at least {tokens} tokens in" in why and tokens > 30, why
    first = float(why.split("(")[1].split(" USD")[0])
    assert first == pytest.approx((0.01 * tokens + 0.0006 * 256) / 1000, abs=1e-6)
    key = endpoint.endpoint_key("http://127.0.0.1:9/v1", "m")
    call_budget.set_price(key, 0.01, 0.0006)
    messages = PromptTemplate(**{k: v for k, v in prompt.items() if k != "_target_"}).render("?", [])
    assert first <= call_budget.call_bound(key, {"model": "m", "max_tokens": 256, "messages": messages})
    check(_cfg(max_usd=0.0005))  # without the prompt's text, as before: the output's bound only


def test_a_budget_large_enough_passes_the_check():
    check(_cfg(max_calls=100, max_usd=1.0))
    check(_cfg(max_calls=None, max_usd=None))


def test_max_calls_stops_a_sweep_and_the_same_command_resumes_it(chat, tmp_path):
    from mlflow import MlflowClient

    docs, ev = make_tiny(tmp_path, n_items=6)
    args = [*sweep_args(tmp_path, docs, ev), "generator=openai", f"generator.base_url={chat.url}",
            "generator.model=m", "generator.api_key_env=null", "generator.concurrency=1", "judge=heuristic",
            "retriever=bm25", "generation_subset=5", "metrics.bootstrap_resamples=100",
            "judge_card.enabled=false"]  # fmt: skip
    first = run_sweep(tmp_path, *args, "budget.max_calls=3", check=False)
    assert first.returncode != 2, first.stderr[-2000:]
    assert chat.calls == 3  # never past the budget
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    (run,) = runs
    assert run.info.status == "FAILED", first.stdout[-2000:]
    assert run.data.tags["failure_reason"].startswith("budget: budget.max_calls=3 reached")
    assert json.loads(run.data.tags["endpoint_usage"])[f"{chat.url}#m"]["budget_refused"] == 2
    again = run_sweep(tmp_path, *args, "budget.max_calls=50")
    assert chat.calls == 5, again.stdout[-2000:]  # only the two refused generations were asked for
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert any(r.info.status == "FINISHED" and r.data.tags["config_hash"] == run.data.tags["config_hash"] for r in runs)
    assert run_sweep(tmp_path, *args, "budget.max_calls=1", check=False).returncode == 0  # done: skipped, no call
    assert chat.calls == 5
