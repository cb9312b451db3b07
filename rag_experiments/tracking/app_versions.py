"""Every config an app version: one MLflow LoggedModel per ``config_hash`` (the UI's "Agent versions").

A config (``config_hash``: the resolved config without place keys, the data digests and the stages'
model identities, ``writer.config_hash``) is one version of the RAG app. Its LoggedModel is created
by the first run of that config in an experiment and found again by every later run, on any machine,
through the store (tag ``config_hash``), never through a local file. It holds:

- **name**: the config's stage-group choices, short, plus the hash prefix
  (``fixed-minilm-bm25-none-1a2b3c4d``): a function of the config alone, never of what one sweep
  varies, so the same config has the same name in every sweep;
- **params**: the resolved config, flattened (the run's params: ``chunking.size``, ``chunking`` =
  ``fixed``, ...) without place keys (paths, caches), within MLflow's key/value limits;
- **tags**: the identities: ``config_hash``, data digests, the stages' model identities
  (``identity.<stage>``: weight bytes + settings), ``judge_identity``, and the
  ``code_fingerprint`` / ``git_commit`` of the latest run linked (code is not part of the config
  identity; each run keeps its own in its tags).

Each run of the config is linked to it: a ``LoggedModelInput`` on the run, its mean metrics logged
with ``model_id`` (MLflow's version comparison and the version's page read these), and every trace
carries the model id (trace metadata ``mlflow.modelId``, both trace writers).

**Races.** On one host the sweep already holds ``config_lock`` for the config, and creation takes a
file lock of its own. Across hosts the store arbitrates, as for sweep parents
(``parents.settle_parent``): :func:`settle` runs after the pipeline, long after any racing creation
committed, and every job picks the same winner from the same set (the earliest-created live model,
ties broken by the smaller id); a job whose own freshly created model lost deletes it before
anything was linked to it. See docs/tracing.md ("Every config an app version").
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from mlflow.entities import LoggedModelInput
from mlflow.tracking import MlflowClient

from rag_experiments.core import slots as core_slots
from rag_experiments.core.cache import stable_hash
from rag_experiments.core.identity import is_place_key
from rag_experiments.evaluation import registry
from rag_experiments.tracking.locks import file_lock

MODEL_TYPE = "rag-config"  # LoggedModel.model_type of every app version
KIND_TAG, KIND = "rag_experiments.kind", "app_version"
DATASET = "evalset"  # the run's eval-set dataset input (``writer.log_results``): metrics name it
_BAD_NAME = re.compile(r"[/:.%\"'\s]+")  # characters MLflow refuses in a LoggedModel name (and blanks)
MAX_KEY, MAX_PARAM, MAX_TAG = 250, 6000, 8000  # MLflow's key / param value / tag value limits


def version_name(params: Mapping[str, str], chash: str) -> str:
    """``<chunking>-<embedding>-<retriever>[-<query>-<rerank>]-<generator>[-<prompt>-<judge>]-<hash8>``
    from the stage-group choices in ``params``: every slot's (``core.slots``), an optional slot
    only when chosen (not ``none``), prompt and judge only when the config generates."""
    generates = params.get("generator", "none") != "none"
    slots = core_slots.SLOTS  # read at each call: a slot declared later is named too
    # the slots declared after the generator (prompt, judge) are only named when the config generates
    after_gen = {s.group for s in slots[[s.name for s in slots].index("generator") + 1 :]}
    optional = {s.group for s in slots if s.optional and s.group != "generator"}
    parts = [
        _BAD_NAME.sub("_", str(params[g]))
        for g in (s.group for s in slots)  # every slot, in declaration order
        if g in params and (generates or g not in after_gen)
        and not (g in optional and str(params[g]) == "none" and g not in after_gen)
    ]
    return "-".join([*parts, chash[:8]])


def version_params(params: Mapping[str, str]) -> dict[str, str]:
    """The run's params (flattened resolved config + group choices) without place keys
    (``identity.is_place_key``: paths, caches, progress; they differ between machines running the
    same config), cut to MLflow's limits."""
    return {k[:MAX_KEY]: str(v)[:MAX_PARAM] for k, v in params.items() if not is_place_key(k)}


def version_tags(
    chash: str,
    run_tags: Mapping[str, str],
    identities: Mapping[str, str],
) -> dict[str, str]:
    """The identities of a config: its hash, data digests, model identities, judge identity, and
    the code of the run that creates or last links it (``code_fingerprint``, ``git_commit``)."""
    keep = ("corpus_digest", "evalset_digest", "judge_identity", "code_fingerprint", "git_commit")
    tags = {"config_hash": chash, KIND_TAG: KIND}
    tags |= {k: str(run_tags[k]) for k in keep if run_tags.get(k)}
    tags |= {f"identity.{name}"[:MAX_KEY]: str(v)[:MAX_TAG] for name, v in identities.items()}
    return tags


