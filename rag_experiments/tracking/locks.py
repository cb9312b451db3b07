"""File locks that order MLflow store access between processes on one host (``flock``: released
by the kernel when the process dies, kill -9 included)."""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
from pathlib import Path

from rag_experiments.tracking.lock_wait import acquire


def store_lock(uri: str) -> contextlib.AbstractContextManager:
    """Serialises the first touch of a store: two processes creating one fresh sqlite schema race
    on its migrations ("table already exists")."""
    from rag_experiments.core.cache import stable_hash

    return file_lock(
        Path(tempfile.gettempdir()) / "rag_experiments_locks" / f"store-{stable_hash(uri)[:16]}.lock"
    )


def host_lock(kind: str, what: str, *key: str) -> contextlib.AbstractContextManager:
    """A named ``file_lock`` for one host, ``<tmp>/rag_experiments_locks/<kind>-<hash(key)>.lock``
    (e.g. kind ``prompt``, key (store uri, prompt name))."""
    from rag_experiments.core.cache import stable_hash

    path = Path(tempfile.gettempdir()) / "rag_experiments_locks" / f"{kind}-{stable_hash(*key)[:16]}.lock"
    return file_lock(path, what)


@contextlib.contextmanager
def file_lock(path: Path, what: str = ""):
    """An exclusive ``flock`` on ``path``: released by the kernel when the process dies (kill -9).
    Waiting for it prints the holder (``tracking.lock_wait``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        acquire(f, path, what)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def config_lock(uri: str, experiment_id: str, chash: str) -> contextlib.AbstractContextManager:
    """One lock per (store, experiment, config_hash): the skip check and the run are atomic, so
    two identical sweeps started together run each config once (the second one skips it)."""
    from rag_experiments.core.cache import stable_hash

    key = stable_hash("config-lock", uri, experiment_id, chash)[:24]
    lock = Path(tempfile.gettempdir()) / "rag_experiments_locks" / f"{key}.lock"
    return file_lock(lock, f"config_hash {chash[:12]}")
