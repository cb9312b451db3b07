"""The trained claim verifier as a judge (``judge=verifier``; model: :mod:`.verifier`, fit and
lookup: :mod:`.verifier_fit`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from rag_experiments.core.types import Verdict
from rag_experiments.judge.claims import split_claims
from rag_experiments.judge.verifier import FeatureExtractor, load_verifier_dir, predict_logistic
from rag_experiments.judge.verifier_fit import resolve_verifier


class VerifierJudge:
    """The trained claim verifier as a judge (module docstring).

    ``path``: a fitted verifier directory; None = the most recent fit for the configured corpus
    (``corpus_path``) under ``cache_dir/verifiers``, fitted now from the corpus alone (synthetic
    pairs, about a minute on 2 cores) when there is none and ``auto_fit`` is true. Verdict
    ``score`` is P(supported); ``label`` is ``score >= threshold`` (None: the fit's threshold).
    Claims and answer relevance are the heuristic judge's (sentences; cosine to the query).
    ``precision``: the MiniLM pass's, ``float32`` (exact) or ``bfloat16`` (CPU autocast: about 3x
    less CPU where the CPU has bf16 instructions; a separate identity; docs/judges.md).
    """

    remote = False  # a local model only: no request to count (a dry run skips it, run.dry_run)

    model = None

    def __init__(
        self,
        path: str | None = None,
        corpus_path: str | None = None,
        cache_dir: str = ".cache/rag_experiments",
        threshold: float | None = None,
        auto_fit: bool = True,
        precision: str = "float32",
        embedder: Any = None,
    ) -> None:
        self.path = resolve_verifier(path, corpus_path, cache_dir, auto_fit)
        self.weights, self.manifest = load_verifier_dir(self.path)
        self.threshold = float(self.manifest.get("threshold", 0.5) if threshold is None else threshold)
        self.extractor = FeatureExtractor(embedder, precision=precision)
        self.identity = json.dumps(
            {
                "kind": "verifier",
                "fit_id": self.manifest["fit_id"],
                "weights_sha256": self.manifest["weights_sha256"],
                "threshold": self.threshold,
                "embedder": self.extractor.identity,
            },
            sort_keys=True,
        )

    @property
    def embedder(self):
        return self.extractor.heuristic.embedder

    def split(self, answer: str) -> list[str]:
        return split_claims(answer)

    def prepare(self, answers: list[str], contexts: list[str], progress: bool = False, desc: str = "", cache=None) -> None:
        """Encode a run's distinct claims and context sentences in one batched pass."""
        claims = [c for a in answers for c in self.split(a)]
        self.extractor.prepare(list(dict.fromkeys(claims)), list(contexts), progress, desc)

    def proba(self, claims: list[str], contexts: list[str]) -> np.ndarray:
        """P(supported) per (claim, context) pair."""
        if not claims:
            return np.zeros(0)
        return predict_logistic(self.weights, self.extractor.matrix(claims, contexts))

    def verdicts(self, claims: list[str], context: str) -> list[Verdict]:
        try:
            p = self.proba(list(claims), [context] * len(claims))
        except Exception as exc:  # noqa: BLE001 - a judge never raises per claim
            return [Verdict(c, "unparseable", error=f"{type(exc).__name__}: {exc}") for c in claims]
        return [
            Verdict(
                claim=c,
                label="supported" if pi >= self.threshold else "unsupported",
                score=float(pi),
                rationale=f"P(supported)={pi:.2f} (threshold {self.threshold:.2f})",
            )
            for c, pi in zip(claims, p, strict=True)
        ]

    def answer_relevance(self, query: str, answer: str) -> tuple[float, str]:
        return self.extractor.heuristic.answer_relevance(query, answer)
