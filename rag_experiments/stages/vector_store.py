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


class _RayEncoder:
    """A Ray Data actor: the embedder (its model loaded once per actor) over batches of texts."""

    def __init__(self, embedder) -> None:
        self.embedder = embedder

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        vecs = self.embedder.encode([str(t) for t in batch["text"]], kind="passage")
        return {"i": batch["i"], "vec": np.asarray(vecs, dtype=np.float32)}


def embed_to_memmap_ray(embedder, texts: list[str], path: Path, dtype: str, batch: int, concurrency: int):
    """``embed_to_memmap`` on a Ray cluster: ``map_batches`` over ``concurrency`` encoder actors.

    The texts go in as Arrow blocks of ``batch`` rows cut at the same offsets as the local path
    (0, batch, 2·batch …) and each block is one ``encode`` call, so every text is embedded in
    the same company as locally and the vectors are equal; rows are written back by index, in
    whatever order the actors finish. Ray is initialised here when it is not yet (``RAY_ADDRESS``
    or a local instance).
    """
    import pyarrow as pa
    import ray

    if not texts:
        raise ValueError("no texts to embed")
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        local = {} if address else {"include_dashboard": False}  # options only for a new instance
        ray.init(address=address, log_to_driver=False, **local)
    table = pa.table({"i": np.arange(len(texts), dtype=np.int64), "text": texts})
    ds = ray.data.from_arrow([table.slice(i, batch) for i in range(0, len(texts), batch)])
    ds = ds.map_batches(
        _RayEncoder, fn_constructor_args=(embedder,), batch_size=batch, concurrency=concurrency
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, out = _tmp(path), None
    for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
        if out is None:
            shape = (len(texts), b["vec"].shape[1])
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=DTYPES[dtype], shape=shape)
        out[b["i"]] = b["vec"]
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
        self,
        key: str,
        encode: Callable[[list[str]], np.ndarray],
        texts: list[str],
        dtype: str,
        batch: int,
        embedder=None,
    ) -> tuple[np.ndarray, bool]:
        """(the matrix memory-mapped read-only, whether it was already on disk).

        With an ``embedder`` whose ``ray_plan`` says so, a miss is embedded on Ray instead.
        """
        path = self._path("vectors_mm", key, ".npy")
        if path.exists():
            return np.load(path, mmap_mode="r"), True
        plan = getattr(embedder, "ray_plan", None)
        if plan is not None and plan.use_ray(len(texts)):
            return embed_to_memmap_ray(embedder, texts, path, dtype, batch, plan.concurrency), False
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
