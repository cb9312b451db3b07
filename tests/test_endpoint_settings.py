"""One endpoint settings type (issue 42, item 6): the seven remote users compose
``stages.endpoint_settings.EndpointSettings``, declare what they take with ``Takes``, and a bad value
of a shared key is refused once, naming the key, in every group (docs/endpoints.md)."""

from __future__ import annotations

import inspect

import pytest
from hydra import compose, initialize_config_dir

import rag_experiments.run.assemble  # noqa: F401 - registers ${sample_dir:}
from rag_experiments.judge.llm import LLMJudge, LocalLLMJudge
from rag_experiments.run.config_schema import validate
from rag_experiments.run.config_types import constructor_hints
from rag_experiments.stages import api_embedding
from rag_experiments.stages.api_embedding import OpenAIEmbedder
from rag_experiments.stages.app import HttpApp
from rag_experiments.stages.endpoint_settings import RANGES, EndpointSettings
from rag_experiments.stages.generation import LocalLlamaGenerator, OpenAICompatibleGenerator
from rag_experiments.stages.rerank import EndpointReranker, LLMReranker
from rag_experiments.tracking.mlflow_judge import MLflowJudge
from tests.http_fakes import FakeHTTP, embeddings
from tests.sweep_helpers import REPO

USERS = (OpenAICompatibleGenerator, LocalLlamaGenerator, LLMJudge, LocalLLMJudge, MLflowJudge,
         EndpointReranker, LLMReranker, OpenAIEmbedder, HttpApp)  # fmt: skip
DEAD = "http://127.0.0.1:9/v1"  # never called: building a client sends nothing


def _validate(*overrides: str) -> list[str]:
    from omegaconf import OmegaConf

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "rag_experiments" / "conf")):
        cfg = compose("config", overrides=list(overrides))
    return validate({k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "hydra"})


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["generator=openai", f"generator.base_url={DEAD}", "generator.concurrency=0"],
         "conf/generator: concurrency: must be an integer >= 1 (got 0)"),
        (["generator=local", "generator.timeout_s=0"], "conf/generator: timeout_s: must be a number > 0 (got 0)"),
        (["judge=openai", f"judge.base_url={DEAD}", "judge.rpm=-1"],
         "conf/judge: rpm: must be a number in (0, 1000000] or null (no limit) (got -1)"),
        (["judge=local", "judge.max_retries=-1"], "conf/judge: max_retries: must be an integer >= 0 (got -1)"),
        (["judge=mlflow", "judge.max_concurrency=0"],
         "conf/judge: max_concurrency: must be an integer in [1, 1024] or null (no limit) (got 0)"),
        (["judge=mlflow", "judge.num_retries=-2"], "conf/judge: num_retries: must be an integer >= 0 (got -2)"),
        (["rerank=endpoint", f"rerank.base_url={DEAD}", "rerank.backoff_s=-1"],
         "conf/rerank: backoff_s: must be a number >= 0 (got -1)"),
        (["rerank=llm", f"rerank.base_url={DEAD}", "rerank.model=m", "rerank.tpm=0"],
         "conf/rerank: tpm: must be a number in (0, 1000000000] or null (no limit) (got 0)"),
        (["embedding=openai", f"embedding.base_url={DEAD}", "embedding.api_key_env=null", "embedding.concurrency=0"],
         "conf/embedding: concurrency: must be an integer >= 1 (got 0)"),
        (["app=http", "app.url=http://127.0.0.1:9/ask", "app.rpm=-1"],
         "conf/app: rpm: must be a number in (0, 1000000] or null (no limit) (got -1)"),
        (["app=http", "app.url=http://127.0.0.1:9/ask", "app.concurrency=0"],
         "conf/app: concurrency: must be an integer >= 1 (got 0)"),
    ],
    ids=["generator-openai", "generator-local", "judge-openai", "judge-local", "judge-mlflow",
         "judge-mlflow-alias", "rerank-endpoint", "rerank-llm", "embedding-openai", "app-http", "app-http-concurrency"],
)  # fmt: skip
def test_a_bad_shared_endpoint_value_is_refused_naming_its_key_in_every_group(overrides, expected):
    """One line per bad key (the rule is run once, not by the group and again by a shared rule)."""
    problems = _validate(*overrides)
    assert problems.count(expected) == 1, problems
    key = expected.split(": ")[1]
    assert sum(f": {key}: " in p for p in problems) == 1, problems


