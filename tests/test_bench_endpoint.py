"""scripts/bench_endpoint.py without RAGAS or DeepEval: the simulated endpoint answers each judge
protocol with a reply the protocol reads, our LLMJudge makes its real calls through it, and a peer
that is not installed is a "not installed" row, not a failure (docs/endpoints.md)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_endpoint.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_endpoint", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Instructor's JSON mode (RAGAS 0.4): a Pydantic schema with a nested model behind $ref
NLI_SCHEMA = {
    "$defs": {
        "StatementFaithfulnessAnswer": {
            "properties": {
                "statement": {"type": "string"},
                "reason": {"type": "string"},
                "verdict": {"type": "integer"},
            },
            "required": ["statement", "reason", "verdict"],
            "type": "object",
        }
    },
    "properties": {"statements": {"items": {"$ref": "#/$defs/StatementFaithfulnessAnswer"}, "type": "array"}},
    "required": ["statements"],
    "type": "object",
}


def test_schema_instance_fills_every_property_and_follows_refs(bench):
    value = bench.schema_instance(NLI_SCHEMA)
    assert list(value) == ["statements"] and len(value["statements"]) == 2
    assert value["statements"][0] == {"statement": bench.CLAIMS[0], "reason": bench.CLAIMS[0], "verdict": 1}
    assert bench.schema_instance({"enum": ["supported", "unsupported"]}) == "supported"
    assert bench.schema_instance({"anyOf": [{"type": "null"}, {"type": "number"}]}) == 1.0


def test_reply_answers_json_mode_tool_calls_and_logprobs(bench):
    prompt = "the parsed objects in json that match the following json_schema:\n" + json.dumps(NLI_SCHEMA)
    body = {"messages": [{"role": "system", "content": prompt}], "response_format": {"type": "json_object"}}
    content = bench.reply("/v1/chat/completions", body)["choices"][0]["message"]["content"]
    assert json.loads(content)["statements"][1]["verdict"] == 1

    out = {"name": "Out", "parameters": {"properties": {"x": {"type": "integer"}}}}
    message = bench.reply(
        "/v1/chat/completions", {"messages": [], "tools": [{"type": "function", "function": out}]}
    )
    call = message["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "Out" and json.loads(call["function"]["arguments"]) == {"x": 1}

    choice = bench.reply("/v1/chat/completions", {"messages": [], "logprobs": True})["choices"][0]
    assert choice["logprobs"]["content"][0]["top_logprobs"][0]["token"] == "yes"
    assert json.loads(bench.chat_text('Return JSON with a "truths" key'))["truths"] == bench.CLAIMS


def test_bound_is_the_tighter_of_rate_and_in_flight_limits(bench):
    assert bench.bound_seconds(400, 120, 4, 0.4) == pytest.approx(200.0)  # 400 calls at 2 a second
    mean = 2.0 * math.exp(0.125)  # median 2 s: 4 in flight bind before 6000 RPM
    assert bench.bound_seconds(400, 6000, 4, 2.0) == pytest.approx(400 * mean / 4)


def test_ours_makes_the_judge_calls_a_real_run_makes(bench):
    """One generation per item, then LLMJudge: one split call and one logprob verdict per claim."""
    sim = bench.SimEndpoint(rpm=100_000, in_flight=8, median_s=0.001, p500=0.0)
    try:
        row = bench.run_ours(sim, 3, declared=False)
    finally:
        sim.close()
    assert row["dropped"] == 0 and row["judged"] == 3
    assert sim.stats["ok"] == 3 + 3 * (1 + len(bench.CLAIMS)) and sim.stats["ok_judge"] == 9


def test_ours_folded_makes_one_judge_call_per_answer(bench):
    """judge.fold=true: the claims and their verdicts in one constrained JSON call per answer."""
    sim = bench.SimEndpoint(rpm=100_000, in_flight=8, median_s=0.001, p500=0.0)
    try:
        row = bench.run_ours(sim, 3, declared=True, fold=True)
    finally:
        sim.close()
    assert row["dropped"] == 0 and row["judged"] == 3
    assert sim.stats["ok"] == 3 + 3 and sim.stats["ok_judge"] == 3


def test_peers_not_installed_are_rows_not_failures(bench, capsys):
    for lib in ("ragas", "deepeval"):
        if importlib.util.find_spec(lib) is not None:
            pytest.skip(f"{lib} is installed here (the bench extra); this checks the project venv")
    argv = ["--items", "1", "--rpm", "100000", "--median-s", "0.001", "--p500", "0"]
    assert bench.main([*argv, "--clients", "ragas,deepeval-limits"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [ln for ln in out if ln.startswith(("| RAGAS", "| DeepEval"))]
    assert len(rows) == 2 and all("not installed" in r for r in rows)
    assert bench.main([*argv, "--clients", "ours,nope"]) == 2


def test_table_says_where_dropped_rows_went(bench):
    row = {"client": "ragas", "items": 200, "judged": 132, "dropped": 70, "retries": None, "wall_s": 205.5,
           "bound_s": 198.0, "bound_share": 0.96, "judge_calls_per_answer": 2.0, "requests": 660,
           "http_429": 255, "server": {"500": 9}}  # fmt: skip
    line = bench.table([row, {"client": "deepeval", "skipped": "not installed (deepeval)"}])
    assert "| 70 (68 answers, 2 scores) | 2.00 | 660 | — | 255 | 9 |" in line[2]
    assert line[3].count("|") == 11 and "not installed (deepeval)" in line[3]
