"""Generators against a real llama.cpp server (packaged SmolLM2) and a misbehaving fake endpoint."""

from __future__ import annotations

import json
import time

import pytest

from rag_experiments.core.types import Chunk
from rag_experiments.stages.generation import LocalLlamaGenerator, OpenAICompatibleGenerator
from rag_experiments.stages.prompts import PromptTemplate
from tests import llm_fixtures

# fixtures shared with the other LLM tests (tests/llm_fixtures.py)
closed_port_url = llm_fixtures.closed_port_url
fake_llm = llm_fixtures.fake_llm
requires_smollm2 = llm_fixtures.requires_smollm2

CONTEXT = "Failed webhook deliveries retry with exponential backoff for 24 hours."
PROMPTS = [
    [
        {
            "role": "user",
            "content": f"Context: {CONTEXT}\nQuestion: How long do webhooks retry? Answer briefly.",
        }
    ],
    [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
    [{"role": "user", "content": "Say hello."}],
]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# -- real llama.cpp server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_gen():
    return LocalLlamaGenerator(max_tokens=16)


@requires_smollm2
def test_local_generator_answers_and_reuses_server(local_gen):
    out = local_gen.generate(PROMPTS)
    assert len(out) == 3
    for g in out:
        assert g.error is None and g.text.strip()
        assert g.model == "SmolLM2-135M-Instruct.Q4_1.gguf" and g.latency_s > 0
    second = LocalLlamaGenerator(max_tokens=16, temperature=0.0)
    assert second.base_url == local_gen.base_url  # one server per (model, ctx_size) per process
    assert second.base_url.startswith("http://127.0.0.1:")
    ident = json.loads(local_gen.identity)
    assert ident["model_sha256"] and "base_url" not in ident  # ephemeral port is not identity


@requires_smollm2
def test_openai_client_against_local_server_is_deterministic(local_gen):
    client = OpenAICompatibleGenerator(local_gen.base_url, model="smollm2", max_tokens=16, seed=7)
    a = client.generate(PROMPTS[:1])[0]
    b = client.generate(PROMPTS[:1])[0]
    assert a.error is None and a.text.strip()
    assert a.text == b.text  # temperature 0 + fixed seed
    assert "api_key" not in client.identity.lower() and "sk-" not in client.identity


# -- fault injection ----------------------------------------------------------------------------


def fake_client(base_url: str, model: str, **kw) -> OpenAICompatibleGenerator:
    kw = {"max_retries": 2, "backoff_s": 0.01, "timeout_s": 5.0, "concurrency": 4, **kw}
    return OpenAICompatibleGenerator(base_url, model=model, **kw)


def test_500_then_success_is_retried(fake_llm):
    out = fake_client(fake_llm.base_url, "flaky500").generate([user("p1"), user("p2")])
    assert [g.text for g in out] == ["echo: p1", "echo: p2"]
    assert all(g.error is None and g.usage["attempts"] == 2 for g in out)
    assert fake_llm.count("flaky500", "p1") == 2


def test_always_503_is_bounded_and_isolated(fake_llm):
    bad = fake_client(fake_llm.base_url, "always503", max_retries=3)
    good = fake_client(fake_llm.base_url, "ok")
    out = bad.generate([user("a"), user("b")]) + good.generate([user("c")])
    assert out[0].text == "" and "503" in out[0].error and "4 attempts" in out[0].error
    assert out[1].error and out[2].error is None and out[2].text == "echo: c"
    assert fake_llm.count("always503", "a") == 4  # 1 try + max_retries, no more


def test_mixed_batch_keeps_order(fake_llm):
    # one generator, one batch: failing prompts do not disturb the others, order preserved
    gen = fake_client(fake_llm.base_url, "ok")
    out = gen.generate([user(f"q{i}") for i in range(8)])
    assert [g.text for g in out] == [f"echo: q{i}" for i in range(8)]


def test_client_error_is_not_retried(fake_llm):
    g = fake_client(fake_llm.base_url, "bad400").generate([user("x")])[0]
    assert g.error and "400" in g.error
    assert fake_llm.count("bad400", "x") == 1


def test_timeout_is_retried_then_reported(fake_llm):
    fake_llm.slow_s = 1.5
    t0 = time.perf_counter()
    g = fake_client(fake_llm.base_url, "slow", timeout_s=0.3, max_retries=1).generate([user("t")])[0]
    assert g.error and "Timeout" in g.error and g.text == ""
    assert fake_llm.count("slow", "t") == 2
    assert time.perf_counter() - t0 < 1.5


def test_connection_refused(closed_port_url):
    g = fake_client(closed_port_url, "ok", max_retries=2).generate([user("x")])[0]
    assert g.error and "Connection" in g.error and "3 attempts" in g.error


@pytest.mark.parametrize("model", ["malformed", "nochoices"])
def test_malformed_replies_are_retried_then_reported(fake_llm, model):
    g = fake_client(fake_llm.base_url, model, max_retries=2).generate([user("m")])[0]
    assert g.error and g.text == ""
    assert fake_llm.count(model, "m") == 3


# -- prompts ------------------------------------------------------------------------------------


def test_prompt_render_numbers_chunks():
    chunks = [
        Chunk("a.md#0-10", "a.md", 0, 10, "Alpha text."),
        Chunk("b.md#0-9", "b.md", 0, 9, "Beta text."),
    ]
    t = PromptTemplate("t", "Say {decline_text} if unsure.", "Context:\n{context}\nQ: {question} {braces}")
    msgs = t.render(" Why? ", chunks)
    assert msgs[0] == {"role": "system", "content": "Say I don't know if unsure."}
    assert "[1] (a.md) Alpha text.\n\n[2] (b.md) Beta text." in msgs[1]["content"]
    assert msgs[1]["content"].endswith("Q: Why? {braces}")
    assert t.text != PromptTemplate("t", "Other.", t.template).text


def test_prompt_configs_load():
    from pathlib import Path

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[1] / "rag_experiments" / "conf" / "prompt"
    names = sorted(p.stem for p in conf.glob("*.yaml") if p.stem != "registry")  # registry: a reference
    assert {"concise", "cite", "quote_then_answer"} <= set(names)
    texts = set()
    for name in names:
        t = instantiate(OmegaConf.load(conf / f"{name}.yaml"))
        assert t.name == name and len(t.render("q?", [])) == 2
        texts.add(t.text)
    assert len(texts) == len(names)
