"""Passage vectors on disk, streamed in batches, and the ANN indexes built from them.

Large corpora do not fit the in-memory path (one ``encode`` call over every chunk, one float32
matrix): here texts are embedded ``batch`` at a time straight into a memory-mapped ``.npy``
file, so peak memory is one batch of vectors whatever the corpus size, and search reads the
matrix block by block. Files are content-addressed like the rest of the stage cache
(``docs/scale.md``): vectors by (embedder identity, texts, dtype), an index by (vectors key,
index parameters); writes go to a temp file renamed into place, so parallel workers can share them.
Each file carries the sha256 of its bytes in its name and is verified on read (``cache_files``);
the vector file is preallocated, so a full disk is a ``StorageError`` naming it, never a SIGBUS.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rag_experiments.core.cache import stage_key
from rag_experiments.core.cache_files import (
    bad_entry,
    file_digest,
    find_verified,
    is_writable,
    preallocate,
    storage_error,
    tmp_path,
    write_verified,
)

DTYPES = {"float32": np.float32, "float16": np.float16}


def vectors_key(embedder_identity: str, texts: list[str], dtype: str) -> str:
    """sha256 of (embedder identity, the texts, storage dtype): what determines the matrix."""
    return stage_key("vectors", "memmap", embedder_identity, texts, dtype)


def _open_preallocated(tmp: Path, dtype: str, shape: tuple[int, int]) -> np.memmap:
    """A new ``.npy`` memmap at ``tmp`` with all its blocks reserved (ENOSPC raised here)."""
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=DTYPES[dtype], shape=shape)
    preallocate(tmp, os.path.getsize(tmp))
    return out


def _publish(path: Path) -> Path:
    """Rename the finished ``{key}.npy`` to ``{key}.{digest}.npy``, the name readers verify."""
    key = path.name[: -len(".npy")]
    try:
        final = path.with_name(f"{key}.{file_digest(path)}.npy")
        os.replace(path, final)
        return final
    except FileNotFoundError:  # a parallel worker published the same vectors a moment before
        found = find_verified(path.parent, key, ".npy", True, memo=True)
        if found is None:
            raise
        return found


def _fill_memmap(tmp: Path, path: Path, fill: Callable[[Path], None]) -> np.ndarray:
    """``fill(tmp)`` then rename it to ``path``; any error removes ``tmp``, a full disk names the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fill(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise storage_error(e, path, "vector file") from e
        raise
    return np.load(path, mmap_mode="r")


def embed_to_memmap(
    encode: Callable[[list[str]], np.ndarray], texts: list[str], path: Path, dtype: str, batch: int
) -> np.ndarray:
    """Embed ``texts`` ``batch`` at a time into an ``.npy`` for ``path``; returns it memory-mapped.

    The file appears only when complete (temp file + rename): an
    interrupted run leaves no half-written matrix for the next one to trust. Its blocks are
    reserved before the first write (``posix_fallocate``): a full disk raises ``StorageError``
    naming the file and the temp file is removed.
    """
    if not texts:
        raise ValueError("no texts to embed")

    def fill(tmp: Path) -> None:
        first = np.asarray(encode(texts[:batch]))
        out = _open_preallocated(tmp, dtype, (len(texts), first.shape[1]))
        out[: len(first)] = first
        for i in range(len(first), len(texts), batch):
            out[i : i + batch] = encode(texts[i : i + batch])
        out.flush()
        del out

    return _fill_memmap(tmp_path(path), path, fill)


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

    def fill(tmp: Path) -> None:
        out = None
        for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
            if out is None:
                out = _open_preallocated(tmp, dtype, (len(texts), b["vec"].shape[1]))
            out[b["i"]] = b["vec"]
        out.flush()
        del out

    return _fill_memmap(tmp_path(path), path, fill)


class VectorStore:
    """Memory-mapped passage matrices under ``root/vectors_mm`` and FAISS indexes under ``root/ann``."""

    def __init__(self, root: str | Path, writable: bool = True) -> None:
        self.root = Path(root)
        # writable=False: the stage cache is read-only (a dry run's: placeholder vectors never stored)
        self.writable = writable and is_writable(self.root)

    def _path(self, stage: str, key: str, suffix: str) -> Path:
        return self.root / stage / key[:2] / f"{key}{suffix}"

    def _find(self, stage: str, key: str, suffix: str) -> Path | None:
        """The verified file of ``key`` (vectors: verified once per process while unchanged)."""
        path = self._path(stage, key, suffix)
        return find_verified(path.parent, key, suffix, self.writable, memo=stage == "vectors_mm")

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
        found = self._find("vectors_mm", key, ".npy")
        if found is not None:
            try:
                m = np.load(found, mmap_mode="r", allow_pickle=False)
                if m.ndim == 2 and m.shape[0] == len(texts):
                    return m, True
                raise ValueError(f"shape {m.shape}, expected {len(texts)} rows")
            except Exception as e:  # noqa: BLE001 - an unloadable entry is a miss, named
                bad_entry(found, e, self.writable)
        path = self._path("vectors_mm", key, ".npy")
        if not self.writable:  # read-only cache: computed in memory, not stored
            return np.asarray(encode(texts), dtype=DTYPES[dtype]), False
        plan = getattr(embedder, "ray_plan", None)
        if plan is not None and plan.use_ray(len(texts)):
            embed_to_memmap_ray(embedder, texts, path, dtype, batch, plan.concurrency)
        else:
            embed_to_memmap(encode, texts, path, dtype, batch)
        return np.load(_publish(path), mmap_mode="r"), False

    def index(self, key: str, build: Callable[[], object]):
        """The FAISS index stored under ``key``, built by ``build()`` and written once on a miss."""
        import faiss

        found = self._find("ann", key, ".faiss")
        if found is not None:
            try:
                return faiss.read_index(str(found)), True
            except Exception as e:  # noqa: BLE001 - an unloadable entry is a miss, named
                bad_entry(found, e, self.writable)
        index = build()
        if self.writable:
            path = self._path("ann", key, ".faiss")
            write_verified(path.parent, key, ".faiss", lambda p: faiss.write_index(index, str(p)))
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
