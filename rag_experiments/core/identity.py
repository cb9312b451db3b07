"""What identifies a result: model bytes, code, and which config keys are places, not settings.

Identity is content, never a path (``docs/identity.md``):

- a model is the sha256 of its weights' bytes (:func:`file_sha256`, :func:`dir_sha256`), memoised
  per (path, size, mtime) so a sweep reads each file once;
- the code behind a stage is the hash of its source modules' syntax trees (:func:`code_version`;
  comments, docstrings and formatting do not count), and the code behind a whole run is
  :func:`code_fingerprint`;
- "place" keys (:data:`PLACE_KEYS`) say where inputs and outputs live; they never enter
  ``config_hash``, the config diff, or run names (:func:`is_place_key`, :func:`semantic_config`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rag_experiments.core.slots import SLOTS, slot

# ------------------------------------------------------------------------------ model bytes

_HASHES: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, memoised per (resolved path, size, mtime_ns).

    A file rewritten in place changes its mtime, so the memo never serves a stale hash.
    """
    path = Path(path).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def dir_sha256(path: str | Path) -> str:
    """sha256 over ``(relative name, file_sha256)`` of every file of a model directory.

    Hidden files and folders (``.git``, a hub download's ``.cache/`` with timestamps) are skipped:
    they are not part of the model. Two checkpoints of one architecture have equal names and
    sizes but different bytes, so they get different hashes.
    """
    root = Path(path).resolve()
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        h.update(f"{rel.as_posix()}\0{file_sha256(f)}\n".encode())
    return h.hexdigest()


def unreadable_weights(path: str | Path) -> str:
    """Why a model directory's ``*.safetensors`` files cannot be loaded ("" when they can): each
    must hold its 8-byte header length N, an N-byte JSON header, and every tensor's bytes
    (``data_offsets`` end at most at the file's size less 8 + N). A copy cut short (a failed
    download, a full disk) is caught here, at the config check, not as a traceback mid-run."""
    import json
    import struct

    for f in sorted(Path(path).expanduser().rglob("*.safetensors")):
        size = f.stat().st_size
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n)) if 8 + n <= size else None
        except (OSError, ValueError, struct.error):
            header = None
        if not isinstance(header, dict):
            return f"{f}: not a readable safetensors file (size {size} bytes)"
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end > size:
            return f"{f}: truncated ({size} bytes, its header needs {8 + n + end})"
    return ""


# ------------------------------------------------------------------------------ code

#: The modules whose code computes each cached stage (keys of ``cache.stage_key``): the stage
#: slots' own (``core.slots.SLOTS``), then the entries that are not a slot's output.
_JUDGE_CODE = slot("judge").code
STAGE_CODE: dict[str, tuple[str, ...]] = {
    **{ns: s.code for s in SLOTS for ns in s.cache},
    "chunk_tokens": ("rag_experiments.stages.text", "rag_experiments.evaluation.budget"),
    "card_verdict": _JUDGE_CODE,  # a judge's verdict on a labelled pair, with its seconds
    "judge_card": (*_JUDGE_CODE, "rag_experiments.judge.card", "rag_experiments.judge.validity"),
    # a card's synthetic pairs, per corpus digest, seed and cap (a cached card's run skips making them)
    "synthetic_pairs": ("rag_experiments.evalset.synthetic_pairs", "rag_experiments.evalset.judge_pairs",
                        "rag_experiments.stages.text"),  # fmt: skip
    # a fitted claim verifier: its features, its fit and its synthetic training data
    "verifier_fit": (
        "rag_experiments.judge.verifier",
        "rag_experiments.judge.alignment",
        "rag_experiments.judge.token_pass",
        "rag_experiments.stages.text",  # sentence splitting decides the windows and token passes
        "rag_experiments.judge.verifier_fit",
        "rag_experiments.judge.heuristic",
        "rag_experiments.stages.embedding",
        "rag_experiments.evalset.synthetic_pairs",
    ),
}

#: Everything that computes a run's numbers (resume compares their fingerprint). Reports,
#: compare, gate and the CLIs read results; changing them re-runs nothing.
RESULT_CODE = (
    "rag_experiments.stages",
    "rag_experiments.judge",  # was stages.judging: the judges' code decides generation metrics
    "rag_experiments.evaluation",
    "rag_experiments.run.pipeline",
    "rag_experiments.run.answer",  # the answer half: generate, the slots after it, judge
    "rag_experiments.run.retrieval",
    "rag_experiments.run.query_stage",
    "rag_experiments.run.app_step",
    "rag_experiments.run.history_step",
    "rag_experiments.run.steps",  # the run loop: error counts and the status rule
    "rag_experiments.evalset.corpus",
    "rag_experiments.evalset.load",
    "rag_experiments.evalset.weak_facts",  # which key facts correctness leaves out
    "rag_experiments.core.types",
)

