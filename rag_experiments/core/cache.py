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

Every entry is verified on read (``cache_files``): files carry the sha256 of their bytes in their
name, sqlite values a sha256 in a ``digest`` column. A bad entry is reported with its path, dropped
and recomputed, never used. A read-only cache serves its hits; misses are computed, not stored.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from rag_experiments.core.cache_files import (
    bad_entry,
    find_verified,
    is_writable,
    storage_error,
    write_verified,
)
from rag_experiments.core.identity import code_version
from rag_experiments.core.progress import Progress
from rag_experiments.core.types import Chunk


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


def chunks_mismatch(docs, chunks: list[Chunk]) -> str:
    """Why cached ``chunks`` are not spans of ``docs`` (``doc.text[start:end] == chunk.text``), or ""."""
    text = {d.doc_id: d.text for d in docs}
    for c in chunks:
        doc = text.get(c.doc_id)
        if doc is None:
            return f"chunk {c.chunk_id!r} names unknown doc_id {c.doc_id!r}"
        if doc[c.start : c.end] != c.text:
            return f"chunk {c.chunk_id!r} is not {c.doc_id}[{c.start}:{c.end}]"
    return ""


def _has_digest(conn: sqlite3.Connection) -> bool:
    """Whether the index has the ``digest`` column (older caches do not)."""
    cols = {r[1] for r in conn.execute("PRAGMA table_info(kv)")}
    return "digest" in cols or b"digest" in cols


