"""An application's own MLflow trace, seen from the ``app`` step (docs/app.md, "Its own trace").

An app evaluated as a black box (``app=python``) may trace itself with MLflow tracing
(``@mlflow.trace``, an autolog). The trace it wrote while answering a question is linked to our
per-query record (column ``app_trace_id``, tag ``app_trace_id`` on the item's trace): the last
trace this thread made, if the call made a new one. Where that trace lands is the app's own
MLflow setup (``MLFLOW_TRACKING_URI``, its active experiment).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def last_trace_id() -> str | None:
    """The id of the last trace MLflow finished in this thread (None when none)."""
    import mlflow

    return mlflow.get_last_active_trace_id(thread_local=True)


def with_trace_id(call: Callable[[], T]) -> tuple[T, str]:
    """``call()`` and the id of the trace it made ("" when it made none: an app that does not trace,
    or one whose trace is still open)."""
    before = last_trace_id()
    out = call()
    after = last_trace_id()
    return out, (after if after and after != before else "")
