"""Writing runs: experiment, child runs, params, metrics, artifacts, and the resume decision.

The layout is a contract that ``compare``, ``gate``, ``report`` and users' dashboards rely on:
one parent run per multirun (tag ``sweep_id``, ``tracking.parents``), one child per resolved config,
params = the flattened config plus the Hydra group choices, metrics with the registry keys
(docs/metrics.md), the per-query table as ``per_query.json`` (``MlflowClient.log_table``) and
``per_query.parquet``. Locks: ``tracking.locks``; git, versions, runner, UI command:
``tracking.run_info`` (re-exported here under their old names).
"""

from __future__ import annotations

import json
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
from mlflow.entities import Dataset as DatasetEntity
from mlflow.entities import DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from rag_experiments.core.query_table import write_per_query
from rag_experiments.tracking import resume
from rag_experiments.tracking.app_versions import DATASET, version_metric
from rag_experiments.tracking.locks import config_lock, file_lock, store_lock  # noqa: F401
from rag_experiments.tracking.parents import (  # noqa: F401
    SWEEP_FILE,
    close_parent,
    find_parent,
    get_or_create_parent,
    read_sweep_context,
    sweep_status,
    write_sweep_context,
)
from rag_experiments.tracking.run_info import (  # noqa: F401
    _runner_alive,
    eval_runs_url,
    git_info,
    package_versions,
    runner_id,
    ui_command,
)
from rag_experiments.tracking.store_check import create_sqlite_store
from rag_experiments.tracking.uri import artifact_location, is_server  # noqa: F401
from rag_experiments.tracking.uri import tracking_uri as resolve_uri  # noqa: F401  (sweep.py's name)

TRACES_EXPECTED = resume.TRACES_EXPECTED  # tag: traces a run should have, set before they are written


def open_store(uri: str) -> MlflowClient:
    """A client on ``uri``; constructing one creates a fresh store, so it happens under a lock."""
    with store_lock(uri):
        create_sqlite_store(uri)  # a new sqlite store whole or not at all (tracking.store_check)
        return MlflowClient(tracking_uri=uri)


def get_experiment_id(client: MlflowClient, name: str, artifact_root: str | None) -> str:
    with store_lock(client.tracking_uri):
        return _get_experiment_id(client, name, artifact_root)


def _get_experiment_id(client: MlflowClient, name: str, artifact_root: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        location = artifact_location(client.tracking_uri, artifact_root)
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # another worker created it between our lookup and create
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def flatten(d: Any, prefix: str = "") -> dict[str, str]:
    """``{"chunking": {"size": 800}}`` → ``{"chunking.size": "800"}`` (MLflow params are strings)."""
    out: dict[str, str] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = json.dumps(d) if isinstance(d, list) else str(d)
    return out


def config_hash(
    cfg: dict, corpus_digest: str, evalset_digest: str, models: dict[str, str] | None = None
) -> str:
    """Hash of what determines results apart from code: the config without its place keys (at
    any depth, ``identity.is_place_key``), the data digests and the stages' model identities
    (weights' sha256 + settings, ``identity.model_identities``). Code is compared separately
    (:func:`resume_decision`), so a re-run can say which of the two changed."""
    from rag_experiments.core.cache import stable_hash
    from rag_experiments.core.identity import semantic_config

    parts: list = ["config", semantic_config(cfg), corpus_digest, evalset_digest]
    if models:
        parts.append(models)
    return stable_hash(*parts)[:16]


def _latest_finished(client: MlflowClient, experiment_id: str, tag: str, value: str):
    """The latest FINISHED run of the experiment whose tag ``tag`` is ``value``, or None."""
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.{tag} = '{value}' and attributes.status = 'FINISHED'",
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    return found[0] if found else None


def find_finished(client: MlflowClient, experiment_id: str, chash: str):
    return _latest_finished(client, experiment_id, "config_hash", chash)


def latest_finished_of_evalset(client: MlflowClient, experiment_id: str, evalset_digest: str):
    """The latest FINISHED run of the experiment on the eval set ``evalset_digest`` (the sweep's
    pilot, ``run.pilot``), or None."""
    return _latest_finished(client, experiment_id, "evalset_digest", evalset_digest.replace("'", ""))


def incomplete_reason(client: MlflowClient, run) -> str:
    """Why a FINISHED run cannot be reused ("" when it is complete): ``resume.incomplete_reason``
    (failed items to retry, no ``per_query.parquet``, fewer traces than expected), one rule for
    every store."""
    names = {Path(a.path).name for a in client.list_artifacts(run.info.run_id)}
    return resume.incomplete_reason(run.data.tags, run.data.metrics, "per_query.parquet" in names)


def resume_decision(client: MlflowClient, experiment_id: str, chash: str, fingerprint: str):
    """(run to reuse or None, why) for a config about to run: ``resume.decide`` on this store's runs.

    Skip only when a FINISHED run has this ``config_hash`` AND this ``code_fingerprint``; a
    FINISHED run with the same config but other code is named in the reason for re-running.
    ``why`` is "" when no earlier run matches the config at all.
    """
    same = client.search_runs(
        [experiment_id],
        filter_string=(
            f"tags.config_hash = '{chash}' and tags.code_fingerprint = '{fingerprint}' "
            "and attributes.status = 'FINISHED'"
        ),
        max_results=10,
        order_by=["attributes.start_time DESC"],
    )

    def previous() -> tuple[str, str] | None:
        old = find_finished(client, experiment_id, chash)
        return None if old is None else (old.info.run_id, old.data.tags.get("code_fingerprint", "none recorded"))

    candidates = ((r.info.run_id, incomplete_reason(client, r)) for r in same)
    rid, why = resume.decide(chash, fingerprint, candidates, previous)
    return next((r for r in same if r.info.run_id == rid), None), why


# ------------------------------------------------------------------------------ child runs


def heal_stale_runs(client: MlflowClient, experiment_id: str, chash: str) -> list[str]:
    """Mark RUNNING runs of ``chash`` whose process is gone as KILLED (tag ``healed``).

    Called under ``config_lock``, so no live process on this host is running that config; a
    run whose ``runner`` is on another host is left alone.
    """
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.config_hash = '{chash}' and attributes.status = 'RUNNING'",
        max_results=100,
    )
    healed = []
    for r in runs:
        if _runner_alive(r.data.tags.get("runner")):
            continue
        client.set_tag(r.info.run_id, "healed", "its process died while RUNNING; marked KILLED by a re-run")
        client.set_terminated(r.info.run_id, "KILLED")
        healed.append(r.info.run_id)
    return healed


