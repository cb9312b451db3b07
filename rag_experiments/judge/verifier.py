"""``judge=verifier``: a claim verifier trained here (docs/judges.md, "The trained verifier").

A calibrated logistic model over cheap features of (claim, context) gives P(supported); the label
is ``P >= threshold``. The features are the heuristic judge's checks as numbers instead of
thresholds (MiniLM cosine, content-word coverage, number/unit, negation, direction and entity
mismatches), taken at the most similar context window and over the whole context, and the
token-level soft alignment of the claim to the context (:mod:`.alignment`), which keeps a
reworded claim covered where exact word coverage does not.

The judge itself is :class:`~.verifier_judge.VerifierJudge`. A fitted verifier is a directory (:mod:`.verifier_fit` writes it): ``model.json`` (feature names,
standardisation, coefficients: a few hundred bytes) and ``manifest.json`` (identity: the weights'
sha256, the training-data digest, the recipe and the code version, plus the validation card).
Loading re-hashes ``model.json`` and refuses a directory whose hash does not match its manifest
(:class:`VerifierError`): a changed or corrupted verifier is never used silently.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from rag_experiments.judge.alignment import ALIGN_FEATURES, TokenAligner
from rag_experiments.judge.heuristic import (
    HeuristicJudge,
    _content_stems,
    _entities,
    _numbers_agree,
)
from rag_experiments.judge.token_pass import TokenPass, window_embedding
from rag_experiments.stages.text import sentence_texts

FEATURES = (
    "sim_max",  # MiniLM cosine of the claim and its most similar sentence / 2-sentence window
    "sim_x_cov",  # sim_max * coverage there: close *and* covering
    "cov_best",  # content-word coverage of the claim by that window
    "cov_ctx",  # ... by the whole context
    "missing_words",  # log1p(claim content words absent from the whole context)
    "num_mismatch_best",  # a number (with unit) of the claim absent from the window
    "num_mismatch_ctx",  # ... absent from the whole context
    "neg_mismatch",  # negation near the shared words in one of claim/window but not the other
    "dir_mismatch",  # opposite direction words (increase vs decrease)
    "ent_cov_best",  # share of the claim's names found in the window
    "ent_cov_ctx",  # ... in the whole context
    "claim_len",  # log1p(content words of the claim)
) + ALIGN_FEATURES  # token-level soft alignment (alignment.py): paraphrase-robust coverage
N_CHECKS = len(FEATURES) - len(ALIGN_FEATURES)
#: What the features mean, beyond their names: a fit of another version is refused at load.
#: 2: two MiniLM passes (sentence-transformers windows + a whole-context token pass);
#: 3: one shared token pass (windows from sentence passes, contexts by sentence).
FEATURE_VERSION = 3


class VerifierError(ValueError):
    """A verifier directory that cannot be used (missing, incomplete, or hash mismatch)."""


def weights_sha256(path: Path) -> str:
    return hashlib.sha256((Path(path) / "model.json").read_bytes()).hexdigest()


def _features_of(claim: str, context: str, rows: list[dict]) -> list[float]:
    if not rows:
        n = math.log1p(len(_content_stems(claim)))  # no context: nothing covered, every check fails
        return [0.0, 0.0, 0.0, 0.0, n, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, n]
    best = max(rows, key=lambda r: r["sim"])
    c_stems = _content_stems(claim)
    ctx_stems = set(_content_stems(context))
    missing = [s for s in c_stems if s not in ctx_stems]
    cov_ctx = 1 - len(missing) / len(c_stems) if c_stems else 1.0
    ents = _entities(claim)
    ent_ctx = sum(e.lower() in context.lower() for e in ents) / len(ents) if ents else 1.0
    pol = best["polarity_why"]
    return [
        best["sim"],
        best["sim"] * best["coverage"],
        best["coverage"],
        cov_ctx,
        math.log1p(len(missing)),
        float(not best["numbers_ok"]),
        float(not _numbers_agree(claim, context)[0]),
        float(pol.startswith("negation")),
        float(pol.startswith("direction")),
        best["entity_coverage"],
        ent_ctx,
        math.log1p(len(c_stems)),
    ]


class SharedPassChecks(HeuristicJudge):
    """The heuristic judge's checks on vectors from the verifier's shared token pass: a claim's and
    a sentence's embedding are exact (mean pooling of the pass), a 2-sentence window's is the mean
    of its sentences' token vectors (:func:`.token_pass.window_embedding`, an approximation)."""

    def __init__(self, passes: TokenPass) -> None:
        super().__init__(embedder=passes.embedder)
        self.passes = passes

    def _vectors(self, claims: list[str], context: str, cands: list[str]) -> np.ndarray:
        sents = sentence_texts(context)
        texts = list(dict.fromkeys(claims + sents))
        enc = dict(zip(texts, self.passes.encode(texts), strict=True))  # one call: one memo state
        rows = [enc[t].embedding for t in claims + sents]
        rows += [window_embedding([enc[a], enc[b]]) for a, b in zip(sents, sents[1:], strict=False)]
        if len(rows) != len(claims) + len(cands):  # candidates = sentences + windows (HeuristicJudge)
            raise ValueError(f"{len(cands)} candidates but {len(rows) - len(claims)} sentence/window vectors")
        return np.stack(rows)


