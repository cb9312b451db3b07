"""RAGAS and DeepEval against the simulated endpoint of ``bench_endpoint.py`` (imported by it only
when a peer client is asked for; neither library is a dependency: ``pip install -e '.[bench]'``
in a separate virtual environment, docs/endpoints.md).

Each peer generates the answers with its own concurrency machinery and its own client, then runs
its own faithfulness metric through its ``evaluate``:

- RAGAS 0.4: generation jobs on ``ragas.executor.Executor`` (the engine of ``evaluate``, its
  ``RunConfig``), then ``evaluate(metrics=[Faithfulness()], llm=llm_factory(model, client=OpenAI(...)))``
  (its documented client for an OpenAI-compatible endpoint; ``OpenAI()`` is what it builds by
  default). ``limits=True`` sets ``RunConfig(max_workers=in_flight)``: RAGAS documents no
  request-rate setting.
- DeepEval 4.3: ``LocalModel`` (its client for an OpenAI-compatible local endpoint) generating
  under ``AsyncConfig.max_concurrent`` and ``throttle_value`` as its ``evaluate`` does, then
  ``evaluate([LLMTestCase], [FaithfulnessMetric(model=...)])``. ``limits=True`` sets
  ``AsyncConfig(max_concurrent=in_flight, throttle_value=calls per test case · 60 / rpm)``.

A row counts as dropped when its answer failed or its faithfulness score is missing or NaN.
"""

from __future__ import annotations

import asyncio
import math
import os
import time

# nothing phones home: the endpoint is local
OFFLINE_ENV = {
    "DEEPEVAL_TELEMETRY_OPT_OUT": "YES",
    "DEEPEVAL_UPDATE_WARNING_OPT_IN": "NO",
    "DEEPEVAL_DISABLE_DOTENV": "1",
    "ERROR_REPORTING": "NO",
    "RAGAS_DO_NOT_TRACK": "true",
    "LANGCHAIN_TRACING_V2": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OPENAI_API_KEY": "sim",  # a client built without a key still starts; only the sim sees it
}


def set_offline_env() -> None:
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)


def missing(module: str) -> str | None:
    """None when ``module`` imports, else why not (the table prints "not installed")."""
    try:
        __import__(module)
    except ImportError as exc:
        return f"not installed ({exc.name})"
    return None


def _nan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def run_ragas(sim, n: int, limits: bool, questions: list[str], context: str) -> dict:
    import openai
    from ragas import EvaluationDataset, evaluate
    from ragas.executor import Executor
    from ragas.llms import llm_factory
    from ragas.metrics import Faithfulness
    from ragas.run_config import RunConfig

    run_config = RunConfig(max_workers=sim.limit) if limits else RunConfig()
    model = "sim-ragas"
    aclient = openai.AsyncOpenAI(base_url=sim.base_url, api_key="sim")  # the SDK's defaults: 2 retries

    async def generate(q: str) -> str:
        r = await aclient.chat.completions.create(model=model, messages=[{"role": "user", "content": q}])
        return r.choices[0].message.content

    t0 = time.perf_counter()
    ex = Executor(desc="generate", show_progress=False, raise_exceptions=False, run_config=run_config)
    for q in questions[:n]:
        ex.submit(generate, q)
    answers = ex.results()  # NaN where a job failed
    live = [i for i, a in enumerate(answers) if isinstance(a, str)]
    llm = llm_factory(model, client=openai.OpenAI(base_url=sim.base_url, api_key="sim"))
    data = EvaluationDataset.from_list(
        [
            {"user_input": questions[i], "response": answers[i], "retrieved_contexts": [context.format(i=i)]}
            for i in live
        ]
    )
    kw = {"run_config": run_config} if limits else {}
    result = evaluate(data, metrics=[Faithfulness()], llm=llm, show_progress=False, **kw)
    wall = time.perf_counter() - t0
    scores = result.to_pandas()["faithfulness"].tolist()
    return {
        "wall_s": wall,
        "dropped": n - sum(not _nan(s) for s in scores),
        "retries": None,
        "judged": len(live),
    }


def run_deepeval(sim, n: int, limits: bool, questions: list[str], context: str) -> dict:
    from deepeval import evaluate
    from deepeval.evaluate import AsyncConfig, DisplayConfig
    from deepeval.metrics import FaithfulnessMetric
    from deepeval.models import LocalModel
    from deepeval.test_case import LLMTestCase

    calls_per_case = 4  # truths, claims, verdicts, reason (include_reason=True, its default)
    cfg = (
        AsyncConfig(max_concurrent=sim.limit, throttle_value=calls_per_case * 60 / sim.rpm)
        if limits
        else AsyncConfig()
    )
    model = LocalModel(model="sim-deepeval", base_url=sim.base_url, api_key="sim")

    async def generate_all() -> list:
        sem = asyncio.Semaphore(cfg.max_concurrent)

        async def one(q: str):
            async with sem:
                try:
                    text, _ = await model.a_generate(q)
                    return text
                except Exception as exc:  # noqa: BLE001 - a failed answer is a dropped row
                    return exc

        tasks = []
        for q in questions[:n]:
            tasks.append(asyncio.create_task(one(q)))
            await asyncio.sleep(cfg.throttle_value / calls_per_case)  # one call per answer
        return await asyncio.gather(*tasks)

    t0 = time.perf_counter()
    answers = asyncio.run(generate_all())
    live = [i for i, a in enumerate(answers) if isinstance(a, str)]
    cases = [
        LLMTestCase(input=questions[i], actual_output=answers[i], retrieval_context=[context.format(i=i)])
        for i in live
    ]
    error = None
    scored = 0
    try:
        result = evaluate(
            cases,
            [FaithfulnessMetric(model=model)],
            async_config=cfg,
            display_config=DisplayConfig(show_indicator=False, print_results=False),
        )
        for tr in result.test_results:
            md = (tr.metrics_data or [None])[0]
            scored += md is not None and not md.error and not _nan(md.score)
    except Exception as exc:  # noqa: BLE001 - its default (ignore_errors=False) stops the evaluation
        error = f"`evaluate` raised {type(exc).__name__}"
        last = getattr(getattr(exc, "last_attempt", None), "exception", lambda: None)()  # tenacity's
        if last is not None:
            error += f" ({type(last).__name__} on the last attempt)"
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "dropped": n - scored, "retries": None, "judged": len(live), "error": error}