def _live(client: MlflowClient, experiment_id: str, chash: str) -> list:
    """The live (not deleted) app versions of ``chash``, winner first: earliest created, then
    the smaller model id (the same order for every job that sees the same models)."""
    found = client.search_logged_models(
        [experiment_id], filter_string=f"tags.config_hash = '{chash}'", max_results=100
    )
    mine = [m for m in found if m.tags.get(KIND_TAG) == KIND]
    return sorted(mine, key=lambda m: (m.creation_timestamp, m.model_id))


def _lock(client: MlflowClient, experiment_id: str, chash: str):
    key = stable_hash("app-version", client.tracking_uri, experiment_id, chash)[:24]
    return file_lock(Path(tempfile.gettempdir()) / "rag_experiments_locks" / f"{key}.lock")


def find_or_create(
    client: MlflowClient,
    experiment_id: str,
    chash: str,
    name: str,
    params: Mapping[str, str],
    tags: Mapping[str, str],
    source_run_id: str | None = None,
    host_lock: bool = True,
) -> tuple[str, bool]:
    """(model id, created now) of the config's app version: the existing one (the winner, when a
    race left several), else a new READY LoggedModel. ``host_lock=False`` only in tests that play
    jobs on different hosts (no shared lock directory); :func:`settle` resolves such races."""
    with _lock(client, experiment_id, chash) if host_lock else contextlib.nullcontext():
        live = _live(client, experiment_id, chash)
        if live:
            return live[0].model_id, False
        model = client.create_logged_model(
            experiment_id,
            name=name,
            source_run_id=source_run_id,
            tags=dict(tags),
            params=dict(params),
            model_type=MODEL_TYPE,
        )
        client.finalize_logged_model(model.model_id, "READY")
        return model.model_id, True


def settle(client: MlflowClient, experiment_id: str, chash: str, model_id: str, created: bool) -> str:
    """The config's one app version after a possible cross-host race: the winner of
    :func:`_live`. A model this job ``created`` that lost is tagged ``superseded_by`` and deleted
    (nothing was linked to it yet); a model found, not created, is never deleted here."""
    live = _live(client, experiment_id, chash)
    if not live:  # deleted by a user meanwhile: the run still names the one it was created for
        return model_id
    winner = live[0].model_id
    if created and winner != model_id:
        client.set_logged_model_tags(model_id, {"superseded_by": winner})
        client.delete_logged_model(model_id)
    return winner


def link_run(client: MlflowClient, run_id: str, model_id: str, run_tags: Mapping[str, str]) -> None:
    """The run as an input of the version (MLflow's run <-> model link, what
    ``mlflow.genai.evaluate(model_id=...)`` logs) and the version's code tags set to this run's."""
    client.log_inputs(run_id, models=[LoggedModelInput(model_id)])
    code = {k: str(run_tags[k]) for k in ("code_fingerprint", "git_commit") if run_tags.get(k)}
    if code:
        client.set_logged_model_tags(model_id, code)


def version_metric(key: str) -> bool:
    """Whether a run metric is also logged on its app version: the means and counts of the
    registry (what a version comparison reads); CI bounds, ``n_scored/``, ``by_tag/`` and keys the
    registry does not know stay on the run only."""
    got = registry.parse(key)
    return got is not None and got[1].get("form", "mean") == "mean"


class Version(NamedTuple):
    """A run's app version between :func:`start` and :func:`link`."""

    model_id: str
    created: bool
    run_tags: dict[str, str]


def start(
    client: MlflowClient, experiment_id: str, run_id: str, chash: str, identities: Mapping[str, str]
) -> Version:
    """Find or create the app version of the run's config (called when the run starts): params
    and tags from the run itself, so the version holds exactly what the run logged."""
    run = client.get_run(run_id)
    params, run_tags = run.data.params, run.data.tags
    model_id, created = find_or_create(
        client,
        experiment_id,
        chash,
        version_name(params, chash),
        version_params(params),
        version_tags(chash, run_tags, identities),
        source_run_id=run_id,
    )
    return Version(model_id, created, dict(run_tags))


def link(client: MlflowClient, experiment_id: str, run_id: str, chash: str, version: Version) -> str:
    """Settle the version (:func:`settle`), link the run to it (:func:`link_run`); the model id
    the run's metrics and traces then carry."""
    model_id = settle(client, experiment_id, chash, version.model_id, version.created)
    link_run(client, run_id, model_id, version.run_tags)
    return model_id
