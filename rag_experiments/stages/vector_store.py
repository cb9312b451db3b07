"""Passage vectors on disk, streamed in batches, and the ANN indexes built from them.

Large corpora do not fit the in-memory path (one ``encode`` call over every chunk, one float32
matrix): here texts are embedded ``batch`` at a time straight into a memory-mapped ``.npy``
file, so peak memory is one batch of vectors whatever the corpus size, and search reads the
matrix block by block. Files are content-addressed like the rest of the stage cache
(``docs/scale.md``): vectors by (embedder identity, texts, dtype), an index by (vectors key,
index parameters); writes go to a temp file renamed into place, so parallel workers can share them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rag_experiments.cache import stage_key

DTYPES = {"float32": np.float32, "float16": np.float16}


def vectors_key(embedder_identity: str, texts: list[str], dtype: str) -> str:
    """sha256 of (embedder identity, the texts, storage dtype): what determines the matrix."""
    return stage_key("vectors", "memmap", embedder_identity, texts, dtype)


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def embed_to_memmap(
    encode: Callable[[list[str]], np.ndarray], texts: list[str], path: Path, dtype: str, batch: int
) -> np.ndarray:
    """Embed ``texts`` ``batch`` at a time into an ``.npy`` at ``path``; returns it memory-mapped.

    The file appears only when complete (temp file + rename): an interrupted run leaves no
    half-written matrix for the next one to trust.
    """
    if not texts:
        raise ValueError("no texts to embed")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    first = np.asarray(encode(texts[:batch]))
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=DTYPES[dtype], shape=(len(texts), first.shape[1]))
    out[: len(first)] = first
    for i in range(len(first), len(texts), batch):
        out[i : i + batch] = encode(texts[i : i + batch])
    out.flush()
    del out
    os.replace(tmp, path)
    return np.load(path, mmap_mode="r")


class VectorStore:
    """Memory-mapped passage matrices under ``root/vectors_mm`` and FAISS indexes under ``root/ann``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, stage: str, key: str, suffix: str) -> Path:
        return self.root / stage / key[:2] / f"{key}{suffix}"

    def vectors(
        self, key: str, encode: Callable[[list[str]], np.ndarray], texts: list[str], dtype: str, batch: int
    ) -> tuple[np.ndarray, bool]:
        """(the matrix memory-mapped read-only, whether it was already on disk)."""
        path = self._path("vectors_mm", key, ".npy")
        if path.exists():
            return np.load(path, mmap_mode="r"), True
        return embed_to_memmap(encode, texts, path, dtype, batch), False

    def index(self, key: str, build: Callable[[], object]):
        """The FAISS index stored under ``key``, built by ``build()`` and written once on a miss."""
        import faiss

        path = self._path("ann", key, ".faiss")
        if path.exists():
            return faiss.read_index(str(path)), True
        index = build()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _tmp(path)
        faiss.write_index(index, str(tmp))
        os.replace(tmp, path)
        return index, False


def build_faiss(kind: str, matrix: np.ndarray, params: dict, batch: int = 65536):
    """A FAISS inner-product index over ``matrix`` (normalised rows: inner product = cosine).

    ``faiss_hnsw``: HNSW graph (``hnsw_m`` links, ``ef_construction``). ``faiss_ivf``: inverted
    lists over ``ivf_nlist`` k-means cells (0 = 4·√n), trained on at most 64 points per cell.
    Rows are added ``batch`` at a time, so a float16 memmap is converted one batch at a time.
    """
    import faiss

    n, d = matrix.shape
    if kind == "faiss_hnsw":
        index = faiss.IndexHNSWFlat(d, int(params["hnsw_m"]), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = int(params["ef_construction"])
    elif kind == "faiss_ivf":
        nlist = int(params["ivf_nlist"]) or max(1, int(4 * np.sqrt(n)))
        nlist = min(nlist, n)
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(0)  # fixed sample: the same vectors give the same cells
        train = np.sort(rng.choice(n, size=min(n, 64 * nlist), replace=False))
        index.train(np.ascontiguousarray(matrix[train], dtype=np.float32))
    else:
        raise ValueError(f"unknown index kind {kind!r}")
    for i in range(0, n, batch):
        index.add(np.ascontiguousarray(matrix[i : i + batch], dtype=np.float32))
    return index
