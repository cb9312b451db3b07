"""Tokens, cost and latency percentiles: the formulas, the usage plumbing through a real pipeline run
against an OpenAI-compatible endpoint, the pricing config, and the local llama.cpp server's usage."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rag_experiments.evaluation.cost import add_usage, cost_metrics, price, serving_latency_ms, usage_columns
from rag_experiments.evaluation.registry import higher_is_better, spec
from rag_experiments.judge.validity import build_judge
from rag_experiments.run.config_schema import validate
from rag_experiments.run.sweep import _priced
from rag_experiments.stages.generation import LocalLlamaGenerator, OpenAICompatibleGenerator
from tests import llm_fixtures
from tests.sweep_helpers import REPO, tiny_inputs, tiny_pipeline

fake_llm = llm_fixtures.fake_llm
CONF = REPO / "rag_experiments" / "conf"


def test_usage_columns_never_invent_zero():
    assert usage_columns({"prompt_tokens": 700, "completion_tokens": 60}) == {
        "tokens_in_generation": 700.0,
        "tokens_out_generation": 60.0,
    }
    got = usage_columns({"prompt_tokens": None, "attempts": 1})
    assert math.isnan(got["tokens_in_generation"]) and math.isnan(got["tokens_out_generation"])
    assert set(usage_columns(None, "judge")) == {"tokens_in_judge", "tokens_out_judge"}


def test_add_usage_sums_and_unknown_stays_unknown():
    a, b = (
        {"prompt_tokens": 10, "completion_tokens": 2, "attempts": 1},
        {"prompt_tokens": 5, "completion_tokens": 1},
    )
    assert add_usage(a, b) == {"prompt_tokens": 15, "completion_tokens": 3}
    assert add_usage() == {"prompt_tokens": 0, "completion_tokens": 0}  # no call: 0 tokens
    assert add_usage(a, None) is None and add_usage(a, {"prompt_tokens": 3}) is None


def test_cost_formula_worked_example_and_percentiles():
    n = 24
    df = pd.DataFrame(
        {
            "answer": ["a"] * n,
            "tokens_in_generation": [700.0] * n,
            "tokens_out_generation": [60.0] * n,
            "latency_generation_s": np.arange(1, n + 1, dtype=float),
            "latency_retrieval_s": 0.002,
        }
    )
    pricing = {"generation": {"price_per_1k_in": 0.00015, "price_per_1k_out": 0.0006}}
    m = cost_metrics(df, pricing)
    assert m["tokens_in/generation"] == 16800 and m["tokens_out/generation"] == 1440
    assert m["cost_usd"] == pytest.approx(16.8 * 0.00015 + 1.44 * 0.0006)
    assert m["latency_p50_ms/generation"] == pytest.approx(12500.0)
    assert m["latency_p95_ms/generation"] == pytest.approx(np.percentile(np.arange(1, 25), 95) * 1000)
    assert m["latency_p95_ms/retrieval"] == pytest.approx(2.0)
    assert cost_metrics(df)["cost_usd"] == 0.0  # no price table: a local model costs nothing
    # a priced stage with an answer that reported no usage: cost unknown, not an undercount
    df.loc[3, "tokens_in_generation"] = math.nan
    assert math.isnan(cost_metrics(df, pricing)["cost_usd"])
    # the judge is priced but its tokens are not recorded: unknown, not 0
    judge_priced = {"judge": {"price_per_1k_in": 0.001}}
    assert math.isnan(cost_metrics(df.drop(index=3), judge_priced)["cost_usd"])
    assert serving_latency_ms(df).iloc[0] == pytest.approx(1002.0)
    for key in ("cost_usd", "tokens_in/generation", "latency_p95_ms/judge", "tokens_out_generation"):
        assert spec(key).side == "cost" and higher_is_better(key) is False


def test_price_table_is_validated():
    assert price(None) == (0.0, 0.0)
    with pytest.raises(ValueError, match="price_per_1k_out"):
        price({"price_per_1k_out": -1})
    gen = OmegaConf.to_container(OmegaConf.load(CONF / "generator" / "openai.yaml"))
    cfg = {"generator": {**gen, "api_key_env": None, "pricing": {"price_per_1k_in": 0.1}}}

    def problems():
        return [p for p in validate(cfg) if p.startswith("conf/generator")]

    assert problems() == []
    cfg["generator"]["pricing"] = {"price_per_1k_inn": 0.1}
    assert any("conf/generator: pricing" in p for p in problems())
    cfg["generator"]["pricing"] = {"price_per_1k_in": "cheap"}
    assert any("must be a number" in p for p in problems())
    # the generator class never sees the price table
    node = OmegaConf.create({**gen, "pricing": {"price_per_1k_in": 0.1}})
    assert "pricing" not in _priced(node) and "model" in _priced(node)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_inputs(tmp_path_factory.mktemp("cost"), n_items=4)


def _pipeline(tiny, generator, pricing=None, judge=None):
    prompt = instantiate(OmegaConf.load(CONF / "prompt" / "concise.yaml"))
    judge = judge or build_judge("heuristic")
    return tiny_pipeline(tiny, generator=generator, prompt=prompt, judge=judge, pricing=pricing)


def test_usage_reaches_the_per_query_table_and_the_run_metrics(tiny, fake_llm):
    gen = OpenAICompatibleGenerator(base_url=fake_llm.base_url, model="ok", max_retries=0, timeout_s=10)
    pricing = {"generation": {"price_per_1k_in": 2.0, "price_per_1k_out": 4.0}}
    res = _pipeline(tiny, gen, pricing)
    df, agg = res.per_query, res.aggregates
    n = len(df)
    # the fake endpoint reports usage 1 prompt + 1 completion token per reply
    assert (df["tokens_in_generation"] == 1).all() and (df["tokens_out_generation"] == 1).all()
    assert agg["tokens_in/generation"] == n and agg["tokens_out/generation"] == n
    assert agg["cost_usd"] == pytest.approx(n / 1000 * 2.0 + n / 1000 * 4.0)
    assert agg["latency_p95_ms/generation"] >= agg["latency_p50_ms/generation"] > 0
    # the heuristic judge makes no model call: its tokens are unknown-by-construction, not 0
    assert df["tokens_in_judge"].isna().all() and "tokens_in/judge" not in agg
    # a second run answers from the cache: the usage (cost of the config) is kept
    again = _pipeline(tiny, gen, pricing)
    assert again.per_query["generation_cached"].all()
    assert again.aggregates["cost_usd"] == pytest.approx(agg["cost_usd"])


def test_llm_judge_tokens_are_recorded_and_cached_calls_report_the_same(tmp_path, fake_llm):
    from rag_experiments.judge import LLMJudge

    tiny = tiny_inputs(tmp_path, n_items=3)
    gen = OpenAICompatibleGenerator(base_url=fake_llm.base_url, model="ok", max_retries=0, timeout_s=10)
    judge = LLMJudge(fake_llm.base_url, model="judge-ok", max_retries=0, backoff_s=0.0, n_questions=1)
    pricing = {"judge": {"price_per_1k_in": 1.0, "price_per_1k_out": 2.0}}
    res = _pipeline(tiny, gen, pricing, judge=judge)
    df, agg = res.per_query, res.aggregates
    requests = sum(n for (model, _), n in fake_llm.attempts.items() if model == "judge-ok")
    # every judge call reports 1 + 1 tokens; a query counts each call it needs, the server saw each
    # distinct call once, so the per-query sums cover at least every request
    assert (df["tokens_in_judge"] >= 1).all() and (df["tokens_in_judge"] == df["tokens_out_judge"]).all()
    assert agg["tokens_in/judge"] == df["tokens_in_judge"].sum() >= requests > 0
    assert agg["cost_usd"] == pytest.approx(
        agg["tokens_in/judge"] / 1000 * 1.0 + agg["tokens_out/judge"] / 1000 * 2.0
    )
    # the re-run is answered from the cache and reports the same tokens and cost (cost of the config)
    again = _pipeline(tiny, gen, pricing, judge=judge)
    assert sum(n for (model, _), n in fake_llm.attempts.items() if model == "judge-ok") == requests
    assert again.per_query["tokens_in_judge"].tolist() == df["tokens_in_judge"].tolist()
    assert again.aggregates["cost_usd"] == pytest.approx(agg["cost_usd"])


def test_retrieval_only_run_costs_nothing(tiny):
    res = tiny_pipeline(tiny)
    assert res.aggregates["cost_usd"] == 0.0 and "tokens_in/generation" not in res.aggregates
    assert "latency_p95_ms/retrieval" in res.aggregates


@llm_fixtures.requires_smollm2
def test_local_llama_server_reports_usage():
    gen = LocalLlamaGenerator(max_tokens=8)
    prompt = [{"role": "user", "content": "Say hello to the whole wide world, please."}]
    g = gen.generate([prompt])[0]
    assert g.error is None, g.error
    cols = usage_columns(g.usage)
    assert cols["tokens_in_generation"] >= 10  # the chat template alone adds tokens
    assert 1 <= cols["tokens_out_generation"] <= 8
