"""Content-addressed stage cache (``docs/identity.md``).

Each stage's output is stored under a key (:func:`stage_key`) that hashes exactly what it depends
on, plus the version of the code that computes it (``identity.code_version``):

- chunks      ← (corpus digest, chunker config)                       parquet
- vectors     ← (embedder identity, the texts embedded)               npy
- rankings    ← (retriever identity, chunks key, queries, depth)      npz (allow_pickle=False)
- generations ← (generator identity, rendered prompt)                 sqlite (json values)
- verdicts    ← (judge identity, claim, context)                      sqlite (json values)

Vectors are stored per block of texts and the sqlite values per small batch, each committed as it
completes: a killed run loses only the work in flight.

Writes are atomic (temp file + rename) and the sqlite store uses WAL with a busy timeout, so
parallel workers (Hydra's joblib launcher) can share one cache. No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rag_experiments.identity import code_version
from rag_experiments.progress import Progress
from rag_experiments.types import Chunk


def stable_hash(*parts: Any) -> str:
    """sha256 of the canonical JSON of ``parts`` (sorted keys, no whitespace)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def stage_key(stage: str, *parts: Any) -> str:
    """Cache key of ``stage``: ``stable_hash(stage, code_version(stage), *parts)``.

    The code version makes a changed chunker, embedder, retriever, generator or judge a miss
    instead of serving results its old code computed.
    """
    return stable_hash(stage, code_version(stage), *parts)


class StageCache:
    """On-disk cache rooted at ``root``; ``enabled=False`` makes every lookup a miss."""

    def __init__(self, root: str | Path, enabled: bool = True) -> None:
        self.root = Path(root)
        self.enabled = enabled
        self.stats: Counter = Counter()  # "<stage>.hit" / "<stage>.miss"
        self._local = threading.local()
        if enabled:
            self.root.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------- files
    def _path(self, stage: str, key: str, suffix: str) -> Path:
        return self.root / stage / key[:2] / f"{key}{suffix}"

    def _atomic(self, path: Path, write) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        write(tmp)
        os.replace(tmp, path)

    def _count(self, stage: str, hit: bool) -> None:
        self.stats[f"{stage}.{'hit' if hit else 'miss'}"] += 1

    def get_chunks(self, key: str) -> list[Chunk] | None:
        path = self._path("chunks", key, ".parquet")
        if not (self.enabled and path.exists()):
            self._count("chunks", False)
            return None
        self._count("chunks", True)
        df = pd.read_parquet(path)
        return [
            Chunk(r.chunk_id, r.doc_id, int(r.start), int(r.end), r.text, json.loads(r.metadata))
            for r in df.itertuples(index=False)
        ]

    def put_chunks(self, key: str, chunks: list[Chunk]) -> None:
        if not self.enabled:
            return
        df = pd.DataFrame(
            {
                "chunk_id": [c.chunk_id for c in chunks],
                "doc_id": [c.doc_id for c in chunks],
                "start": [c.start for c in chunks],
                "end": [c.end for c in chunks],
                "text": [c.text for c in chunks],
                "metadata": [json.dumps(c.metadata, sort_keys=True) for c in chunks],
            }
        )
        self._atomic(self._path("chunks", key, ".parquet"), lambda p: df.to_parquet(p, index=False))

    def get_array(self, stage: str, key: str) -> dict[str, np.ndarray] | None:
        path = self._path(stage, key, ".npz")
        if not (self.enabled and path.exists()):
            self._count(stage, False)
            return None
        self._count(stage, True)
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}

    def put_array(self, stage: str, key: str, **arrays: np.ndarray) -> None:
        if not self.enabled:
            return

        def write(p: Path) -> None:
            with open(p, "wb") as f:
                np.savez(f, **arrays)

        self._atomic(self._path(stage, key, ".npz"), write)

    # ----------------------------------------------------------------- sqlite key/value
    def _db(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.root / "kv.sqlite", timeout=60)
            # WAL: readers never block the writer, so concurrent sweeps share one cache file;
            # synchronous=NORMAL keeps every committed batch across a process kill (not power loss)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS kv (stage TEXT, key TEXT, value TEXT, PRIMARY KEY (stage, key))"
            )
            self._local.conn = conn
        return conn

    def get_json_many(self, stage: str, keys: list[str]) -> dict[str, Any]:
        """Values found for ``keys`` (missing keys are absent); counts hits and misses."""
        found: dict[str, Any] = {}
        if self.enabled and keys:
            db = self._db()
            for i in range(0, len(keys), 500):
                batch = keys[i : i + 500]
                q = f"SELECT key, value FROM kv WHERE stage=? AND key IN ({','.join('?' * len(batch))})"
                for k, v in db.execute(q, [stage, *batch]):
                    found[k] = json.loads(v)
        self.stats[f"{stage}.hit"] += len(found)
        self.stats[f"{stage}.miss"] += len(set(keys)) - len(found)
        return found

    def put_json_many(self, stage: str, items: dict[str, Any]) -> None:
        """Store and commit ``items`` now: a killed run keeps every batch put before the kill."""
        if not (self.enabled and items):
            return
        db = self._db()
        with db:
            db.executemany(
                "INSERT OR REPLACE INTO kv (stage, key, value) VALUES (?, ?, ?)",
                [(stage, k, json.dumps(v, ensure_ascii=False)) for k, v in items.items()],
            )


class CachedEmbedder:
    """Wraps an embedder: texts are embedded in blocks of ``block`` and each block kept as npy.

    A block is committed as soon as it is embedded, so a killed run re-embeds at most one block
    (about 30 s of MiniLM on 2 cores), and the progress line (``progress``) moves per block. A list
    of at most ``block`` texts is one block, keyed and embedded exactly as a whole-list call, so the
    bundled sample's vectors (under 1,000 chunks for every chunker) are bit-identical to before.
    """

    block = 1024

    def __init__(self, embedder, cache: StageCache, progress: bool = True) -> None:
        self.inner = embedder
        self.cache = cache
        self.identity = embedder.identity
        self.progress = progress
        if hasattr(embedder, "show_progress"):  # our per-block line replaces the library's bar
            embedder.show_progress = False

    def encode(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        blocks = [texts[i : i + self.block] for i in range(0, len(texts), self.block)] or [texts]
        out = []
        show = self.progress and len(blocks) > 1
        with Progress(f"embedding {kind}s", len(texts), enabled=show, unit="texts") as bar:
            for part in blocks:
                key = stage_key("vectors", self.identity, kind, part)
                hit = self.cache.get_array("vectors", key)
                if hit is not None:
                    v = hit["v"]
                else:
                    v = self.inner.encode(part, kind=kind)
                    self.cache.put_array("vectors", key, v=v)
                out.append(v)
                bar.update(len(part))
        return out[0] if len(out) == 1 else np.concatenate(out)
