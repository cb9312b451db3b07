"""Prompt templates in MLflow's Prompt Registry: registered by content, linked to runs, run by version.

Every generating run registers the bundled templates (``conf/prompt/*.yaml``) and its own prompt
as ``rag-experiments.<name>`` (:func:`register_for_run`), content-addressed: a version is made
only when no version of that name resolves to the same template text, so an unchanged template
never makes a new one. ``prompt=registry prompt.name=… prompt.version=…`` (or ``prompt.alias=…``)
builds a :class:`RegisteredPrompt` from the store when the config is assembled, before any run
exists; an unknown name, version or alias is a :class:`PromptRegistryError` (exit 2). Its identity
in ``config_hash`` is its template text (``Stages.identities``), never the version number, so v1
and v3 holding the same text are one config; the generation cache is keyed by the rendered prompt.

Our placeholders ``{context}``, ``{question}``, ``{decline_text}`` are MLflow's ``{{context}}``,
``{{question}}``, ``{{decline_text}}`` (:func:`to_mlflow` / :func:`from_mlflow`); a template is a
chat template (a system and a user message), and the decline text a version tag (``decline_text``,
also written to the prompt, so a version made in MLflow's UI inherits it). Public API only; the
links MLflow's UI reads (a prompt's experiments, a version's runs and app versions) are written by
``tracking.prompt_links``, each under this module's per-prompt host lock.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import mlflow
import yaml
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from rag_experiments.core.build import build
from rag_experiments.core.cache import stable_hash
from rag_experiments.core.conf_groups import conf_dir
from rag_experiments.core.identity import REFERENCE_TARGETS
from rag_experiments.core.slots import steps
from rag_experiments.stages.prompts import CONTEXT_FORMATS, PromptRegistryError, PromptTemplate
from rag_experiments.tracking.locks import host_lock, store_lock
from rag_experiments.tracking.mlflow_adapter_session import (
    quiet_lost_prompt_link_races,
    wait_for_prompt_link_threads,
)
from rag_experiments.tracking.prompt_links import (
    LINKED_PROMPTS_TAG,
    link_prompt_to_experiment,
    link_prompt_version_to_model,
    link_prompt_version_to_run_ids,
)
from rag_experiments.tracking.uri import tracking_uri as resolve_uri

PREFIX = "rag-experiments."  # registry names of our templates: rag-experiments.<prompt name>
DECLINE_TAG = "decline_text"
CONTEXT_FORMAT_TAG = "context_format"  # a version tag, only for a non-default format ("tagged")
CONTENT_TAG = "rag_experiments.content_sha256"  # sha256 of PromptTemplate.text, for readers
DEFAULT_DECLINE = "I don't know"
VARIABLES = ("context", "question", "decline_text")
_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_.]*)\s*\}\}")  # MLflow's {{ var }} (spaces allowed)
_registered: dict[tuple, tuple[str, int]] = {}  # (uri, name, text, experiment) → (name, version)
_model_links: set[tuple[str, str, str, int]] = set()  # (uri, model id, name, version) linked


# ------------------------------------------------------------------------------ template syntax


def to_mlflow(prompt: PromptTemplate) -> list[dict[str, str]]:
    """Our template as MLflow's chat template: ``{context}`` → ``{{context}}`` (each placeholder).

    A template that already holds ``{{`` or ``}}`` could not be read back unambiguously: refused
    (``config_schema`` reports it before any run)."""
    messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
    messages.append({"role": "user", "content": prompt.template})
    for m in messages:
        if "{{" in m["content"] or "}}" in m["content"]:
            raise ValueError(
                f"prompt {prompt.name!r}: {{{{ and }}}} are MLflow's variable syntax; not allowed"
            )
        for var in VARIABLES:
            m["content"] = m["content"].replace("{" + var + "}", "{{" + var + "}}")
    return messages


def from_mlflow(template: str | list[dict], where: str) -> tuple[str, str]:
    """(system, user template) in our syntax from an MLflow text or chat template.

    A text template is the user message; a chat template is at most one system message followed by
    one user message. ``{{ var }}`` → ``{var}`` for our three variables; any other variable, or a
    template without ``{{context}}`` and ``{{question}}``, is a PromptRegistryError naming ``where``."""
    messages = [{"role": "user", "content": template}] if isinstance(template, str) else list(template)
    roles = [m.get("role") for m in messages]
    if roles not in (["user"], ["system", "user"]):
        raise PromptRegistryError(
            [f"conf/prompt: {where}: a chat template here is [system,] user; got roles {roles}"]
        )
    unknown = sorted({v for m in messages for v in _VAR.findall(m["content"])} - set(VARIABLES))
    if unknown:
        raise PromptRegistryError(
            [
                f"conf/prompt: {where}: uses {', '.join('{{' + v + '}}' for v in unknown)}; rag-experiments "
                "fills only {{context}}, {{question}} and {{decline_text}}"
            ]
        )
    ours = [_VAR.sub(lambda m: "{" + m.group(1) + "}", m["content"]) for m in messages]
    system, user = (ours[0], ours[1]) if len(ours) == 2 else ("", ours[0])
    missing = [v for v in ("context", "question") if "{" + v + "}" not in user]
    if missing:
        raise PromptRegistryError(
            [
                f"conf/prompt: {where}: the user message must contain {' and '.join('{{' + v + '}}' for v in missing)}"
            ]
        )
    return system, user


# ------------------------------------------------------------------------------ reading the registry


def _versions(client: MlflowClient, name: str) -> list:
    """Every version of prompt ``name``, oldest first."""
    out, token = [], None
    while True:
        page = client.search_prompt_versions(name, max_results=100, page_token=token)
        out += list(page)
        token = getattr(page, "token", None)
        if not token:
            return sorted(out, key=lambda v: int(v.version))


def _decline(client: MlflowClient, pv, override: str | None) -> str:
    """The decline text: the config's override, else the version's tag, else the prompt's tag
    (register_prompt writes it there too: a version made in the UI has no tags), else the default."""
    if override is not None:
        return override
    if DECLINE_TAG in (pv.tags or {}):
        return pv.tags[DECLINE_TAG]
    prompt = client.get_prompt(pv.name)
    return (prompt.tags or {}).get(DECLINE_TAG, DEFAULT_DECLINE) if prompt else DEFAULT_DECLINE


def _template_of(client: MlflowClient, pv, decline_text: str | None = None) -> PromptTemplate:
    where = f"prompts:/{pv.name}/{pv.version}"
    system, user = from_mlflow(pv.template, where)
    context_format = (pv.tags or {}).get(CONTEXT_FORMAT_TAG, "plain")
    if context_format not in CONTEXT_FORMATS:
        raise PromptRegistryError(
            [f"conf/prompt: {where}: tag {CONTEXT_FORMAT_TAG}={context_format!r} is not one of {', '.join(CONTEXT_FORMATS)}"]
        )
    return PromptTemplate(pv.name, system, user, _decline(client, pv, decline_text), context_format)


def fetch(client: MlflowClient, name: str, version: int | None, alias: str | None):
    """The prompt version ``name`` at ``version`` or ``alias`` (``latest``: the newest), or a
    PromptRegistryError naming what exists. Store failures (unreachable) propagate."""
    store = client.tracking_uri
    if client.get_prompt(name) is None:
        known = sorted(p.name for p in client.search_prompts(max_results=50))
        raise PromptRegistryError(
            [
                f"conf/prompt: name: no prompt {name!r} in the Prompt Registry of {store} "
                f"(registered: {', '.join(known) or 'none'})"
            ]
        )
    versions = _versions(client, name)
    if version is not None:
        for pv in versions:
            if int(pv.version) == int(version):
                return pv
        nums = ", ".join(str(v.version) for v in versions) or "none"
        raise PromptRegistryError(
            [f"conf/prompt: version: prompts:/{name}/{version} does not exist in {store} (versions: {nums})"]
        )
    if alias == "latest" and versions:
        return versions[-1]
    try:
        return client.get_prompt_version_by_alias(name, alias)
    except MlflowException as e:
        if e.error_code not in ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"):
            raise
    full = [client.get_prompt_version(name, str(v.version)) for v in versions]  # search omits aliases
    aliases = [f"{a} → {v.version}" for v in full for a in (getattr(v, "aliases", None) or [])]
    raise PromptRegistryError(
        [
            f"conf/prompt: alias: prompts:/{name}@{alias} does not exist in {store} "
            f"(aliases: {', '.join(aliases) or 'none'}; alias=latest is the newest version)"
        ]
    )


class RegisteredPrompt(PromptTemplate):
    """``prompt=registry``: a template read from the tracking store's Prompt Registry when the config
    is built (before any run). ``version`` or ``alias`` (``latest``: the newest version) picks it;
    ``decline_text`` overrides the version's. ``identity`` is the template text (``config_hash``)."""

    def __init__(
        self,
        name: str,
        version: int | None = None,
        alias: str | None = None,
        decline_text: str | None = None,
        tracking_uri: str | None = None,
    ) -> None:
        uri = resolve_uri(tracking_uri)
        with store_lock(uri):  # a fresh sqlite store is created under the lock (tracking.writer)
            client = MlflowClient(tracking_uri=uri)
        pv = fetch(client, name, version, alias)
        t = _template_of(client, pv, decline_text)
        super().__init__(name, t.system, t.template, t.decline_text, t.context_format)
        self.version, self.alias = int(pv.version), alias

    @property
    def identity(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"RegisteredPrompt(prompts:/{self.name}/{self.version})"


_checked: dict[str, list[str]] = {}


def is_registry_prompt(node: Mapping[str, Any] | None) -> bool:
    """True when a ``prompt`` node names a registered prompt (``prompt=registry``)."""
    return node is not None and node.get("_target_") in REFERENCE_TARGETS


def registered_prompt_problems(generator: Mapping[str, Any] | None, prompt: Mapping[str, Any] | None) -> list[str]:
    """The problems of a job's ``prompt=registry`` (unknown name, version, alias; a template we
    cannot run), read from the store; [] for other prompts and retrieval-only runs. ``generator``
    and ``prompt``: the job's resolved config nodes as plain data (``run.assemble.container``).
    The multirun callback asks this for every job before the first run (memoised per reference)."""
    if not ((generator or {}).get("_target_") and prompt is not None and prompt.get("_target_") in REFERENCE_TARGETS):
        return []
    key = json.dumps([resolve_uri(prompt.get("tracking_uri")), dict(prompt)], sort_keys=True, default=str)
    if key not in _checked:
        try:
            build(prompt)  # a RegisteredPrompt: the store is read now
            _checked[key] = []
        except PromptRegistryError as e:
            _checked[key] = list(e.problems)
    return _checked[key]


# ------------------------------------------------------------------------------ registering


def bundled_templates() -> list[PromptTemplate]:
    """The templates shipped in ``conf/prompt/*.yaml`` (the ``registry`` option is a reference)."""
    out = []
    for path in sorted((conf_dir() / "prompt").glob("*.yaml")):
        node = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if str(node.get("_target_", "")).endswith(".PromptTemplate"):
            out.append(PromptTemplate(**{k: v for k, v in node.items() if k != "_target_"}))
    return out


@contextmanager
def _in_experiment(client: MlflowClient, experiment_id: str | None) -> Iterator[None]:
    """MLflow links a prompt it registers to the active experiment (else Default): make it ours."""
    mlflow.set_tracking_uri(client.tracking_uri)  # MLflow links through the global store
    old = os.environ.get("MLFLOW_EXPERIMENT_ID")
    if experiment_id is not None:
        os.environ["MLFLOW_EXPERIMENT_ID"] = str(experiment_id)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
        else:
            os.environ["MLFLOW_EXPERIMENT_ID"] = old


def register(
    client: MlflowClient, prompt: PromptTemplate, experiment_id: str | None = None
) -> tuple[str, int]:
    """(registry name, version) holding ``prompt``'s text, registering a version only if none does.

    Content-addressed: an existing version matches when it resolves to the same text (so a version
    typed in the UI counts too). Race-safe: one lock per (store, name) on this host; across hosts
    two writers may both register, and both then use the lowest matching version."""
    name = PREFIX + prompt.name
    memo = (client.tracking_uri, name, prompt.text, experiment_id)
    if memo in _registered:
        return _registered[memo]
    quiet_lost_prompt_link_races()  # across hosts the lock cannot order MLflow's thread
    with _prompt_lock(client, name):
        version = _matching(client, name, prompt.text)
        if version is None:
            with _in_experiment(client, experiment_id):
                pv = client.register_prompt(
                    name,
                    to_mlflow(prompt),
                    commit_message=f"rag-experiments: conf/prompt/{prompt.name}.yaml",
                    tags={DECLINE_TAG: prompt.decline_text, **_format_tag(prompt)},  # on the prompt too
                )
                # MLflow links the new version to the experiment in a thread of its own, outside
                # our lock: let it finish under the lock, so its write of the prompt's tag cannot
                # race ours or another job's (a UNIQUE-constraint warning with an SQL dump)
                wait_for_prompt_link_threads()
            client.set_prompt_version_tag(name, pv.version, CONTENT_TAG, stable_hash(prompt.text))
            version = _matching(client, name, prompt.text)
            print(f"[prompt] registered prompts:/{name}/{version} (a template text new to this store)")
        if experiment_id is not None:
            link_prompt_to_experiment(client, name, experiment_id)
    _registered[memo] = (name, version)
    return name, version


def _format_tag(prompt: PromptTemplate) -> dict[str, str]:
    """The context format as a version tag, only when it is not the default (plain templates are
    registered exactly as before the option existed)."""
    return {} if prompt.context_format == "plain" else {CONTEXT_FORMAT_TAG: prompt.context_format}


def _prompt_lock(client: MlflowClient, name: str):
    """One host lock per (store, prompt name) for every write to the prompt: MLflow writes a tag as
    select-then-insert, so two jobs of a sweep adding the same new tag at once would collide."""
    return host_lock("prompt", f"prompt {name}", client.tracking_uri, name)


def _matching(client: MlflowClient, name: str, text: str) -> int | None:
    """The lowest version of ``name`` whose template resolves to ``text`` (None: none does)."""
    if client.get_prompt(name) is None:
        return None
    for pv in _versions(client, name):
        try:
            if _template_of(client, pv).text == text:
                return int(pv.version)
        except PromptRegistryError:  # a version typed in the UI that we cannot run: not ours
            continue
    return None


def register_for_run(client: MlflowClient, experiment_id: str, prompt: PromptTemplate) -> tuple[str, int]:
    """At a generating run's start: the bundled templates and the run's prompt registered (each
    at most once per process); (name, version) of the run's prompt, to link once the run exists."""
    for t in bundled_templates():
        register(client, t, experiment_id)
    if isinstance(prompt, RegisteredPrompt):
        if prompt.alias:
            print(f"[prompt] prompts:/{prompt.name}@{prompt.alias} is version {prompt.version}")
        with _prompt_lock(client, prompt.name):
            link_prompt_to_experiment(client, prompt.name, experiment_id)
        return prompt.name, prompt.version
    return register(client, prompt, experiment_id)


_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")  # a str.format field: {question}, {passage}


def stage_prompts(stages) -> list[tuple[str, str]]:
    """(registry name, template) of the prompts a run's stages send besides the answer prompt: the
    query transform's (``rag-experiments.query.<kind>``) and the LLM reranker's
    (``rag-experiments.rerank.llm``); a stage says so with a ``prompt_name`` and a ``prompt``."""
    out = []
    for stage in (getattr(stages, s.name, None) for s in steps()):  # in run order
        name, text = getattr(stage, "prompt_name", None), getattr(stage, "prompt", None)
        if name and isinstance(text, str):
            out.append((PREFIX + name, text))
    return out


def register_text(
    client: MlflowClient, name: str, template: str, experiment_id: str | None = None
) -> tuple[str, int]:
    """(name, version) of a text prompt (``{field}`` → MLflow's ``{{field}}``), registered like the
    answer prompts: by content (a version only when no version of ``name`` holds the same text),
    under the per-prompt host lock, linked to the experiment."""
    text = _FIELD.sub(lambda m: "{{" + m.group(1) + "}}", template)
    memo = (client.tracking_uri, name, text, experiment_id)
    if memo in _registered:
        return _registered[memo]
    with _prompt_lock(client, name):
        version = _matching_text(client, name, text)
        if version is None:
            with _in_experiment(client, experiment_id):
                pv = client.register_prompt(name, text, commit_message=f"rag-experiments: the {name[len(PREFIX):]} prompt")
            client.set_prompt_version_tag(name, pv.version, CONTENT_TAG, stable_hash(template))
            version = _matching_text(client, name, text)
            print(f"[prompt] registered prompts:/{name}/{version} (a template text new to this store)")
        if experiment_id is not None:
            link_prompt_to_experiment(client, name, experiment_id)
    _registered[memo] = (name, version)
    return name, version


def _matching_text(client: MlflowClient, name: str, text: str) -> int | None:
    """The lowest version of ``name`` whose template is ``text`` (None: none is)."""
    if client.get_prompt(name) is None:
        return None
    return next((int(pv.version) for pv in _versions(client, name) if pv.template == text), None)


def register_stage_prompts(client: MlflowClient, experiment_id: str, stages) -> list[tuple[str, int]]:
    """At a run's start: the query transform's and LLM reranker's prompts registered
    (:func:`stage_prompts`, :func:`register_text`); their (name, version) to link once the run exists."""
    return [register_text(client, name, text, experiment_id) for name, text in stage_prompts(stages)]


def link_run(client: MlflowClient, run_id: str, name: str, version: int) -> None:
    """The run's ``mlflow.linkedPrompts`` tag (MLflow's link) and the version's run list (the
    Prompts tab's "MLflow runs")."""
    mlflow.set_tracking_uri(client.tracking_uri)  # MLflow's link writes through the global store
    # a PromptVersion, not a URI: loading by URI would also link the prompt to the Default experiment
    client.link_prompt_version_to_run(run_id, client.get_prompt_version(name, str(version)))
    with _prompt_lock(client, name):
        link_prompt_version_to_run_ids(client, name, version, run_id)


def link_model(client: MlflowClient, model_id: str, name: str, version: int) -> None:
    """The config's app version (LoggedModel) linked to the prompt version its runs use, once per
    (model, version): the model's ``mlflow.linkedPrompts`` tag, read first, written only when the
    link is missing, under the per-prompt host lock and re-read across hosts (``prompt_links``)."""
    memo = (client.tracking_uri, model_id, name, int(version))
    if memo in _model_links:
        return
    mlflow.set_tracking_uri(client.tracking_uri)  # MLflow's link reads the model through the global store
    with _prompt_lock(client, name):
        link_prompt_version_to_model(client, name, int(version), model_id)
    _model_links.add(memo)


def link_reused_run(client: MlflowClient, experiment_id: str, run_id: str, name: str, version: int) -> None:
    """A finished run that stands for another version too (v3 holding v1's text: the sweep skips
    v3): the run, its app versions (LoggedModel inputs) and the traces of its answers (those linked
    to a prompt already) linked to that version as well, so v3's page lists them like v1's. The
    run's own link is written last: a run linked to the version (its own, or a finished earlier
    call) needs nothing, so re-running a sweep costs one read here."""
    run = client.get_run(run_id)
    if {"name": name, "version": str(version)} in json.loads(run.data.tags.get(LINKED_PROMPTS_TAG) or "[]"):
        return
    for m in run.inputs.model_inputs:
        link_model(client, m.model_id, name, version)
    _link_answer_traces(client, experiment_id, run_id, name, version)
    link_run(client, run_id, name, version)


def _link_answer_traces(
    client: MlflowClient, experiment_id: str, run_id: str, name: str, version: int
) -> None:
    """Each trace of the run that is linked to a prompt (an answered item) linked to ``name`` /
    ``version`` too (``MlflowClient.link_prompt_versions_to_trace``, one call per trace)."""
    pv, token = client.get_prompt_version(name, str(version)), None
    entry = {"name": name, "version": str(version)}
    while True:
        page = client.search_traces(
            locations=[experiment_id], run_id=run_id, include_spans=False, max_results=500, page_token=token
        )
        for t in page:
            tag = t.info.tags.get(LINKED_PROMPTS_TAG)
            if tag and entry not in json.loads(tag):
                client.link_prompt_versions_to_trace([pv], t.info.trace_id)
        if not (token := page.token):
            return


def linked_prompts(client: MlflowClient, run_id: str) -> list[tuple[str, int]]:
    """(name, version) of every prompt version linked to the run (its ``mlflow.linkedPrompts``)."""
    tag = client.get_run(run_id).data.tags.get("mlflow.linkedPrompts") or "[]"
    return [(p["name"], int(p["version"])) for p in json.loads(tag)]