class StageCache:
    """On-disk cache rooted at ``root``; ``enabled=False`` makes every lookup a miss."""

    def __init__(self, root: str | Path, enabled: bool = True) -> None:
        self.root = Path(root)
        self.enabled = enabled
        self.stats: Counter = Counter()  # "<stage>.hit" / "<stage>.miss"
        self._local = threading.local()
        self.writable = False
        if enabled:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError:
                pass  # a read-only parent: the cache may still exist and be read
            self.writable = is_writable(self.root)
        self._warned = False

    # ----------------------------------------------------------------- files
    def _dir(self, stage: str, key: str) -> Path:
        return self.root / stage / key[:2]

    def _can_write(self) -> bool:
        if self.enabled and not self.writable and not self._warned:
            self._warned = True
            print(
                f"[cache] {self.root} is read-only: cache hits are used, new results are computed "
                "but not stored",
                file=sys.stderr,
            )
        return self.enabled and self.writable

    def _count(self, stage: str, hit: bool) -> None:
        self.stats[f"{stage}.{'hit' if hit else 'miss'}"] += 1

    def _find(self, stage: str, key: str, suffix: str) -> Path | None:
        return find_verified(self._dir(stage, key), key, suffix, self.writable) if self.enabled else None

    def get_chunks(self, key: str, docs=None) -> list[Chunk] | None:
        """The cached chunks of ``key``; with ``docs``, only if each is ``doc.text[start:end]``."""
        path = self._find("chunks", key, ".parquet")
        chunks = None
        if path is not None:
            try:
                df = pd.read_parquet(path)
                chunks = [
                    Chunk(r.chunk_id, r.doc_id, int(r.start), int(r.end), r.text, json.loads(r.metadata))
                    for r in df.itertuples(index=False)
                ]
                if docs is not None and (why := chunks_mismatch(docs, chunks)):
                    raise ValueError(why)
            except Exception as e:  # noqa: BLE001 - any unreadable or wrong entry is a miss, named
                chunks = None
                bad_entry(path, e, self.writable)
        self._count("chunks", chunks is not None)
        return chunks

    def put_chunks(self, key: str, chunks: list[Chunk]) -> None:
        if not self._can_write():
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
        write_verified(self._dir("chunks", key), key, ".parquet", lambda p: df.to_parquet(p, index=False))

    def get_array(self, stage: str, key: str) -> dict[str, np.ndarray] | None:
        path = self._find(stage, key, ".npz")
        arrays = None
        if path is not None:
            try:
                with np.load(path, allow_pickle=False) as z:
                    arrays = {k: z[k] for k in z.files}
            except Exception as e:  # noqa: BLE001 - any unreadable entry is a miss, named
                bad_entry(path, e, self.writable)
        self._count(stage, arrays is not None)
        return arrays

    def put_array(self, stage: str, key: str, **arrays: np.ndarray) -> None:
        if not self._can_write():
            return

        def write(p: Path) -> None:
            with open(p, "wb") as f:
                np.savez(f, **arrays)

        write_verified(self._dir(stage, key), key, ".npz", write)

    # ----------------------------------------------------------------- sqlite key/value
    @property
    def db_path(self) -> Path:
        return self.root / "kv.sqlite"

    def _open_rw(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db_path, timeout=60)
        # WAL: readers never block the writer, so concurrent sweeps share one cache file;
        # synchronous=NORMAL keeps every committed batch across a process kill (not power loss)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS kv (stage TEXT, key TEXT, value TEXT, digest TEXT, "
            "PRIMARY KEY (stage, key))"
        )
        if not _has_digest(conn):
            conn.execute("ALTER TABLE kv ADD COLUMN digest TEXT")  # older rows: misses, recomputed
        conn.text_factory = bytes  # a flipped bit may make invalid UTF-8: decoded (and judged) by us
        return conn

    def _db(self) -> sqlite3.Connection | None:
        """This thread's connection; None for a read-only cache without a usable index."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        if self.writable:
            try:
                conn = self._open_rw()
            except sqlite3.OperationalError as e:
                raise storage_error(OSError(0, str(e)), self.db_path, "cache index") from e
            except sqlite3.DatabaseError as e:  # not a database / malformed: set aside, start anew
                self._quarantine(e)
                conn = self._open_rw()
        elif self.db_path.exists():  # read-only: no WAL files can be created, nothing changes
            conn = self._open_ro()
            conn.text_factory = bytes
            try:
                if not _has_digest(conn):
                    return None
            except sqlite3.DatabaseError as e:
                print(f"[cache] corrupt index {self.db_path} ({e}): not used (read-only)", file=sys.stderr)
                return None
        self._local.conn = conn
        return conn

    def _open_ro(self) -> sqlite3.Connection:
        """A read-only connection: through the WAL a writer left (its -shm must exist), else as an
        immutable file (no -wal/-shm needed on a read-only mount)."""
        wal = self.db_path.with_name(self.db_path.name + "-wal")
        if wal.exists() and wal.stat().st_size:
            conn = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True)
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                return conn
            except sqlite3.OperationalError:
                conn.close()
                print(
                    f"[cache] {wal} cannot be read (read-only, no -shm): its entries are misses",
                    file=sys.stderr,
                )
        return sqlite3.connect(f"file:{self.db_path}?mode=ro&immutable=1", uri=True)

    def close(self) -> None:
        """Close this thread's connection to the index (others close with their threads)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _quarantine(self, e: Exception) -> None:
        """Move a corrupt index (and its WAL files) aside: reported, its entries recomputed."""
        self.close()
        aside = self.db_path.with_name(f"kv.sqlite.corrupt-{os.getpid()}")
        print(
            f"[cache] corrupt index {self.db_path} ({e}): moved to {aside}; its entries are recomputed",
            file=sys.stderr,
        )
        for ext in ("", "-wal", "-shm"):
            src = self.db_path.with_name(self.db_path.name + ext)
            if src.exists():
                os.replace(src, aside.with_name(aside.name + ext))

    @staticmethod
    def _digest(stage: str, key: str, value: str) -> str:
        """sha256 of (stage, key, value): a changed value or a value under another key is caught."""
        return hashlib.sha256(f"{stage}\0{key}\0{value}".encode()).hexdigest()[:32]

    def _select(self, stage: str, keys: list[str]) -> list[tuple[str, str, str | None]]:
        db = self._db()
        if db is None:
            return []
        rows = []
        for i in range(0, len(keys), 500):
            batch = keys[i : i + 500]
            q = f"SELECT key, value, digest FROM kv WHERE stage=? AND key IN ({','.join('?' * len(batch))})"
            rows += db.execute(q, [stage, *batch]).fetchall()
        return rows

    def get_json_many(self, stage: str, keys: list[str]) -> dict[str, Any]:
        """Values found for ``keys`` (missing keys are absent); counts hits and misses.

        A value whose digest does not match is reported, deleted and left out (a miss)."""
        found: dict[str, Any] = {}
        if self.enabled and keys:
            try:
                rows = self._select(stage, keys)
            except sqlite3.OperationalError:
                raise
            except sqlite3.DatabaseError as e:  # corrupt pages: the whole index is set aside
                if not self.writable:
                    raise storage_error(OSError(0, f"corrupt ({e})"), self.db_path, "cache index") from e
                self._quarantine(e)
                rows = []
            bad = []
            for raw_k, raw_v, raw_digest in rows:
                if raw_digest is None:
                    continue  # written before digests existed: recomputed
                k = raw_k.decode("utf-8", "replace")
                try:
                    v, digest = raw_v.decode("utf-8"), raw_digest.decode("utf-8")
                    if digest != self._digest(stage, k, v):
                        raise ValueError(f"digest {digest} does not match the value")
                    found[k] = json.loads(v)
                except (ValueError, TypeError, AttributeError) as e:  # UnicodeDecodeError is a ValueError
                    bad.append(k)
                    print(
                        f"[cache] corrupt entry {self.db_path} [{stage}/{k}]: {e}; recomputing",
                        file=sys.stderr,
                    )
            if bad and self.writable:
                with self._db() as db:
                    db.executemany("DELETE FROM kv WHERE stage=? AND key=?", [(stage, k) for k in bad])
        self.stats[f"{stage}.hit"] += len(found)
        self.stats[f"{stage}.miss"] += len(set(keys)) - len(found)
        return found

    def put_json_many(self, stage: str, items: dict[str, Any]) -> None:
        """Store and commit ``items`` now: a killed run keeps every batch put before the kill."""
        if not (items and self._can_write()):
            return
        rows = []
        for k, v in items.items():
            text = json.dumps(v, ensure_ascii=False)
            rows.append((stage, k, text, self._digest(stage, k, text)))
        db = self._db()
        try:
            with db:
                db.executemany(
                    "INSERT OR REPLACE INTO kv (stage, key, value, digest) VALUES (?, ?, ?, ?)", rows
                )
        except sqlite3.OperationalError as e:
            if "full" in str(e) or "readonly" in str(e):
                raise storage_error(OSError(0, str(e)), self.db_path, "cache index") from e
            raise

    def get_vectors(self, identity: str, texts: list[str], kind: str = "passage") -> dict[str, np.ndarray]:
        """The vectors of ``texts`` by embedder ``identity`` found in the cache (stage ``text_vectors``:
        one sqlite row per text, its bytes and dtype), for embedders asked a few texts at a time in
        changing sets across runs (the heuristic judge's claims and context sentences), where the
        block files of :class:`CachedEmbedder` would never hit."""
        keys = _text_vector_keys(identity, kind, texts)
        found = self.get_json_many("text_vectors", list(keys.values()))
        out = {}
        for t, k in keys.items():
            if k in found:
                v = found[k]
                out[t] = np.frombuffer(base64.b64decode(v["b64"]), dtype=np.dtype(v["dtype"])).copy()
        return out

    def put_vectors(self, identity: str, texts: list[str], vectors: np.ndarray, kind: str = "passage") -> None:
        """Store each text's vector (:meth:`get_vectors`); a NaN vector is never stored."""
        keys = _text_vector_keys(identity, kind, texts)
        self.put_json_many("text_vectors", {
            keys[t]: {"dtype": np.asarray(v).dtype.str, "b64": base64.b64encode(np.asarray(v).tobytes()).decode()}
            for t, v in zip(texts, vectors, strict=True) if np.isfinite(v).all()
        })  # fmt: skip


