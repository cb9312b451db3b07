"""Applications for tests/test_app.py: the worked example without its model (``generate=False``),
with an extra context that is in no document (``junk``), and one that always raises."""

from __future__ import annotations

from examples.bm25_smollm2_app import answer as example


def answer(question: str, top_k: int = 3, generate: bool = False, junk: bool = False) -> dict:
    out = example(question, top_k=top_k, generate=generate)
    if junk:
        out["contexts"].append({"text": "A passage our corpus never had."})
    return out


def broken(question: str) -> dict:
    raise RuntimeError("the app is down")


def traced(question: str, **kw) -> dict:
    """The app traced with MLflow tracing, as a team's application may be (docs/app.md)."""
    import mlflow

    @mlflow.trace(name="my_rag_app")
    def run(q: str) -> dict:
        return answer(q, **kw)

    return run(question)


def flaky(question: str) -> dict:
    """Fails on the questions with a question mark; answers the others with the worked example."""
    if "?" in question:
        raise RuntimeError("the app is down for this one")
    return answer(question)


# -- faults (tests/test_text_gate.py, tests/faults/test_fault_matrix.py): what a user's app may do
def exits(question: str, code: int = 0) -> dict:
    raise SystemExit(code)


def interrupts(question: str) -> dict:
    raise KeyboardInterrupt


def generator_exit(question: str) -> dict:
    raise GeneratorExit


def bare_string_contexts(question: str) -> dict:
    return {"answer": "Webhooks are retried.", "contexts": "Failed deliveries are retried for 24 hours."}


def wrong_types(question: str) -> dict:
    return {"answer": 42, "contexts": [None]}


def quick(question: str, context: str = "Webhooks are retried.") -> dict:
    """A cheap well-formed reply (the example app loads a retriever: seconds per call)."""
    return {"answer": "Webhooks are retried for 24 hours.", "contexts": [context]}


def huge(question: str, size: int = 1_000_000, context: str = "Webhooks are retried.") -> dict:
    return {**quick(question, context), "answer": "x" * size}


def leaks(question: str, context: str = "Webhooks are retried.") -> dict:
    """An answer that echoes a key: the app's own (``RAG_APP_KEY``) and an ``sk-…`` token."""
    import os

    key = os.environ.get("RAG_APP_KEY", "")
    return {
        **quick(question, context),
        "answer": f"Retried for 24 hours. key={key} sk-live0123456789abcdefXYZ",
    }


def some_fail(question: str, context: str = "Webhooks are retried.", every: int = 2) -> dict:
    """``sys.exit(3)`` on the questions whose length is divisible by ``every``: some, not all
    (none once ``RAG_APP_HEALED`` is set: the same command then redoes the failed ones)."""
    import os

    if len(question) % every == 0 and not os.environ.get("RAG_APP_HEALED"):
        raise SystemExit(3)
    return quick(question, context)


def hangs(question: str, seconds: float = 30.0) -> dict:
    import time

    time.sleep(seconds)
    return quick(question)


def forks(question: str) -> dict:
    """Forks; the child returns into our code (where it is ended), the parent waits for it."""
    import os

    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
    return quick(question)
