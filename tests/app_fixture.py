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