_CODE: dict[tuple[str, int, int], str] = {}


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


def source_hash(path: str | Path) -> str:
    """sha256 of a Python file's syntax tree without docstrings (``ast.dump``: no line numbers).

    Comments, docstrings and formatting do not change it; any change to what the code does does.
    """
    path = Path(path).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _CODE:
        tree = _strip_docstrings(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        _CODE[key] = hashlib.sha256(ast.dump(tree).encode()).hexdigest()
    return _CODE[key]


def module_files(name: str) -> list[Path]:
    """The source files of a module, or of every module of a package (sorted)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"code identity: module {name} not found")
    if spec.submodule_search_locations:
        return sorted(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.py"))
    return [Path(spec.origin)]


#: ``_modules_hash`` per module names: (their files, the files' (size, mtime) when hashed, the hash).
_MODULES: dict[tuple[str, ...], tuple[list[tuple[str, Path]], tuple, str]] = {}


def _stats(files: list[tuple[str, Path]]) -> tuple:
    out = []
    for _, f in files:
        try:
            st = os.stat(f)
        except OSError:
            return ()
        out.append((st.st_size, st.st_mtime_ns))
    return tuple(out)


def _modules_hash(names: Iterable[str]) -> str:
    """Hash of the modules' source files. Every ``stage_key`` asks (one per verdict, claim, card
    pair: ~500 a default run), so the file list and the hash are kept per process and re-made
    only when a file's size or mtime changed (an edit, as :func:`source_hash` sees it): one
    ``stat`` per file a call instead of ``find_spec``, a directory walk and ``resolve`` (0.4 s CPU
    a default run)."""
    key = tuple(sorted(set(names)))
    hit = _MODULES.get(key)
    if hit is not None and _stats(hit[0]) == hit[1]:
        return hit[2]
    files = [(name, f) for name in key for f in module_files(name)]
    stats = _stats(files)
    h = hashlib.sha256()
    for name, f in files:
        h.update(f"{name}:{f.name}:{source_hash(f)}\n".encode())
    _MODULES[key] = (files, stats, h.hexdigest()[:16])
    return _MODULES[key][2]


def code_version(stage: str) -> str:
    """Hash of the code that computes ``stage`` (a :data:`STAGE_CODE` key; unknown → KeyError)."""
    return _modules_hash(STAGE_CODE[stage])


def code_fingerprint() -> str:
    """Hash of all code that computes a run's results (:data:`RESULT_CODE`, the failure labels in
    ``evaluation`` included)."""
    return _modules_hash(RESULT_CODE)


# ------------------------------------------------------------------------------ place keys

#: Config keys that say where things are or how a run is driven, never what it measures. A key
#: is a place key when any of its dotted parts is one of these names (``embedding.cache_dir``,
#: ``hydra.run.dir``), or when it is one of :data:`PLACE_PATHS`.
PLACE_KEYS = frozenset(
    {
        "cache_dir",
        "cache_enabled",
        "cache",
        "progress",
        "show_progress",
        "tracking",
        "hydra",
        "paths",
        "force",
        "dry_run",  # counts a sweep's calls instead of making them: no run at all (docs/endpoints.md)
        "experiment_name",
        # where embeddings are computed, not what they are (same vectors: docs/scale.md)
        "ray",
        "ray_min_chunks",
        "ray_concurrency",
        "wait_timeout_s",  # racing: how long to wait for a silent peer (docs/racing.md)
        # an endpoint's limits: how fast calls are made, never what they answer (docs/endpoints.md)
        "max_concurrency",
        "rpm",
        "tpm",
        "budget",  # how much may be spent, never what is measured: raised, the same runs resume
    }
)
#: Input locations whose content is covered by a digest (``corpus_digest``, ``evalset_digest``).
PLACE_PATHS = ("corpus.path", "evalset.path", "judge_card.pairs", "judge.path", "judge.corpus_path")
PLACE_PATHS += ("judge.verifier.path", "judge.verifier.corpus_path")  # judge_card.pairs: tag judge_card_pairs_digest; a verifier's content is in the judge's identity
PLACE_PATHS += ("prompt.tracking_uri",)  # the store a registered prompt is read from
#: Config nodes that only name content held elsewhere: a registered prompt's name, version or alias
#: (``prompt=registry``). ``config_hash`` keeps just their ``_target_``; the content enters as the
#: built stage's identity (the template text, ``Stages.identities``), so v1 and v3 with one text agree.
REFERENCE_TARGETS = ("rag_experiments.tracking.prompt_registry.RegisteredPrompt",)
#: ``_target_`` prefixes as they were before the package layout of docs/architecture.md: hashed under
#: their old names so a file move never changes ``config_hash`` (caches and resume keep matching).
LEGACY_TARGETS = (
    ("rag_experiments.evalset.corpus.", "rag_experiments.datasets.corpus."),
    ("rag_experiments.evalset.load.", "rag_experiments.evalset."),
    ("rag_experiments.judge.", "rag_experiments.stages.judging."),
    ("rag_experiments.tracking.mlflow_judge.", "rag_experiments.stages.mlflow_judge."),
)


#: Keys added to the config after runs were recorded, at the value under which results are what they
#: were without the key (``rerank=none``: no reranker; hybrid fusion as before): left out of
#: ``config_hash`` so those runs keep their hash (resume, ``[skip]``, the recorded-hash test).
NEUTRAL_DEFAULTS: dict[str, Any] = {
    **{s.group: {"name": s.off} for s in SLOTS if s.neutral_none},  # a slot added later, off
    "retriever.fusion": "rrf",
    "retriever.alpha": 0.5,
    # the sequential judge card (judge.validity.CardSettings): its code defaults, so the keys can
    # join conf/config.yaml without changing a recorded config_hash
    "judge_card.target_width": 0.2,
    "judge_card.batch_pairs": 40,
    "judge.fold": False,  # the folded LLM judge (judge.llm.LLMJudge), off: the judge it was
}


#: Keys an option ignores when the slot is off: ``query=none`` with ``+generator@query.llm=local`` (a
#: sweep ``-m query=none,hyde`` shares the override) calls no model, so its hash is plain none's.
UNUSED_WHEN_NONE: dict[str, tuple[str, ...]] = {"query": ("llm",), "history": ("llm",)}
_OFF = {s.group: s.off for s in SLOTS}  # the option that builds nothing: none, history's last_turn


def _takes(target: str, key: str) -> bool:
    """Whether the constructor of ``target`` has a parameter ``key`` (an unimportable one: yes)."""
    import inspect

    from rag_experiments.core.build import target_object

    try:
        return key in inspect.signature(target_object(target)).parameters
    except Exception:  # noqa: BLE001 - config checks report an unimportable target
        return True


def _drop_unused(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """``cfg`` without the :data:`UNUSED_WHEN_NONE` keys of a slot whose option is off (``none``,
    history's ``last_turn``) or whose option's constructor does not take them (history=window,
    oracle: no model, so a sweep's shared ``+generator@history.llm`` is not theirs)."""
    out = dict(cfg)
    for group, keys in UNUSED_WHEN_NONE.items():
        node = out.get(group)
        if not isinstance(node, Mapping):
            continue
        target = node.get("_target_")
        if (node.get("name") == _OFF.get(group, "none") and not target) or target:
            out[group] = {k: v for k, v in node.items() if k not in keys or (target and _takes(str(target), k))}
    return out


def hashed_target(target: str) -> str:
    """The name a ``_target_`` is hashed under: its pre-layout module path (:data:`LEGACY_TARGETS`)."""
    for new, old in LEGACY_TARGETS:
        if target.startswith(new):
            return old + target[len(new) :]
    return target


def is_place_key(key: str) -> bool:
    """True for a dotted config key (or a Hydra override's key) that is a place, at any depth."""
    key = key.lstrip("+~").split("=", 1)[0]
    if any(key == p or key.startswith(p + ".") for p in PLACE_PATHS):
        return True
    return any(part in PLACE_KEYS for part in key.split("."))


def semantic_config(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``cfg`` without its place keys, at any depth, and without the keys at their
    :data:`NEUTRAL_DEFAULTS` (what ``config_hash`` hashes)."""
    out: dict[str, Any] = {}
    for k, v in (cfg if prefix else _drop_unused(cfg)).items():
        dotted = f"{prefix}{k}"
        if is_place_key(dotted) or (dotted in NEUTRAL_DEFAULTS and NEUTRAL_DEFAULTS[dotted] == v):
            continue
        if isinstance(v, Mapping) and v.get("_target_") in REFERENCE_TARGETS:
            out[k] = {"_target_": v["_target_"]}
            continue
        if k == "_target_" and isinstance(v, str):
            v = hashed_target(v)
        out[k] = semantic_config(v, dotted + ".") if isinstance(v, Mapping) else v
    return out


def model_identities(stages: Mapping[str, Any]) -> dict[str, str]:
    """``identity`` of every built stage that has one (model bytes + settings), for ``config_hash``."""
    return {
        name: str(obj.identity)
        for name, obj in sorted(stages.items())
        if obj is not None and getattr(obj, "identity", None) is not None
    }


def judge_fingerprint(judge: Any) -> str | None:
    """The run tag ``judge_identity``: sha256 of the judge's ``identity`` (its kind, settings, model
    bytes and embedder), first 16 hex digits; None without a judge. compare / gate / select refuse
    runs whose fingerprints differ (``tracking.judge_runs``)."""
    ident = getattr(judge, "identity", None)
    return None if ident is None else hashlib.sha256(str(ident).encode()).hexdigest()[:16]
