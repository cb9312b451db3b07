"""A config FINISHED earlier, made part of a new sweep: a sweep is the set of its configs.

When a sweep skips a config (same ``config_hash`` and ``code_fingerprint`` already FINISHED, maybe
by another sweep), a child of the new sweep's parent is created for it that carries the earlier
run's metrics, artifacts (``per_query.parquet``, config, …) and result tags, with ``reused_from``
naming the original run. ``sweep_status``, ``compare --sweep``, ``report`` and ``select`` then see
every level of the sweep; the earlier sweep keeps its own run. Nothing is recomputed.
"""

from __future__ import annotations

import tempfile
import time

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from rag_experiments.tracking import resume
from rag_experiments.tracking.resume import REUSED_FROM

# tags that describe this child's place (set by ``start_child``), never copied from the original
_OWN_TAGS = resume.OWN_TAGS


def original_run_id(run) -> str:
    """The run that computed ``run``'s results (itself unless it is a reused copy)."""
    return resume.original_run_id(run.data.tags, run.info.run_id)


def already_in_parent(client: MlflowClient, experiment_id: str, parent_id: str, chash: str) -> bool:
    """True when the parent already holds a FINISHED child of ``chash`` (a resumed sweep)."""
    found = client.search_runs(
        [experiment_id],
        filter_string=(
            f"tags.mlflow.parentRunId = '{parent_id}' and tags.config_hash = '{chash}' "
            "and attributes.status = 'FINISHED'"
        ),
        max_results=1,
    )
    return bool(found)


def copy_results(client: MlflowClient, src, dst_run_id: str) -> None:
    """``src``'s metrics, result tags and artifacts onto ``dst_run_id``, tagged ``reused_from``;
    the caller sets the final status."""
    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, 0) for k, v in src.data.metrics.items()]
    for i in range(0, len(metrics), 500):
        client.log_batch(dst_run_id, metrics=metrics[i : i + 500])
    dst_tags = client.get_run(dst_run_id).data.tags
    for key, value in src.data.tags.items():
        if key not in _OWN_TAGS and key not in dst_tags and not key.startswith("mlflow."):  # MLflow's own
            client.set_tag(dst_run_id, key, value)
    with tempfile.TemporaryDirectory(prefix="rag_reuse_") as tmp:
        if client.list_artifacts(src.info.run_id):
            local = client.download_artifacts(src.info.run_id, "", tmp)
            client.log_artifacts(dst_run_id, local)
    client.set_tag(dst_run_id, REUSED_FROM, original_run_id(src))
