"""Reading runs back from MLflow for the compare / gate / attribution CLIs.

The client is always passed in; nothing here sets global MLflow state.
"""

from __future__ import annotations

import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from rag_experiments.core.query_table import QueryTableError, read_per_query
from rag_experiments.core.run_record import RunData, group_choice_keys, parse_json  # noqa: F401  (re-exported)
from rag_experiments.evaluation.replicates import collapse_replicates
from rag_experiments.tracking.store_check import store_corrupt_message
from rag_experiments.tracking.uri import DEFAULT_TRACKING_URI, tracking_uri  # noqa: F401  (the CLIs import it here)

PER_QUERY_ARTIFACT = "per_query.parquet"
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
#: A run-id prefix as the tools print it (``select``, ``compare``: the first 8 hex digits); 4 at least.
_ID_PREFIX = re.compile(r"^[0-9a-f]{4,31}$")


class RunInputError(Exception):
    """Bad input from the user (unknown run, ambiguous name, missing table …): CLIs exit 2."""


def _not_found(client: MlflowClient, answer: str) -> RunInputError:
    """``answer`` ("unknown run …") as the error, or "store corrupt" when the store's file is damaged
    (issue 31 item 12: garbage in the runs table or its indexes read back as an unknown run)."""
    return RunInputError(store_corrupt_message(client.tracking_uri, answer) or answer)


def _experiment_ids(client: MlflowClient, experiment: str | None) -> list[str]:
    if experiment:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise _not_found(client, f"unknown experiment {experiment!r}")
        return [exp.experiment_id]
    return [e.experiment_id for e in client.search_experiments()]


def is_id_prefix(ref: str) -> bool:
    """True when ``ref`` can be the start of a run id (4 to 31 lower-case hex digits)."""
    return bool(_ID_PREFIX.match(ref))


def pick_by_prefix(ref: str, candidates: list[tuple[str, str]]) -> str | None:
    """The one run id among ``candidates`` (``(run id, one-line description)``) that starts with
    ``ref``: the rule every reader's ``resolve`` applies after the exact id and the run name.
    None when none does; RunInputError listing them when several do."""
    found = [(rid, desc) for rid, desc in candidates if rid.startswith(ref)]
    if len(found) > 1:
        lines = "\n".join(f"  {rid}  {desc}" for rid, desc in found)
        raise RunInputError(f"run id prefix {ref!r} is ambiguous; pass a longer prefix or one of these run ids:\n{lines}")
    return found[0][0] if found else None


def resolve_run(client: MlflowClient, run_or_name: str, experiment: str | None = None) -> Run:
    """A run by id, by run name (searched in ``experiment`` or in every experiment), or by a unique
    run-id prefix (:func:`pick_by_prefix`: the 8 digits ``select`` and ``compare`` print).

    An ambiguous name or prefix raises RunInputError listing the candidates, so the user can pass an id.
    """
    if _RUN_ID.match(run_or_name):
        try:
            return client.get_run(run_or_name)
        except MlflowException:
            pass
    quoted = run_or_name.replace("\\", "\\\\").replace("'", "\\'")
    exp_ids = _experiment_ids(client, experiment)
    found = (
        client.search_runs(exp_ids, filter_string=f"attributes.run_name = '{quoted}'", max_results=50)
        if exp_ids
        else []
    )
    if not found and exp_ids and is_id_prefix(run_or_name):
        like = client.search_runs(exp_ids, filter_string=f"attributes.run_id LIKE '{run_or_name}%'", max_results=50)
        desc = {r.info.run_id: r for r in like}
        rid = pick_by_prefix(run_or_name, [(i, _describe(r)) for i, r in desc.items()])
        found = [desc[rid]] if rid else []
    if not found:
        where = f" in experiment {experiment!r}" if experiment else ""
        raise _not_found(client, f"unknown run {run_or_name!r}{where}: no run with that id, id prefix or name")
    if len(found) > 1:
        lines = "\n".join(f"  {r.info.run_id}  {_describe(r)}" for r in found)
        raise RunInputError(f"run name {run_or_name!r} is ambiguous; pass one of these run ids:\n{lines}")
    return found[0]


def _describe(r: Run) -> str:
    return (
        f"name={r.info.run_name}  experiment={r.info.experiment_id}  status={r.info.status}  "
        f"sweep_id={r.data.tags.get('sweep_id', '-')}"
    )


@contextmanager
def _no_progress_bar():
    # MLflow draws a tqdm bar per download; noise in a CLI whose output is a report.
    key, old = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ[key] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def load_per_query(client: MlflowClient, run: Run, long: bool = False) -> pd.DataFrame:
    """The run's ``per_query.parquet`` artifact as a DataFrame (``id`` as str), one row per query:
    a replicated run's table is collapsed (``evaluation.replicates.collapse_replicates``) unless
    ``long`` (then one row per query and replicate)."""

    with tempfile.TemporaryDirectory() as tmp, _no_progress_bar():
        try:
            path = client.download_artifacts(run.info.run_id, PER_QUERY_ARTIFACT, tmp)
        except (MlflowException, OSError) as e:
            raise RunInputError(
                f"run {run_label(run)} has no {PER_QUERY_ARTIFACT} artifact (was it logged by the sweep?): {e}"
            ) from None
        if not Path(path).is_file():
            raise RunInputError(f"run {run_label(run)} has no {PER_QUERY_ARTIFACT} artifact")
        try:
            df = read_per_query(path)  # nested cells as lists/dicts; tables of older versions upgraded
        except (QueryTableError, OSError, ValueError) as e:
            raise RunInputError(f"run {run_label(run)}: {PER_QUERY_ARTIFACT} does not read: {e}") from None
    return shape_table(df, run_label(run), long)