class FeatureExtractor:
    """:data:`FEATURES` for (claim, context) pairs: the heuristic judge's checks and the token
    soft alignment, both on the same MiniLM.

    ``one_pass`` (default; feature version 3): one memoised MiniLM pass per distinct claim and
    context sentence serves both (:mod:`.token_pass`). False (feature version 2, the reference
    for benchmarks): sentence-transformers embeddings of every sentence and window for the checks,
    plus a token pass over each claim and whole context for the alignment. ``precision``: the
    token pass's (:data:`.token_pass.PRECISIONS`; ``bfloat16`` only with ``one_pass`` is measured).
    """

    def __init__(self, embedder: Any = None, one_pass: bool = True, precision: str = "float32") -> None:
        self.one_pass = bool(one_pass)
        if self.one_pass:
            self.aligner = TokenAligner(embedder, precision=precision)
            self.heuristic: HeuristicJudge = SharedPassChecks(self.aligner.passes)
        else:
            self.heuristic = HeuristicJudge(embedder=embedder)
            self.aligner = TokenAligner(self.heuristic.embedder, context_by_sentence=False, precision=precision)

    @property
    def feature_version(self) -> int:
        return FEATURE_VERSION if self.one_pass else 2

    @property
    def identity(self) -> str:
        checks = self.heuristic.embedder_identity
        checks = json.loads(checks) if checks.startswith("{") else checks
        return json.dumps(
            {"features": self.feature_version, "checks": checks, "alignment": json.loads(self.aligner.identity)},
            sort_keys=True,
        )

    def prepare(self, claims: list[str], contexts: list[str], progress: bool = False, desc: str = "") -> None:
        """Encode every claim and context sentence (one pass; or, two-pass, every claim and
        candidate window, then the token pass), in blocks of 512 texts so a long fit shows
        progress with an ETA (embedding is most of a fit's time)."""
        from rag_experiments.core.progress import Progress

        contexts = list(dict.fromkeys(contexts))
        if self.one_pass:
            texts = list(claims) + [t for c in contexts for t in self.aligner.context_texts(c)]
            steps = [(self.aligner.passes.encode, list(dict.fromkeys(texts)), 512)]
        else:
            texts = list(claims) + [c for ctx in contexts for c in self.heuristic.candidates(ctx)]
            steps = [(self.heuristic._encode, list(dict.fromkeys(texts)), 512),
                     (self.aligner.passes.encode, list(dict.fromkeys(list(claims) + contexts)), 256)]
        total = sum(len(t) for _, t, _ in steps)
        with Progress(desc or "verifier: embedding", total, enabled=progress and (bool(desc) or total > 512), unit="texts") as bar:
            for encode, todo, block in steps:
                for i in range(0, len(todo), block):
                    encode(todo[i : i + block])
                    bar.update(len(todo[i : i + block]))

    def matrix(self, claims: list[str], contexts: list[str], progress: bool = False) -> np.ndarray:
        from rag_experiments.core.progress import track

        self.prepare(claims, contexts, progress)
        by_ctx: dict[str, list[int]] = {}
        for i, ctx in enumerate(contexts):
            by_ctx.setdefault(ctx, []).append(i)
        X = np.zeros((len(claims), len(FEATURES)))
        for ctx, idx in track(list(by_ctx.items()), "verifier features", enabled=progress, unit="contexts"):
            rows = self.heuristic.features([claims[i] for i in idx], ctx)
            for i, r in zip(idx, rows, strict=True):
                X[i, :N_CHECKS] = _features_of(claims[i], ctx, r)
        if len(claims):
            X[:, N_CHECKS:] = self.aligner.features(list(claims), list(contexts))
        return X


