"""Fitting the claim verifier: training data, content-hashed identity, cache, kill-safe writes.

Training data = synthetic pairs of the corpus (:mod:`rag_experiments.evalset.synthetic_pairs`)
and, when given, human-labelled pairs files (``judge_pairs`` format). The fit's identity
(``fit_id``) is the hash of the training pairs' digest, the recipe, the feature embedder's
identity and the code that computes features and fit: the same inputs give the same
``fit_id``, and a re-fit with them is a cache hit that trains nothing.

Layout: ``<cache_dir>/verifiers/<corpus digest[:16]>/<fit_id[:16]>/{model.json, manifest.json}``
(or ``--out DIR``), written to a temporary sibling and renamed, so a killed fit leaves no
half-written verifier; ``latest.json`` beside them names the most recent fit for that corpus,
which ``judge=verifier`` uses when ``judge.path`` is not set.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rag_experiments.core.cache import stable_hash
from rag_experiments.evalset.judge_pairs import JudgePair, pairs_digest
from rag_experiments.judge.verifier import (
    FeatureExtractor,
    VerifierError,
    fit_logistic,
    load_verifier_dir,
    predict_logistic,
    weights_sha256,
)

RECIPE_VERSION = 2  # 2: + token soft-alignment features, paraphrase and same_doc pairs


@dataclass
class Recipe:
    """How a verifier is fitted (part of its identity).

    ``synthetic_max``: synthetic pairs kept (whole source-sentence groups). ``synthetic_with_labels``:
    whether synthetic pairs join human labels when labels are given (measured on judge_pairs: they
    lower the grouped-CV κ, 0.27 -> 0.24, so by default human labels train alone).
    """

    model: str = "logistic"
    l2: float = 1.0
    threshold: float = 0.5
    synthetic_max: int = 1500
    synthetic_with_labels: bool = False
    seed: int = 0
    cv_folds: int = 5
    version: int = RECIPE_VERSION

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class FitResult:
    path: Path
    fit_id: str
    cached: bool
    seconds: float
    manifest: dict = field(default_factory=dict)


def corpus_key(corpus_digest: str) -> str:
    return corpus_digest[:16]


def verifiers_root(cache_dir: str | Path, corpus_digest: str) -> Path:
    return Path(cache_dir) / "verifiers" / corpus_key(corpus_digest)


def fit_code_version() -> str:
    from rag_experiments.core.identity import code_version

    return code_version("verifier_fit")


def training_pairs(
    synthetic: list[JudgePair], labelled: list[JudgePair], recipe: Recipe
) -> list[JudgePair]:
    """The pairs the model is fitted on (see :class:`Recipe`)."""
    if labelled and not recipe.synthetic_with_labels:
        return list(labelled)
    return list(synthetic) + list(labelled)


def fit_identity(pairs: list[JudgePair], recipe: Recipe, embedder_identity: str) -> str:
    return stable_hash("verifier_fit", fit_code_version(), pairs_digest(pairs), recipe.as_dict(), embedder_identity)


def _card(extractor_X: np.ndarray, pairs: list[JudgePair], recipe: Recipe) -> dict:
    """Grouped-CV figures of the recipe on ``pairs`` (never the fit set): κ, balanced accuracy,
    acceptance per type, with cluster-bootstrap CIs."""
    from rag_experiments.judge.verifier_eval import cross_validated, figures_with_ci

    y = np.array([p.label == "supported" for p in pairs], float)
    groups = [p.group_key for p in pairs]
    if len(set(groups)) < recipe.cv_folds or len(set(y)) < 2:
        return {"n": len(pairs), "note": "too few groups or one label: no cross-validation"}

    def fit(tr):
        m = fit_logistic(extractor_X[tr], y[tr], l2=recipe.l2)
        return lambda te: predict_logistic(m, extractor_X[te])

    p = cross_validated(fit, len(pairs), groups, recipe.cv_folds, recipe.seed)
    pred = np.where(p >= recipe.threshold, "supported", "unsupported")
    f = figures_with_ci([q.label for q in pairs], pred, groups, [q.type for q in pairs], n_resamples=500)
    f["ci"] = {k: list(v) for k, v in f["ci"].items()}
    f["cv"] = f"grouped {recipe.cv_folds}-fold (group = claim / source sentence)"
    return f


def _write_atomic_dir(final: Path, files: dict[str, str]) -> None:
    """Write ``files`` into a temporary sibling of ``final`` and rename it into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, text in files.items():
        (tmp / name).write_text(text, encoding="utf-8")
    try:
        os.replace(tmp, final)
    except OSError:  # a parallel fit of the same inputs finished first: theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)