def shape_table(df: pd.DataFrame, label: str, long: bool = False) -> pd.DataFrame:
    """A per-query table as :func:`load_per_query` returns it (both readers use it): ``id`` as str,
    replicates collapsed (``evaluation.replicates.collapse_replicates``) unless ``long``, one row
    per id."""
    if "id" not in df.columns:
        raise RunInputError(f"run {label}: {PER_QUERY_ARTIFACT} has no 'id' column")
    df = df.copy()
    df["id"] = df["id"].astype(str)
    if long:
        return df
    df = collapse_replicates(df)
    dup = df["id"][df["id"].duplicated()].unique()
    if len(dup):
        raise RunInputError(
            f"run {label}: {PER_QUERY_ARTIFACT} repeats eval ids ({', '.join(map(str, dup[:5]))}); "
            "pairing needs one row per id"
        )
    return df


def group_choices(run: Run) -> dict[str, str]:
    """The Hydra group choices logged as params (``chunking`` = ``fixed`` …)."""
    params = dict(run.data.params)
    return {k: params[k] for k in sorted(group_choice_keys(params))}


def _all_sweep_runs(client: MlflowClient, sweep_id: str, experiment: str | None) -> list[Run]:
    quoted = sweep_id.replace("'", "\\'")
    exp_ids = _experiment_ids(client, experiment)
    runs: list[Run] = []
    token = None
    while exp_ids:
        page = client.search_runs(
            exp_ids,
            filter_string=f"tags.sweep_id = '{quoted}'",
            max_results=1000,
            order_by=["attributes.start_time ASC"],
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            break
    return [r for r in runs if "mlflow.parentRunId" in r.data.tags]


def sweep_children(client: MlflowClient, sweep_id: str, experiment: str | None = None) -> list[Run]:
    """The sweep's configs: per ``config_hash``, the latest FINISHED child run, oldest first.

    A child that died (KILLED, FAILED, left RUNNING by kill -9) or was superseded by a re-run of
    the same config is left out, so an interrupted sweep finished by a re-run reports cleanly.
    Children without a ``config_hash`` tag are each their own config.
    """
    latest: dict[str, Run] = {}
    for r in _all_sweep_runs(client, sweep_id, experiment):  # oldest first: later ones win
        if r.info.status == "FINISHED":
            latest[r.data.tags.get("config_hash") or r.info.run_id] = r
    return sorted(latest.values(), key=lambda r: r.info.start_time or 0)


def sweep_config_runs(client: MlflowClient, sweep_id: str, experiment: str | None = None) -> list[Run]:
    """Every config of the sweep with its outcome: per ``config_hash`` the latest FINISHED child,
    else (the config never finished) its latest child whatever its status, oldest first. The
    end-of-sweep summary lists these, so a FAILED config is shown, not left out."""
    latest: dict[str, Run] = {}
    for r in _all_sweep_runs(client, sweep_id, experiment):  # oldest first: later ones win
        key = r.data.tags.get("config_hash") or r.info.run_id
        if r.info.status == "FINISHED" or latest.get(key) is None or latest[key].info.status != "FINISHED":
            latest[key] = r
    return sorted(latest.values(), key=lambda r: r.info.start_time or 0)


def run_label(run: Run | RunData) -> str:
    return as_record(run).label


def as_record(run: Run | RunData) -> RunData:
    """The neutral record of an MLflow run (no per-query table); a ``RunData`` as it is."""
    if isinstance(run, RunData):
        return run
    info = run.info
    return RunData(
        run_id=info.run_id,
        name=info.run_name or info.run_id,
        params=dict(run.data.params),
        tags=dict(run.data.tags),
        metrics=dict(run.data.metrics),
        status=info.status,
        experiment_id=info.experiment_id,
        parent_id=run.data.tags.get("mlflow.parentRunId"),
        start_time=info.start_time or 0,
        run_name=info.run_name or "",
    )


def run_data(client: MlflowClient, run: Run, with_table: bool = True) -> RunData:
    rec = as_record(run)
    rec.table = load_per_query(client, run) if with_table else None
    return rec


def check_same_evalset(run_a: Run | RunData, run_b: Run | RunData) -> str | None:
    """Raise RunInputError when both runs carry different ``evalset_digest`` tags.

    Returns a warning string when a digest is missing (pairing then relies on ids alone).
    """
    da, db = as_record(run_a).tags.get("evalset_digest"), as_record(run_b).tags.get("evalset_digest")
    if da and db and da != db:
        raise RunInputError(
            f"runs were evaluated on different eval sets (evalset_digest {da[:12]}… vs {db[:12]}…); "
            "paired comparison needs the same eval set"
        )
    if not (da and db):
        return "warning: evalset_digest tag missing on a run; pairing by eval item id only"
    return None


def sweep_finished_runs(client: MlflowClient, sweep_id: str, experiment: str | None = None) -> list[Run]:
    """Every FINISHED child run of the sweep, replicates of one config_hash included (A/A pairs)."""
    return [r for r in _all_sweep_runs(client, sweep_id, experiment) if r.info.status == "FINISHED"]


def download_text(client: MlflowClient, run: Run, artifact: str) -> str:
    """The text of one of the run's artifacts; RunInputError when it is missing."""
    with tempfile.TemporaryDirectory() as tmp, _no_progress_bar():
        try:
            path = client.download_artifacts(run.info.run_id, artifact, tmp)
            return Path(path).read_text(encoding="utf-8")
        except (MlflowException, OSError) as e:
            raise RunInputError(f"run {run_label(run)} has no {artifact} artifact: {e}") from None