def _batched(seq: list, n: int):
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def start_child(
    client: MlflowClient, experiment_id: str, run_name: str, tags: dict[str, str], params: dict[str, str]
) -> str:
    run = client.create_run(experiment_id, run_name=run_name, tags=tags)
    rid = run.info.run_id
    items = [Param(k[:250], v[:6000]) for k, v in sorted(params.items())]
    try:
        for batch in _batched(items, 100):
            client.log_batch(rid, params=batch)
    except BaseException as e:  # a signal between create and the caller's try: never left RUNNING
        client.set_terminated(rid, "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    return rid


def log_results(
    client: MlflowClient,
    run_id: str,
    aggregates: dict[str, float],
    per_query: pd.DataFrame,
    evalset_df: pd.DataFrame,
    evalset_path: str,
    evalset_digest: str,
    artifacts: dict[str, str],
    extra_tags: dict[str, str],
    model_id: str | None = None,
) -> None:
    """``model_id``: the config's app version (``tracking.app_versions``); its mean metrics are
    logged with it, so the version's page and MLflow's version comparison show them."""
    import math

    now = int(time.time() * 1000)
    from rag_experiments.tracking.run_page import metric_order

    # logged in reading order: MLflow's run page lists metrics in the order they were logged
    on_version = dict(model_id=model_id, dataset_name=DATASET, dataset_digest=evalset_digest[:16])
    metrics = [
        Metric(k, float(aggregates[k]), now, 0, **(on_version if model_id and version_metric(k) else {}))
        for k in metric_order(aggregates)
        if aggregates[k] is not None and not (isinstance(aggregates[k], float) and math.isnan(aggregates[k]))
    ]
    for batch in _batched(metrics, 1000):
        client.log_batch(run_id, metrics=batch)
    # NaN aggregates (e.g. a metric no query could be scored on) are not logged as numbers;
    # they are named in a tag so their absence is visible, never silent.
    missing = sorted(k for k, v in aggregates.items() if isinstance(v, float) and math.isnan(v))
    tags = [RunTag(k, v) for k, v in extra_tags.items()]
    if missing:
        tags.append(RunTag("nan_metrics", ",".join(missing)[:5000]))
    for batch in _batched(tags, 100):
        client.log_batch(run_id, tags=batch)
    with tempfile.TemporaryDirectory() as tmp:
        pq = Path(tmp) / "per_query.parquet"
        write_per_query(per_query, pq)  # the declared schema (core/query_table.py); raises naming a bad column
        client.log_artifact(run_id, str(pq))
        for name, content in artifacts.items():
            p = Path(tmp) / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content, encoding="utf-8")
            client.log_artifact(run_id, str(p), artifact_path=str(Path(name).parent) if "/" in name else None)
    with no_mlflow_noise():
        client.log_table(run_id, data=per_query, artifact_file="per_query.json")
        ds = mlflow.data.from_pandas(
            evalset_df, source=str(Path(evalset_path).resolve()), name="evalset", digest=evalset_digest[:16]
        )
        # client calls only: a fluent ``start_run`` here would mark the run FINISHED on exit, before its
        # traces and final checks exist (the caller sets the final status last, ``sweep.execute``)
        entity = DatasetEntity(**ds.to_dict())  # to_dict infers the schema: where the hint is raised
    eval_input = DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, "eval")])
    try:
        client.log_inputs(run_id, datasets=[eval_input])
    except MlflowException as e:  # two runs at once inserted the same new dataset: the loser retries,
        if not _duplicate_dataset(e):  # and the retry finds the winner's row and links it
            raise
        client.log_inputs(run_id, datasets=[eval_input])


# What MLflow says on every run about the eval set it records, and why it is not news (mlflow 3.x):
MLFLOW_NOISE = (
    # the schema it infers has an int column (n_evidence): ints cannot hold the missing values a
    # served *model* might receive, a paragraph about model serving for a column that has none
    r"Hint: Inferred schema contains integer column",
    # one local path matches the dataset source registered for "" and for "file://" (one class, twice)
    r"The specified dataset source can be interpreted in multiple ways: (\w+), \1\. ",
)


@contextmanager
def no_mlflow_noise():
    """Ignore exactly the warnings in :data:`MLFLOW_NOISE`; every other warning still shows."""
    with warnings.catch_warnings():
        for message in MLFLOW_NOISE:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        yield


def _duplicate_dataset(e: Exception) -> bool:
    """A unique-key violation on MLflow's ``datasets`` table (PostgreSQL or SQLite wording)."""
    text = str(e)
    return "dataset_pk" in text or ("UNIQUE constraint failed" in text and "datasets." in text)
