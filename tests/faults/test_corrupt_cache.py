"""A corrupted stage cache never gives silently wrong metrics: single-bit flips at sampled
positions of every cached file kind (chunks parquet, rankings and token npz, the memory-mapped
vectors, the FAISS index, the sqlite values), truncation and garbage are each detected (reported
with the file's path, dropped, recomputed) or harmless, and the metrics equal a clean run's.
Before, 107 of 178 flips in a chunks parquet read back changed without error."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from rag_experiments.core.cache import CachedEmbedder, StageCache
from rag_experiments.core.types import Chunk
from rag_experiments.stages.embedding import SentenceTransformerEmbedder
from rag_experiments.stages.retrieval import DenseRetriever
from tests.sweep_helpers import tiny_inputs, tiny_pipeline

FLIPS_PER_FILE = 8


def _flip(path: Path, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(data))


def _bits(path: Path, n: int, seed: int) -> list[int]:
    """``n`` bit positions: the first and last byte, and seeded samples in between."""
    size = path.stat().st_size * 8
    rng = random.Random(seed)
    return sorted({0, size - 1, *(rng.randrange(size) for _ in range(n - 2))})


def _restore(db: Path, data: bytes) -> None:
    for side in ("-wal", "-shm"):
        db.with_name(db.name + side).unlink(missing_ok=True)
    db.write_bytes(data)


def _entries(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.rglob(pattern) if not p.name.startswith("."))


def _metrics(res) -> str:
    """The run's aggregates as canonical JSON (NaN equals NaN), without timings."""
    agg = res.aggregates
    return json.dumps({k: v for k, v in agg.items() if "latency" not in k}, sort_keys=True)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A tiny BM25 run and its cache: the reference metrics."""
    root = tmp_path_factory.mktemp("corrupt")
    inputs = tiny_inputs(root, 6)
    return root, inputs, _metrics(tiny_pipeline(inputs))


@pytest.mark.parametrize("pattern", ["chunks/**/*.parquet", "rankings/**/*.npz", "chunk_tokens/**/*.npz"])
def test_every_bit_flip_is_detected_and_the_metrics_do_not_change(pattern, clean, capfd):
    root, (corpus, items, _), want = clean
    (entry,) = _entries(root / "cache", pattern)
    for seed, bit in enumerate(_bits(entry, FLIPS_PER_FILE, len(pattern))):
        original = entry.read_bytes()
        _flip(entry, bit)
        cache = StageCache(root / "cache")
        got = _metrics(tiny_pipeline((corpus, items, cache)))
        err = capfd.readouterr().err
        assert f"[cache] corrupt entry {entry}" in err, f"bit {bit} of {entry.name} not reported: {err}"
        assert got == want, f"bit {bit} of {entry.name} changed the metrics"
        (again,) = _entries(root / "cache", pattern)  # dropped and written anew, identical
        assert again.read_bytes() == original, seed


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_truncated_or_garbage_entries_are_named_and_recomputed(damage, clean, capfd):
    root, (corpus, items, _), want = clean
    for entry in _entries(root / "cache", "*.np[zy]") + _entries(root / "cache", "*.parquet"):
        data = entry.read_bytes()
        entry.write_bytes(
            {"truncate": data[: len(data) // 2], "garbage": b"\x93NUMPY garbage" * 40, "empty": b""}[damage]
        )
    got = _metrics(tiny_pipeline((corpus, items, StageCache(root / "cache"))))
    err = capfd.readouterr().err
    assert got == want
    assert "allow_pickle" not in err and "Traceback" not in err
    assert err.count("[cache] corrupt entry") == 3, err


def test_chunks_that_are_not_spans_of_their_document_are_recomputed(clean, capfd):
    # a well-formed entry with the right digest but wrong content (e.g. written by a buggy chunker)
    root, (corpus, items, _), want = clean
    cache = StageCache(root / "cache")
    (entry,) = _entries(root / "cache", "chunks/**/*.parquet")
    key = entry.name.split(".")[0]
    chunks = cache.get_chunks(key)
    shifted = [Chunk(c.chunk_id, c.doc_id, c.start + 1, c.end + 1, c.text, c.metadata) for c in chunks]
    entry.unlink()
    cache.put_chunks(key, shifted)
    got = _metrics(tiny_pipeline((corpus, items, StageCache(root / "cache"))))
    err = capfd.readouterr().err
    assert "[cache] corrupt entry" in err and "is not" in err and got == want


def test_sqlite_values_flipped_are_never_returned(tmp_path, capfd):
    values = {f"k{i}": {"text": f"answer number {i} " * 20, "n": i} for i in range(40)}
    StageCache(tmp_path).put_json_many("generations", values)
    db = tmp_path / "kv.sqlite"
    with sqlite3.connect(db) as c:  # fold the WAL into the file: the flips hit the real pages
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    clean = db.read_bytes()
    wrong = 0
    for bit in _bits(db, 24, 7):
        _restore(db, clean)
        _flip(db, bit)
        cache = StageCache(tmp_path)
        got = cache.get_json_many("generations", list(values))
        cache.close()
        wrong += sum(got[k] != values[k] for k in got)
        for f in tmp_path.glob("kv.sqlite.corrupt-*"):
            f.unlink()
    assert wrong == 0
    # a value changed in place (valid page, wrong text) is named and dropped
    _restore(db, clean)
    with sqlite3.connect(db) as c:
        c.execute("UPDATE kv SET value = replace(value, 'number 3 ', 'number 8 ') WHERE key='k3'")
    capfd.readouterr()
    got = StageCache(tmp_path).get_json_many("generations", list(values))
    assert "k3" not in got and len(got) == 39
    assert f"[cache] corrupt entry {db} [generations/k3]" in capfd.readouterr().err
    # a garbage index is moved aside, named, and the cache works on
    db.write_bytes(b"not a database" * 100)
    cache = StageCache(tmp_path)
    assert cache.get_json_many("generations", ["k1"]) == {}
    cache.put_json_many("generations", {"k1": values["k1"]})
    assert cache.get_json_many("generations", ["k1"]) == {"k1": values["k1"]}
    assert f"corrupt index {db}" in capfd.readouterr().err


@pytest.mark.parametrize("index", ["exact", "faiss_hnsw"])
def test_vector_file_and_ann_index_flips_are_detected(index, clean, tmp_path, capfd):
    _, (corpus, _, _), _ = clean
    from rag_experiments.stages.chunking import MarkdownChunker, chunk_corpus

    chunks = chunk_corpus(MarkdownChunker(), corpus.docs)[:12]  # each detected flip re-embeds them
    queries = ["how are webhooks retried", "refund window"]

    embedder = SentenceTransformerEmbedder(max_seq_length=64, show_progress=False)  # loaded once

    def rank():
        ret = DenseRetriever(CachedEmbedder(embedder, StageCache(tmp_path)), index=index)
        ret.index(chunks)
        return ret.search(queries, 5)

    want_i, want_s = rank()
    kinds = ["vectors_mm/**/*.npy"] + (["ann/**/*.faiss"] if index != "exact" else [])
    for pattern in kinds:
        (first,) = _entries(tmp_path, pattern)
        for bit in _bits(first, 4, 3):
            (f,) = _entries(tmp_path, pattern)
            _flip(f, bit)
            got_i, got_s = rank()
            assert f"[cache] corrupt entry {f}" in capfd.readouterr().err, (f.name, bit)
            assert np.array_equal(got_i, want_i) and np.allclose(got_s, want_s)


def test_a_whole_run_finishes_with_the_same_metrics_after_a_flip(clean, capfd):
    root, (corpus, items, _), want = clean
    for entry in _entries(root / "cache", "*.parquet") + _entries(root / "cache", "*.npz"):
        _flip(entry, entry.stat().st_size * 4)  # a bit in the middle of each file
    got = _metrics(tiny_pipeline((corpus, items, StageCache(root / "cache"))))
    assert got == want and capfd.readouterr().err.count("[cache] corrupt entry") == 3