def _write_latest(root: Path, path: Path, fit_id: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".latest.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"path": str(path.resolve()), "fit_id": fit_id, "at": time.time()}))
    os.replace(tmp, root / "latest.json")


def fit_verifier(
    synthetic: list[JudgePair],
    labelled: list[JudgePair],
    corpus_digest: str,
    cache_dir: str | Path,
    out: str | Path | None = None,
    recipe: Recipe | None = None,
    labels_meta: list[dict] | None = None,
    embedder=None,
    progress: bool = True,
) -> FitResult:
    """Fit (or find in the cache) the verifier of these inputs; returns where it is.

    ``out`` that holds a *different* fit raises :class:`VerifierError` (never overwritten).
    """
    t0 = time.perf_counter()
    recipe = recipe or Recipe()
    extractor = FeatureExtractor(embedder)
    pairs = training_pairs(synthetic, labelled, recipe)
    fit_id = fit_identity(pairs, recipe, extractor.identity)
    root = verifiers_root(cache_dir, corpus_digest)
    final = Path(out).expanduser() if out else root / fit_id[:16]
    if (final / "manifest.json").is_file():
        _, manifest = load_verifier_dir(final)  # raises on a hash mismatch
        if manifest.get("fit_id") != fit_id:
            raise VerifierError(
                f"--out {final}: holds another verifier (fit {str(manifest.get('fit_id'))[:16]}, this one "
                f"{fit_id[:16]}); choose another directory or delete it"
            )
        _write_latest(root, final, fit_id)
        return FitResult(final, fit_id, True, time.perf_counter() - t0, manifest)
    if final.exists() and any(final.iterdir()):
        raise VerifierError(f"--out {final}: exists and is not a fitted verifier; choose an empty directory")
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if progress else (lambda s: None)
    say(f"[verifier fit] {len(pairs)} training pairs ({len(synthetic)} synthetic, {len(labelled)} labelled)")
    X = extractor.matrix([p.claim for p in pairs], [p.context for p in pairs], progress=progress)
    y = np.array([p.label == "supported" for p in pairs], float)
    model = {**fit_logistic(X, y, l2=recipe.l2), "feature_version": extractor.feature_version}
    card = {"fit_data": _card(X, pairs, recipe)}
    if labelled and not recipe.synthetic_with_labels:
        Xs = extractor.matrix([p.claim for p in synthetic], [p.context for p in synthetic])
        card["synthetic_heldout"] = _card(Xs, list(synthetic), recipe)
    model_text = json.dumps(model, indent=1, sort_keys=True)
    import hashlib

    manifest = {
        "fit_id": fit_id,
        "weights_sha256": hashlib.sha256(model_text.encode()).hexdigest(),
        "threshold": recipe.threshold,
        "recipe": recipe.as_dict(),
        "code_version": fit_code_version(),
        "embedder": extractor.identity,
        "data": {
            "corpus_digest": corpus_digest,
            "pairs_digest": pairs_digest(pairs),
            "n_pairs": len(pairs),
            "n_synthetic": len(synthetic) if pairs is not labelled else 0,
            "n_labelled": len(labelled),
            "labels": labels_meta or [],
        },
        "card": card,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _write_atomic_dir(final, {"model.json": model_text, "manifest.json": json.dumps(manifest, indent=1)})
    if weights_sha256(final) != manifest["weights_sha256"]:  # a concurrent writer won the rename
        manifest = load_verifier_dir(final)[1]
    _write_latest(root, final, fit_id)
    return FitResult(final, fit_id, False, time.perf_counter() - t0, manifest)


def _stale_auto_fit(path: Path) -> bool:
    """A fit of an older feature version made from the corpus alone with the default recipe
    (what ``auto_fit`` makes): re-fitting it uses the same data, so it is not a refit with other data."""
    from rag_experiments.judge.verifier import FEATURE_VERSION

    try:
        model = json.loads((path / "model.json").read_text(encoding="utf-8"))
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # loading it reports the problem
    same_recipe = {**manifest.get("recipe", {}), "version": None} == {**Recipe().as_dict(), "version": None}
    no_labels = manifest.get("data", {}).get("n_labelled") == 0
    return model.get("feature_version", 2) != FEATURE_VERSION and same_recipe and no_labels


def resolve_verifier(path: str | None, corpus_path: str | None, cache_dir: str, auto_fit: bool) -> Path:
    """The verifier directory a judge uses: ``path``, else the latest fit for the corpus, else a
    fit made now from the corpus alone (``auto_fit``). Missing directories raise VerifierError."""
    if path:
        return Path(path).expanduser()
    if not corpus_path:
        raise VerifierError("judge.path: not set and no corpus to look up its verifier (set judge.path=DIR)")
    from rag_experiments.evalset.corpus import corpus_digest, load_corpus

    docs = load_corpus(corpus_path)
    digest = corpus_digest(docs)
    root = verifiers_root(cache_dir, digest)
    latest = root / "latest.json"
    why = "no fit for corpus {} yet: fitting on its synthetic pairs (once)"
    if latest.is_file():
        found = Path(json.loads(latest.read_text())["path"])
        if not found.is_dir():
            raise VerifierError(
                f"judge.path: the latest verifier for corpus {digest[:16]} ({found}) is missing; "
                "re-fit it (python -m rag_experiments.judge fit) or set judge.path=DIR"
            )
        if not (auto_fit and _stale_auto_fit(found)):
            return found  # current, or fitted with labels / another recipe: loading it says what to do
        why = f"the latest fit for corpus {{}} ({found}) computed older features: re-fitting it from the corpus alone"
    if not auto_fit:
        raise VerifierError(
            f"judge.path: no verifier fitted for corpus {digest[:16]} under {root.parent}; "
            "fit one with: python -m rag_experiments.judge fit"
        )
    from rag_experiments.evalset.synthetic_pairs import synthetic_pairs

    print(f"[verifier] {why.format(digest[:16])}", file=sys.stderr)
    res = fit_verifier(synthetic_pairs(docs, n_max=Recipe().synthetic_max), [], digest, cache_dir)
    print(f"[verifier] fitted in {res.seconds:.0f} s: {res.path}", file=sys.stderr)
    return res.path
