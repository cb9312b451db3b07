"""Run names: the overrides that tell a sweep's runs apart, and the sweep's constants.

A sweep's run is named by the overrides that **vary** within the sweep (``chunking=markdown``,
or ``chunking=markdown,retriever.k=10``), in the order they were given; what every run of the
sweep shares goes to the runs' params and to the parent run's description
(``mlflow.note.content``: :func:`sweep_description`). A single run is named by its overrides.
Place keys (``identity.is_place_key``: paths, caches, tracking) never name a run, and no name
holds an absolute path (a path names the machine, not the config). The one exception is a sweep
over an input whose content a digest covers (``corpus.path``, ``evalset.path``): its runs differ
by that input, so the level is shown by the path's last component (``corpus.path=acme-docs``).

Experiments are named after the corpus (:func:`experiment_for_corpus`): ``rag-sample`` for the
bundled sample, the corpus's name otherwise, so runs on one's own documents do not mix with the
sample's; an explicit ``experiment_name=…`` wins.

Names are deterministic (the overrides' text) and unique within a sweep whose configs differ.
Nothing is cut to a width: the only cap is MLflow's run-name column (:data:`MAX_RUN_NAME`),
reached only by pathological overrides; constants are dropped first, then keys (values kept),
and a varying value is shortened only when nothing else is left (with a hash of the full name).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from rag_experiments.core.identity import PLACE_PATHS, is_place_key

#: The experiment of runs on the bundled sample corpus.
SAMPLE_EXPERIMENT = "rag-sample"
#: The experiment when the corpus is not known where the name is needed (a multirun that sweeps
#: ``corpus.path`` composes its own config without one: name the experiment explicitly there).
FALLBACK_EXPERIMENT = "rag-experiments"

#: MLflow's ``runs.name`` column is ``String(250)`` (PostgreSQL enforces it).
MAX_RUN_NAME = 250
#: Overrides that choose the data (``corpus=dir``, ``evalset.path=…``): constants dropped first.
DATA_GROUPS = ("corpus", "evalset")


def experiment_for_corpus(path: str | None, name: str | None, sample_path: str) -> str:
    """The default experiment name for a corpus at ``path`` (config ``corpus.path``) named ``name``
    (``corpus.name``, "" when unset).

    ``rag-sample`` when ``path`` is the bundled sample (``sample_path``); else ``name`` when set;
    else the path's last component without its extension (``/data/acme-docs`` → ``acme-docs``,
    ``/data/beir/scifact/corpus.jsonl`` → ``scifact``: a file named ``corpus.*`` is named by its
    directory, as BEIR lays datasets out); :data:`FALLBACK_EXPERIMENT` without a path.
    """
    if not path:
        return FALLBACK_EXPERIMENT
    p = Path(path).expanduser()
    if _same_path(p, Path(sample_path)):
        return SAMPLE_EXPERIMENT
    if name and str(name).strip():
        return str(name).strip()
    p = Path(os.path.normpath(p))
    stem = p.stem if p.suffix else p.name
    if stem == "corpus" and p.parent.name:
        stem = p.parent.name
    return stem or FALLBACK_EXPERIMENT


def _same_path(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return os.path.normpath(a) == os.path.normpath(b)


def override_key(override: str) -> str:
    """``chunking`` of ``chunking=fixed``, ``experiment`` of ``+experiment=x`` (no ``+``/``~``)."""
    return override.split("=", 1)[0].lstrip("+~")


def names_a_run(key: str) -> bool:
    """True when an override of ``key`` may appear in a run name (not a place, or a content path)."""
    key = key.lstrip("+~")
    return key in PLACE_PATHS or not is_place_key(key)


def varying_keys(job_overrides: Iterable[Sequence[str]]) -> list[str]:
    """The override keys whose value differs between the jobs of a sweep, in first-seen order.

    ``job_overrides``: each job's override list (``key=value`` strings), as the basic sweeper
    launches them (``multirun.split_sweep``)."""
    values: dict[str, set[str]] = {}
    for job in job_overrides:
        seen = set()
        for o in job:
            key = override_key(o)
            seen.add(key)
            values.setdefault(key, set()).add(o.split("=", 1)[1] if "=" in o else "")
        for key in values.keys() - seen:  # absent from this job: a value of its own
            values[key].add("\0absent")
    return [k for k, v in values.items() if len(v) > 1 and names_a_run(k)]


def swept_keys(parsed_overrides: Iterable) -> list[str]:
    """The keys of Hydra sweep overrides (``a,b``, ``choice(…)``, ``range(…)``, ``interval(…)``)
    with more than one value: a sweeper whose jobs are not known up front (Optuna, Ax) varies these."""
    out = []
    for o in parsed_overrides:
        if not o.is_sweep_override():
            continue
        if o.is_discrete_sweep() and len(set(o.sweep_string_iterator())) < 2:
            continue
        key = o.get_key_element().lstrip("+~")
        if names_a_run(key):
            out.append(key)
    return out


def _fit(parts: list[str], drop_first: Sequence[str] = ()) -> str:
    """``parts`` joined by commas, within :data:`MAX_RUN_NAME` (see the module docstring)."""
    name = ",".join(parts)
    if len(name) <= MAX_RUN_NAME:
        return name
    kept = [p for p in parts if p not in set(drop_first)]
    if kept and len(",".join(kept)) <= MAX_RUN_NAME:
        return ",".join(kept)
    values = ",".join(p.split("=", 1)[-1] for p in (kept or parts))
    if len(values) <= MAX_RUN_NAME:
        return values
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return values[: MAX_RUN_NAME - len(digest) - 2] + "…#" + digest


def _shown(override: str) -> str:
    """An override as a run name shows it: a content path by its last component, not in full."""
    key, sep, value = override.partition("=")
    if sep and override_key(override) in PLACE_PATHS:
        return f"{key}={os.path.basename(os.path.normpath(value)) or value}"
    return override


def run_name(overrides: Sequence[str], varying: Sequence[str] | None = None) -> str:
    """The run's name from its overrides.

    ``varying`` (a sweep's :func:`varying_keys`): only those overrides, in the job's order, a swept
    content path by its last component; None (a single run) or nothing varying: every override
    that is not a place key (no path: the experiment is named after the corpus), ``default`` when
    none. Over :data:`MAX_RUN_NAME`, the data overrides (``corpus``, ``evalset``) go first.
    """
    if varying:
        keys = set(varying)
        picked = [_shown(o) for o in overrides if override_key(o) in keys and names_a_run(override_key(o))]
        if picked:
            return _fit(picked)
    named = [o for o in overrides if not is_place_key(override_key(o))]
    data = [o for o in named if override_key(o).split(".", 1)[0] in DATA_GROUPS]
    return _fit(named, drop_first=data) if named else "default"


def constant_overrides(overrides: Sequence[str], varying: Sequence[str]) -> list[str]:
    """The sweep's overrides that are not varied (``retriever=bm25``), place keys left out."""
    keys = set(varying)
    return [o for o in overrides if override_key(o) not in keys and names_a_run(override_key(o))]


def sweep_description(sweep: dict) -> str:
    """The parent run's description (Markdown, ``mlflow.note.content``): what varies, what is held
    constant, and the command. Read from the multirun context (``multirun``: ``varying``,
    ``constants``, ``n_jobs``, ``command``)."""
    varying = sweep.get("varying") or []
    lines = [
        f"Sweep `{sweep.get('sweep_id', '?')}`: {sweep.get('n_jobs', '?')} configs; run names show "
        "only the overrides that vary: " + (", ".join(f"`{k}`" for k in varying) or "(none)") + "."
    ]
    constants = sweep.get("constants") or []
    if constants:
        lines += ["", "Held constant in every run (overrides; the full config is in each run's params):", ""]
        lines += [f"- `{c}`" for c in constants]
    if sweep.get("command"):
        lines += ["", "Command:", "", f"    {sweep['command']}"]
    return "\n".join(lines) + "\n"
