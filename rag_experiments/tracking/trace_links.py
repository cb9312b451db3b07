"""Links into MLflow's UI for a run and for the trace of one eval item (the gate's PR summary).

MLflow 3.17's UI routes (its ``Routes`` in the JS bundle): a run is ``#/experiments/<e>/runs/<r>``,
a trace opens in the experiment's Traces tab at ``#/experiments/<e>/traces?selectedEvaluationId=<t>``
(the drawer MLflow's own "open trace" buttons link to). On a tracking server (http/https) the link
is absolute; on a local store it is the route alone, to open in ``mlflow ui`` (as
``spotcheck.review.review_url`` does).
"""

from __future__ import annotations

from urllib.parse import quote

from rag_experiments.tracking.uri import is_server


def _base(uri: str) -> str:
    return uri.rstrip("/") + "/" if is_server(uri) else ""


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """The run's page."""
    return f"{_base(uri)}#/experiments/{quote(experiment_id)}/runs/{quote(run_id)}"


def trace_url(uri: str, experiment_id: str, trace_id: str) -> str:
    """The trace, opened in the experiment's Traces tab."""
    return f"{_base(uri)}#/experiments/{quote(experiment_id)}/traces?selectedEvaluationId={quote(trace_id)}"


def trace_ids_by_item(uri: str, experiment_id: str, run_id: str) -> dict[str, str]:
    """``{item_id: trace_id}`` of a run's traces (tag ``item_id``, ``tracking.traces``); {} when the
    run has none (``tracking.traces=false``, or a run logged before traces)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    out: dict[str, str] = {}
    token = None
    while True:
        page = client.search_traces(
            locations=[experiment_id], run_id=run_id, include_spans=False, max_results=500, page_token=token
        )
        for t in page:
            item = (t.info.tags or {}).get("item_id")
            if item and item not in out:
                out[item] = t.info.trace_id
        token = page.token
        if not token:
            return out
