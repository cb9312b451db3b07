"""What the readers write back onto a run they read: a Markdown note, summary metrics, tags,
files (``compare --log``, ``select``'s tags, ``report``, ``spotcheck score``). The MLflow calls of
those CLIs, so that they import no MLflow; each function takes the tracking URI."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from mlflow.entities import Metric
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

BATCH = 500  # metrics per log_batch call (MLflow's limit is 1000)


class AnnotateError(Exception):
    """The store refused a write (permissions, a deleted run …)."""


def log_text(uri: str, run_id: str, text: str, artifact_file: str) -> None:
    """``text`` as the run's artifact ``artifact_file``."""
    MlflowClient(tracking_uri=uri).log_text(run_id, text, artifact_file)


def log_metrics(uri: str, run_id: str, values: Mapping[str, float]) -> int:
    """Every finite value of ``values`` as a metric of the run (step 0, now); NaN and ±inf are
    left out (MLflow would store them as numbers a plot averages). Returns how many were logged."""
    client = MlflowClient(tracking_uri=uri)
    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, 0) for k, v in values.items() if v is not None and math.isfinite(float(v))]
    for i in range(0, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + BATCH])
    return len(metrics)


def set_tags(uri: str, run_id: str, tags: Mapping[str, str]) -> None:
    """Set ``tags`` on the run; a refusing store → :class:`AnnotateError`."""
    client = MlflowClient(tracking_uri=uri)
    try:
        for k, v in tags.items():
            client.set_tag(run_id, k, v)
    except MlflowException as e:
        raise AnnotateError(str(e)) from e


def log_files(uri: str, run_id: str, paths: Sequence[Path], artifact_path: str) -> None:
    """Each file under ``artifact_path/`` of the run."""
    client = MlflowClient(tracking_uri=uri)
    for p in paths:
        client.log_artifact(run_id, str(p), artifact_path=artifact_path)