def test_a_key_an_option_does_not_take_is_refused():
    problems = _validate("rerank=endpoint", f"rerank.base_url={DEAD}", "+rerank.temperature=0.5")
    assert any(p.startswith("conf/rerank: temperature: unknown option for EndpointReranker") for p in problems), problems


def test_a_bad_endpoint_config_exits_2_naming_the_key(tmp_path):
    from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

    docs, ev = make_tiny(tmp_path, n_items=2)
    p = run_sweep(tmp_path, "app=http", "app.url=http://127.0.0.1:9/ask", "app.concurrency=0",
                  *sweep_args(tmp_path, docs, ev), check=False)  # fmt: skip
    assert p.returncode == 2, p.stderr[-2000:]
    assert "conf/app: concurrency: must be an integer >= 1 (got 0)" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "mlflow.db").exists()


def test_every_user_declares_the_one_type_and_restates_none_of_its_fields():
    """Each user's ``ENDPOINT`` builds an :class:`EndpointSettings`; no constructor declares a
    setting as a parameter of its own (the address, ``base_url``/``model``/``url``, aside)."""
    for cls in USERS:
        assert isinstance(cls.ENDPOINT.settings({}, base_url=DEAD), EndpointSettings), cls
        own = set(inspect.signature(cls.__init__).parameters)
        assert not own & (set(RANGES) | {"api_key_env"}), (cls.__name__, own & set(RANGES))
        hints = constructor_hints(cls)
        assert set(cls.ENDPOINT.keys) - set(cls.ENDPOINT.without) <= set(hints), cls


@pytest.fixture
def embeddings_server():
    api_embedding._PROBES.clear()
    with FakeHTTP(lambda r: embeddings(r.body["input"], lambda t: [1.0, float(len(t)), 0.5])) as s:
        yield s
    api_embedding._PROBES.clear()


def test_each_built_user_holds_the_settings_its_client_uses(embeddings_server):
    """Built with a limit and a deadline, each user holds one :class:`EndpointSettings` and its
    endpoint client was made from it (LocalLlamaGenerator and the local judges: their server
    starts lazily or at once, so they are checked by declaration above)."""
    common = {"timeout_s": 7.0, "max_retries": 1, "rpm": 600.0}
    built = [
        OpenAICompatibleGenerator(DEAD, "m", **common),
        LLMJudge(DEAD, "m", **common),
        MLflowJudge(DEAD, "m", **common),
        EndpointReranker(DEAD, "m", **common),
        LLMReranker(DEAD, "m", **common),
        OpenAIEmbedder(embeddings_server.url, "m", api_key_env=None, **common),
        HttpApp("http://127.0.0.1:9/ask", **common),
    ]
    for obj in built:
        s = obj.settings
        assert isinstance(s, EndpointSettings) and (s.timeout_s, s.max_retries, s.rpm) == (7.0, 1, 600.0), obj
        client = getattr(obj, "_endpoint", None) or getattr(obj, "endpoint", None) or obj.client._endpoint
        assert (client.timeout_s, client.max_retries, client.settings.rpm) == (7.0, 1, 600.0), obj


@pytest.mark.parametrize("cls", [OpenAICompatibleGenerator, LLMJudge, MLflowJudge, EndpointReranker, LLMReranker, HttpApp])
def test_a_bad_value_in_python_raises_the_same_sentence(cls):
    args = ("http://127.0.0.1:9/ask",) if cls is HttpApp else (DEAD, "m")
    with pytest.raises(ValueError, match=r"timeout_s: must be a number > 0 \(got 0\)"):
        cls(*args, timeout_s=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'timeout'"):
        cls(*args, timeout=5)
