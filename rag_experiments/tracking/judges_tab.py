"""Our judges in the experiment's **Judges** tab: registered MLflow scorers, where MLflow's
open-source server accepts them (docs/tracing.md, "Judges in the Judges tab").

What mlflow 3.17.2 accepts, checked on a sqlite store and a real ``mlflow server``:

- ``judge=mlflow`` *is* MLflow's built-in ``RetrievalGroundedness`` (per claim) and
  ``RelevanceToQuery`` judges on ``openai:/<model>`` (``stages.mlflow_judge``): built-in scorers
  serialise by class name and settings and register on any store, so a generating run with this
  judge registers both (named ``groundedness-<model>``, ``relevance_to_query-<model>``), once per
  experiment and model.
- The heuristic, verifier and cascade judges and our own LLM judges are our code. MLflow registers
  code only as ``@scorer`` functions, and refuses those outside Databricks unless the *server*
  opts in (``MLFLOW_SERVER_ENABLE_CUSTOM_SCORERS=true``, it executes the stored source with
  ``exec()``); even then it stores only the function *body*, so a scorer that calls helpers of
  its module (ours do) fails when re-created (``NameError``). They are not registered.
"""

from __future__ import annotations

import json
import re
from typing import Any

GROUNDEDNESS, RELEVANCE = "groundedness", "relevance_to_query"


def _slug(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", model)[:100]


def _kind(judge: Any) -> str | None:
    try:
        return json.loads(str(getattr(judge, "identity", ""))).get("kind")
    except (ValueError, AttributeError):
        return None


def registrable(judge: Any) -> list:
    """The MLflow scorers that *are* ``judge`` (empty for our own code judges)."""
    model_uri = getattr(judge, "model_uri", None)
    if model_uri is None or _kind(judge) != "mlflow":  # stages.mlflow_judge.MLflowJudge's identity
        return []
    from mlflow.genai.scorers import RelevanceToQuery, RetrievalGroundedness

    slug = _slug(model_uri.split(":/", 1)[-1])
    return [
        RetrievalGroundedness(name=f"{GROUNDEDNESS}-{slug}", model=model_uri),
        RelevanceToQuery(name=f"{RELEVANCE}-{slug}", model=model_uri),
    ]


def register_judges(experiment_id: str, judge: Any) -> list[str]:
    """Register the scorers of :func:`registrable` in the experiment (MLflow's current tracking
    URI) unless one of that name and model is registered already; returns the names registered now."""
    scorers = registrable(judge)
    if not scorers:
        return []
    from mlflow.genai.scorers import list_scorers

    have = {(s.name, getattr(s, "model", None)) for s in list_scorers(experiment_id=experiment_id)}
    new = [s for s in scorers if (s.name, s.model) not in have]
    for s in new:
        s.register(name=s.name, experiment_id=experiment_id)
    return [s.name for s in new]