def _text_vector_keys(identity: str, kind: str, texts: list[str]) -> dict[str, str]:
    version = code_version("vectors")  # once, not per text: stage_key's per-call code check is ~20 stats
    return {t: stable_hash("text_vectors", version, identity, kind, t) for t in dict.fromkeys(texts)}


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
        self.miss_reason = self._identity_change(getattr(embedder, "identity_name", None))

    def _identity_change(self, name: str | None) -> str:
        """Why the vectors of an endpoint named ``name`` miss the cache: the identity it had the
        last time this cache saw it differs (another model answers under the same name). Warned
        once here, "" when unchanged or never seen (an endpoint embedder's ``identity_name``)."""
        if not name:
            return ""
        key = stable_hash("embedder-identity", name)
        was = self.cache.get_json_many("embedder_identity", [key]).get(key)
        if was == self.identity:
            return ""
        self.cache.put_json_many("embedder_identity", {key: self.identity})
        if was is None:
            return ""
        why = (f"vector cache: every vector of {name} misses: it now answers with identity {self.identity} "
               f"(was {was}): another model behind the same name, so its vectors are embedded anew")  # fmt: skip
        print(f"[cache] {why}", file=sys.stderr)
        return why

    def encode(self, texts: list[str], kind: str = "passage") -> np.ndarray:
        blocks = [texts[i : i + self.block] for i in range(0, len(texts), self.block)] or [texts]
        keys = [stage_key("vectors", self.identity, kind, part) for part in blocks]
        hits = [self.cache.get_array("vectors", key) for key in keys]
        todo = sum(len(part) for part, hit in zip(blocks, hits, strict=True) if hit is None)
        out = []
        # a start line as soon as there is real work (one block of MiniLM can take a minute), a
        # line per block with its ETA when there are several
        show = self.progress and todo >= 256
        with Progress(f"embedding {kind}s", todo, enabled=show, unit="texts") as bar:
            for part, key, hit in zip(blocks, keys, hits, strict=True):
                if hit is not None:
                    v = hit["v"]
                else:
                    v = encode_counted(self.inner, part, kind, bar)  # the line moves per model batch
                    if not np.isfinite(v).all():  # a NaN is an error, never a vector (nor cached)
                        bad = int((~np.isfinite(v).all(axis=1)).sum()) if v.ndim == 2 else len(part)
                        raise ValueError(f"embedding: the model returned NaN/inf vectors for {bad} of {len(part)} texts")
                    self.cache.put_array("vectors", key, v=v)
                out.append(v)
        return out[0] if len(out) == 1 else np.concatenate(out)