# -- the logistic model (numpy; no scikit-learn at run time) --------------------------------------


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1.0, balanced: bool = True) -> dict:
    """Standardised L2 logistic regression by Newton's method (IRLS).

    Minimises Σ w_i·logloss(y_i, σ(b + x̃_i·β)) + l2/2·|β|², x̃ = (x − mean)/scale; ``balanced``
    weights w_i = n / (2·n_class(y_i)), so P(supported) is calibrated for a 50/50 prior.
    """
    X, y = np.asarray(X, float), np.asarray(y, float)
    mean, scale = X.mean(0), X.std(0)
    scale[scale < 1e-9] = 1.0
    Z = np.hstack([np.ones((len(X), 1)), (X - mean) / scale])
    n_pos = y.sum()
    w = np.ones(len(y))
    if balanced and 0 < n_pos < len(y):
        w = np.where(y == 1, len(y) / (2 * n_pos), len(y) / (2 * (len(y) - n_pos)))
    beta = np.zeros(Z.shape[1])
    reg = np.full(Z.shape[1], l2)
    reg[0] = 0.0  # the intercept is not shrunk
    for _ in range(50):
        p = 1 / (1 + np.exp(-np.clip(Z @ beta, -30, 30)))
        grad = Z.T @ (w * (p - y)) + reg * beta
        H = (Z * (w * p * (1 - p))[:, None]).T @ Z + np.diag(reg + 1e-9)
        step = np.linalg.solve(H, grad)
        beta -= step
        if np.abs(step).max() < 1e-8:
            break
    return {
        "features": list(FEATURES),
        "mean": mean.round(10).tolist(),
        "scale": scale.round(10).tolist(),
        "intercept": round(float(beta[0]), 10),
        "coef": beta[1:].round(10).tolist(),
        "l2": l2,
    }


def predict_logistic(model: dict, X: np.ndarray) -> np.ndarray:
    """P(supported) = σ(intercept + ((x − mean)/scale)·coef)."""
    z = model["intercept"] + ((np.asarray(X, float) - model["mean"]) / model["scale"]) @ np.asarray(model["coef"])
    return 1 / (1 + np.exp(-np.clip(z, -30, 30)))


# -- loading a fitted verifier -----------------------------------------------------------------------


def load_verifier_dir(path: str | Path) -> tuple[dict, dict]:
    """(model, manifest) of a verifier directory; :class:`VerifierError` when missing or altered."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise VerifierError(
            f"judge.path: verifier directory not found: {path} "
            "(fit one with: python -m rag_experiments.judge fit --out DIR)"
        )
    for name in ("model.json", "manifest.json"):
        if not (path / name).is_file():
            raise VerifierError(f"judge.path: {path}: no {name}: not a fitted verifier (or a fit that was killed)")
    manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    got = weights_sha256(path)
    if got != manifest.get("weights_sha256"):
        raise VerifierError(
            f"judge.path: {path}: model.json sha256 {got[:16]} does not match the manifest's "
            f"{str(manifest.get('weights_sha256'))[:16]}: the verifier was changed after it was fitted; "
            "re-fit it (python -m rag_experiments.judge fit) instead of editing it"
        )
    model = json.loads((path / "model.json").read_text(encoding="utf-8"))
    if model.get("feature_version", 2) != FEATURE_VERSION:
        raise VerifierError(
            f"judge.path: {path}: fitted on feature version {model.get('feature_version', 2)}, this code "
            f"computes version {FEATURE_VERSION} (verifier.FEATURE_VERSION): re-fit it "
            "(python -m rag_experiments.judge fit, with the same --labels)"
        )
    if model.get("features") != list(FEATURES):
        raise VerifierError(
            f"judge.path: {path}: fitted on features {model.get('features')}, this code computes "
            f"{list(FEATURES)}: re-fit it"
        )
    return model, manifest
