"""``judge=mlflow``: MLflow's built-in GenAI judges as our pipeline's judge (docs/judges.md).

Per claim, MLflow's **groundedness** judge (the judge behind ``mlflow.genai.judges.is_grounded``
and the ``RetrievalGroundedness`` scorer) decides whether the claim is supported by the retrieved
context; answer relevance is MLflow's **relevance_to_query** judge (``is_context_relevant``, the
``RelevanceToQuery`` scorer); each key fact of an answer is MLflow's **correctness** judge (the
``Correctness`` scorer's, with the fact as ``expected_facts``: ``correctness_judged``). All run on
any OpenAI-compatible endpoint through MLflow's native ``openai`` provider (no LiteLLM): the model
URI is ``openai:/<model>`` and requests go to
``<base_url>/chat/completions``. ``base_url: null`` serves a local GGUF file with the embedded
llama.cpp server instead (the packaged SmolLM2 by default; at chance as a judge).

Why MLflow's invocation function (``invoke_judge_model``) with the built-in judges' own prompts,
rather than the public ``is_grounded``: the public functions take no ``base_url``, no
``max_tokens``/``temperature`` and retry a dead endpoint 10 times with back-off (about 3 minutes
per claim). The prompt, the model call, the JSON reading and the returned ``Feedback`` are
MLflow's; only those three knobs are ours.

**Every model call goes through the one endpoint client.** MLflow is pointed not at the model's
endpoint but at a shim on 127.0.0.1 (:class:`_Shim`) whose every request is sent by
``stages.endpoint.Endpoint``: ``judge.rpm``/``tpm``/``max_concurrency``, the deadline, retries,
``Retry-After``, the budget (``budget.max_calls``/``max_usd``), the dry run (a placeholder reply,
no request) and the abort on a signal hold for it as for every other step. A call our client gave
up on is answered 400, so MLflow does not retry it again; it is an ``unparseable`` verdict with
the error, as before.

Reading a feedback: ``yes`` → supported, ``no`` → unsupported; anything else (MLflow's own
prompt asks for ``"yes|no"`` and small models copy it), a reply that is not JSON, or JSON without
``result`` → ``unparseable``, counted and excluded from faithfulness, never read as "no". A
failed call (connection, timeout, HTTP error) is ``unparseable`` with ``error`` set, which the
pipeline does not cache, so a re-run asks again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from rag_experiments.core.identity import file_sha256, source_hash
from rag_experiments.core.parallel import thread_map
from rag_experiments.core.redaction import error_text
from rag_experiments.core.text_gate import gate_text
from rag_experiments.core.types import Verdict
from rag_experiments.judge import split_claims
from rag_experiments.stages.endpoint import Endpoint
from rag_experiments.stages.endpoint_settings import Takes
from rag_experiments.stages.generation import local_server, resolve_model_path

#: MLflow's names of the two built-in judges we call (their assessment names).
GROUNDEDNESS = "groundedness"
RELEVANCE = "relevance_to_query"
_NO_KEY = "unused"  # MLflow's openai provider insists on a key; keyless endpoints ignore it
_PARSE_FAILURE = "Failed to parse response from judge model"
REPLY_CAP = 500  # characters of a rationale, reply or error a verdict keeps

# MLflow reads the key and the HTTP timeout from the process environment at call time, so a
# batch holds this lock while they are set (another MLflowJudge waits; nothing else reads them).
_ENV_LOCK = threading.RLock()


@contextmanager
def _mlflow_env(api_key: str, timeout_s: float) -> Iterator[None]:
    names = ("OPENAI_API_KEY", "MLFLOW_GATEWAY_ROUTE_TIMEOUT_SECONDS", "MLFLOW_MODEL_CATALOG_URI")
    with _ENV_LOCK:
        old = {n: os.environ.get(n) for n in names}
        os.environ["OPENAI_API_KEY"] = api_key
        os.environ["MLFLOW_GATEWAY_ROUTE_TIMEOUT_SECONDS"] = str(max(1, math.ceil(timeout_s)))
        # offline: MLflow would fetch its model catalog (context size, price) from github.com on
        # each judge call's first use; "" = its bundled copy. A user's own setting is kept.
        os.environ.setdefault("MLFLOW_MODEL_CATALOG_URI", "")
        try:
            yield
        finally:
            for n, v in old.items():
                if v is None:
                    os.environ.pop(n, None)
                else:
                    os.environ[n] = v


def _chat_bytes(raw: bytes) -> bytes:
    """A chat reply passed on to MLflow as it came, once it reads as a chat completion (JSON with
    ``choices``; else malformed, retried by the client, then the call's error)."""
    if not (json.loads(raw) or {}).get("choices"):
        raise ValueError("malformed reply: no choices")
    return raw


class _Shim:
    """An OpenAI-compatible ``/chat/completions`` on 127.0.0.1 whose requests our endpoint client
    sends to the judge's model (module docstring). Started on first use, a daemon thread."""

    def __init__(self, endpoint: Endpoint) -> None:
        ep = endpoint

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # MLflow's requests are the judge's calls, counted by the client
                pass

            def do_POST(self):
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                    r = ep.post("/chat/completions", {**body, "model": ep.model}, _chat_bytes)
                    status, out = (200, r.data) if not r.error else (400, json.dumps({"error": {"message": r.error}}).encode())
                except Exception as exc:  # noqa: BLE001 - MLflow gets an error reply, never a dropped socket
                    status, out = 400, json.dumps({"error": {"message": error_text(exc)}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def read_feedback_value(value: Any) -> str:
    """A built-in judge's feedback value as a verdict label.

    ``yes`` → ``supported``, ``no`` → ``unsupported`` (case and surrounding space ignored;
    MLflow's ``CategoricalRating`` is a str). Everything else — ``"yes|no"``, ``"unknown"``,
    ``None``, a number — is ``unparseable``.
    """
    v = str(value).strip().lower() if isinstance(value, str) else None
    return {"yes": "supported", "no": "unsupported"}.get(v or "", "unparseable")


def _prompts_digest() -> str:
    from mlflow.genai.judges.prompts import groundedness, relevance_to_query

    text = groundedness.GROUNDEDNESS_PROMPT + relevance_to_query.RELEVANCE_TO_QUERY_PROMPT
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _correctness_digest() -> str:
    from mlflow.genai.judges.prompts import correctness

    text = correctness.CORRECTNESS_PROMPT + correctness.CORRECTNESS_PROMPT_SUFFIX
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class MLflowJudge:
    """MLflow's built-in groundedness / relevance_to_query judges behind our Judge protocol.

    ``base_url``: an OpenAI-compatible endpoint (``http://host:port/v1``) serving ``model``;
    ``api_key_env``: the NAME of the variable holding its key (null: no key). ``base_url: null``:
    the embedded llama.cpp server on ``model_path`` (null = the packaged SmolLM2), sharing the
    local generator's server when file and ``ctx_size`` match. The endpoint settings
    (``stages.endpoint_settings``; ``num_retries`` is ``max_retries`` under MLflow's name) hold for
    every request, which our client sends. Claims are judged ``concurrency`` at a time.
    """

    # no seed (MLflow sends none); ``num_retries``: the name MLflow gives max_retries
    ENDPOINT = Takes(without=("seed",), aliases={"num_retries": "max_retries"}, model_required=False,
                     timeout_s=120.0, max_retries=2, concurrency=1)  # fmt: skip

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        model_path: str | None = None,
        ctx_size: int = 4096,
        n_threads: int = 1,
        n_parallel: int = 1,
        **endpoint: Any,
    ) -> None:
        import mlflow

        if base_url:
            if not model:
                raise ValueError("judge.model: the model name the endpoint serves is required with base_url")
            self.base_url = str(base_url).rstrip("/")
            self.model = str(model)
            endpoint_id: dict[str, Any] = {"base_url": self.base_url, "model": self.model}
        else:
            path = resolve_model_path(model_path)
            self.base_url = local_server(path, ctx_size=ctx_size, n_threads=n_threads, n_parallel=n_parallel)
            self.model = path.name
            endpoint_id = {"model_sha256": file_sha256(path), "ctx_size": int(ctx_size)}
        s = self.settings = self.ENDPOINT.settings(endpoint, base_url=self.base_url, model=self.model)
        self.model_uri = f"openai:/{self.model}"
        self.inference_params = {"temperature": s.temperature, "max_tokens": s.max_tokens}
        self.num_retries, self.timeout_s, self.concurrency = s.max_retries, s.timeout_s, s.concurrency
        # our client sends MLflow's requests (retries, limits, budget, dry run): MLflow retries nothing
        self._endpoint = Endpoint.of(s, "judge.timeout_s")
        self._shim: _Shim | None = None
        self._last = threading.local()  # the error of this thread's last answer_relevance
        self._shim_lock = threading.Lock()
        ident = {
            "kind": "mlflow",
            "judges": [GROUNDEDNESS, RELEVANCE],
            "mlflow": mlflow.__version__,
            "prompts": _prompts_digest(),
            **endpoint_id,
            **self.inference_params,
            "code": source_hash(Path(__file__))[:16],
        }
        self.identity = json.dumps(ident, sort_keys=True)

    # one call -----------------------------------------------------------------------------------
    def _ask(self, prompt: str, name: str) -> tuple[str, str, str, str | None]:
        """(label, rationale, raw reply, error) of one built-in judge call; never raises."""
        from mlflow.exceptions import MlflowException
        from mlflow.genai.judges.utils import invoke_judge_model

        try:
            fb = invoke_judge_model(
                self.model_uri,
                prompt,
                assessment_name=name,
                num_retries=0,
                inference_params=self.inference_params,
                base_url=f"{self._shim_url()}/chat/completions",
            )
        except MlflowException as exc:
            msg = str(exc)
            if msg.startswith(_PARSE_FAILURE):  # the model answered, not in JSON: a reply problem
                raw = gate_text(msg.split("Response: ", 1)[-1], "reply", REPLY_CAP).text
                return "unparseable", "reply is not JSON (or was cut at max_tokens)", raw, None
            return "unparseable", "", "", error_text(exc)
        except KeyError as exc:  # JSON without "result"
            return "unparseable", f"reply JSON has no {exc}", "", None
        except Exception as exc:  # noqa: BLE001 - a judge never raises per claim
            return "unparseable", "", "", error_text(exc)
        if fb.error is not None:
            why = str(fb.error.error_message or fb.error.error_code)
            return "unparseable", "", "", gate_text(f"feedback error: {why}", "error", REPLY_CAP).text
        label = read_feedback_value(fb.value)
        rationale = str(fb.rationale or "")
        if label == "unparseable":
            rationale = f"feedback value {fb.value!r} is not yes/no; {rationale}"
        # the model's texts pass the one gate before a verdict (cache, table, traces) holds them
        raw = gate_text(json.dumps(fb.value, default=str), "reply", REPLY_CAP).text
        return label, gate_text(rationale, "rationale", REPLY_CAP).text, raw, None

    def _shim_url(self) -> str:
        with self._shim_lock:
            if self._shim is None:
                self._shim = _Shim(self._endpoint)
            return self._shim.url

    def _map(self, fn, items: list) -> list:
        # MLflow's own deadline outlasts our client's attempts: the client decides when a call failed
        with _mlflow_env(_NO_KEY, self.timeout_s * (self.num_retries + 2)):
            return thread_map(fn, items, self.concurrency)

    # Judge protocol -----------------------------------------------------------------------------
    def split(self, answer: str) -> list[str]:
        """The sentence splitter's claims (MLflow has no claim decomposition judge)."""
        return split_claims(answer)

    def verdicts(self, claims: list[str], context: str) -> list[Verdict]:
        """MLflow's groundedness judge on each claim (as the answer; no question) against ``context``."""
        from mlflow.genai.judges.prompts.groundedness import get_prompt

        def one(claim: str) -> Verdict:
            label, why, raw, err = self._ask(
                get_prompt(request="", response=claim, context=context), GROUNDEDNESS
            )
            return Verdict(claim=claim, label=label, rationale=why, raw=raw, error=err)

        return self._map(one, list(claims))

    def answer_relevance(self, query: str, answer: str) -> tuple[float, str]:
        """MLflow's relevance_to_query judge: 1.0 for yes, 0.0 for no, NaN otherwise (or no answer)."""
        from mlflow.genai.judges.prompts.relevance_to_query import get_prompt

        method = "mlflow:relevance_to_query(yes=1,no=0)"
        if not answer or not answer.strip():
            return float("nan"), method
        label, _, _, err = self._map(lambda a: self._ask(get_prompt(query, a), RELEVANCE), [answer])[0]
        self._last.error = err  # a failed call (transport, budget): counted, its NaN never cached
        return {"supported": 1.0, "unsupported": 0.0}.get(label, float("nan")), method

    # key facts (correctness_judged) ------------------------------------------------------------
    @property
    def fact_identity(self) -> str:
        """What decides a fact verdict: the judge and MLflow's correctness prompt (its own cache
        namespace, so the judge's identity stays as it was)."""
        return json.dumps({"judge": self.identity, "fact_prompt": _correctness_digest()}, sort_keys=True)

    def fact_verdicts(self, answer: str, facts: list[str]) -> list[Verdict]:
        """MLflow's ``Correctness`` judge (the ``Correctness`` scorer's prompt and call, as
        ``mlflow.genai.judges.is_correct`` makes them for an ``openai:/`` model) on each reference
        fact, given as the one expected fact: ``yes`` → supported, ``no`` → absent (MLflow's judge
        does not tell a contradicted fact from a missing one; both count 0 in correctness_judged);
        anything else unparseable, a failed call unparseable with its error. One call per fact, so
        correctness_judged stays the share of facts stated, as with ``judge=openai|local``."""
        from mlflow.genai.judges.prompts.correctness import CORRECTNESS_FEEDBACK_NAME, get_prompt

        def one(fact: str) -> Verdict:
            prompt = get_prompt(request="", response=answer, expected_facts=[fact])
            label, why, raw, err = self._ask(prompt, CORRECTNESS_FEEDBACK_NAME)
            label = {"supported": "supported", "unsupported": "absent"}.get(label, "unparseable")
            return Verdict(claim=fact, label=label, rationale=why, raw=raw, error=err)

        return self._map(one, list(facts))

    def last_error(self) -> str | None:
        """The error of this thread's last :meth:`answer_relevance` call (None: it succeeded)."""
        return getattr(self._last, "error", None)