def encode_counted(inner, texts: list[str], kind: str, bar: Progress) -> np.ndarray:
    """``inner.encode(texts, kind=kind)``, moving ``bar`` per model batch when ``inner`` runs a
    torch model (sentence-transformers: one block of MiniLM can take a minute, issue 36), else
    once at the end. The forward hook only counts, so the vectors are those of a call without it."""
    done = [0]

    def hook(_module, _args, out) -> None:
        try:
            n = len(out["sentence_embedding"])
        except (KeyError, TypeError):  # another model's output: counted at the end instead
            return
        done[0] += n
        bar.update(n)

    # ``model`` of a sentence-transformers embedder loads it, as encode would; an endpoint's is a name
    register = getattr(getattr(inner, "model", None), "register_forward_hook", None) if texts else None
    handle = register(hook) if callable(register) else None
    try:
        v = inner.encode(texts, kind=kind)
    finally:
        if handle is not None:
            handle.remove()
    bar.update(max(len(texts) - done[0], 0))
    return v


class EmbedProgress:
    """The progress line of embedding ``total`` texts through ``inner`` in calls of :meth:`encode`
    (the dense retriever's vector memmap, ``stages.vector_store``), opened at the first call (a
    cached matrix prints nothing); a context manager whose exit says how the block ended."""

    def __init__(self, inner, total: int, enabled: bool, kind: str = "passage") -> None:
        self.inner, self.total, self.enabled, self.kind = inner, total, enabled, kind
        self.bar: Progress | None = None

    def encode(self, texts: list[str]) -> np.ndarray:
        if self.bar is None:
            self.bar = Progress(f"embedding {self.kind}s", self.total, self.enabled, unit="texts")
        return encode_counted(self.inner, texts, self.kind, self.bar)

    def __enter__(self) -> EmbedProgress:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.bar is not None:
            self.bar.__exit__(exc_type, exc, tb)
