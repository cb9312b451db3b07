"""The links of a prompt version that MLflow's UI reads: to experiments, runs and app versions.

Public API only (``tracking.prompt_registry`` calls these under its per-prompt host lock). Two of
the keys are tags MLflow 3.17.2's UI reads but its Python link calls never write
(``_mlflow_experiment_ids``, ``mlflow.prompt.run_ids``); the third link is MLflow's own
``MlflowClient.link_prompt_version_to_model`` (the LoggedModel's ``mlflow.linkedPrompts`` tag).
The link of a prompt version to each *trace* is written with the traces (``tracking.traces``,
``tracking.mlflow_adapter``).

Every link is a read-modify-write of one tag, and MLflow's SQL store writes a tag as
select-then-insert (prompt tags) or as an upsert (LoggedModel tags): two writers at once can
collide on the insert or overwrite each other. So each write is re-read until it holds, and a
lost insert race is retried.
"""

from __future__ import annotations

import json
import random
import time

from mlflow.exceptions import MlflowException

#: What MLflow 3.17.2's UI reads for the Prompts tab, written through the public tag API:
#: a prompt's experiments (``_mlflow_experiment_ids``, ",1,2,": the experiment's Prompts tab lists
#: it; MLflow's own linking runs in a background thread) and a version's runs
#: (``mlflow.prompt.run_ids``, comma-separated: "MLflow runs:" on the version's page; the Python
#: link writes only the run's ``mlflow.linkedPrompts`` tag). A tag value holds ≤ 5000 characters:
#: the oldest run ids give way.
PROMPT_EXPERIMENTS_TAG = "_mlflow_experiment_ids"
PROMPT_RUN_IDS_TAG = "mlflow.prompt.run_ids"
LINKED_PROMPTS_TAG = "mlflow.linkedPrompts"  # on runs, traces and LoggedModels: [{name, version}]
MAX_TAG_CHARS = 5000


def lost_insert_race(e: Exception) -> bool:
    """MLflow's SQL store writes a tag as select-then-insert: two writers adding the same new tag
    at once leave the later one a unique-key violation (SQLite or PostgreSQL wording)."""
    text = str(e)
    return "UNIQUE constraint failed" in text or "duplicate key value" in text


def link_prompt_to_experiment(client, name: str, experiment_id: str, tries: int = 3) -> None:
    """Add ``experiment_id`` to the prompt's experiments (no write when it is there already); a
    write that lost an insert race to another process is re-read and retried."""
    for attempt in range(tries):
        prompt = client.get_prompt(name)
        ids = [i for i in ((prompt.tags or {}).get(PROMPT_EXPERIMENTS_TAG, "") if prompt else "").split(",") if i]
        if str(experiment_id) in ids:
            return
        try:
            client.set_prompt_tag(name, PROMPT_EXPERIMENTS_TAG, "," + ",".join([*ids, str(experiment_id)]) + ",")
        except MlflowException as e:
            if not lost_insert_race(e) or attempt == tries - 1:
                raise


def link_prompt_version_to_run_ids(client, name: str, version: int, run_id: str, tries: int = 3) -> None:
    """Add ``run_id`` to the version's run list; re-read after writing, so a concurrent writer
    (another job of the sweep, another host) that overwrote it, or won the insert of a new tag,
    is retried, not lost."""
    for attempt in range(tries):
        pv = client.get_prompt_version(name, str(version))
        ids = [i for i in (pv.tags or {}).get(PROMPT_RUN_IDS_TAG, "").split(",") if i]
        if run_id in ids:
            return
        ids.append(run_id)
        while len(",".join(ids)) > MAX_TAG_CHARS:
            ids.pop(0)
        try:
            client.set_prompt_version_tag(name, str(version), PROMPT_RUN_IDS_TAG, ",".join(ids))
        except MlflowException as e:
            if not lost_insert_race(e) or attempt == tries - 1:
                raise


def model_prompts(client, model_id: str) -> list[tuple[str, int]]:
    """(name, version) of every prompt version linked to the LoggedModel (its ``mlflow.linkedPrompts``)."""
    tag = client.get_logged_model(model_id).tags.get(LINKED_PROMPTS_TAG) or "[]"
    return [(p["name"], int(p["version"])) for p in json.loads(tag)]


def link_prompt_version_to_model(client, name: str, version: int, model_id: str, tries: int = 8) -> bool:
    """Link the version to the app version (``MlflowClient.link_prompt_version_to_model``) unless it
    is linked already; True when this call wrote. The tag is re-read after the write: a concurrent
    writer on another host (read-modify-write of one JSON list, an upsert) may have overwritten it,
    so the write is repeated, after a random pause that desynchronises the writers, until the link
    holds; a lost insert race is retried likewise."""
    for attempt in range(tries):
        if (name, int(version)) in model_prompts(client, model_id):
            return attempt > 0
        if attempt:
            time.sleep(random.uniform(0, 0.2 * attempt))
        try:
            client.link_prompt_version_to_model(name, str(version), model_id)
        except MlflowException as e:
            if not lost_insert_race(e) or attempt == tries - 1:
                raise
    if (name, int(version)) in model_prompts(client, model_id):
        return True
    raise RuntimeError(f"prompts:/{name}/{version} could not be linked to LoggedModel {model_id} in {tries} tries")
