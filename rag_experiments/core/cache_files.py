"""Stage-cache files that are verified on read, written atomically, and fail loudly on a full disk.

- **Verified.** A cache file is named ``{key}.{digest}{suffix}``: ``digest`` is the first 32 hex
  digits of the sha256 of its bytes, computed from the temp file before it is renamed into place
  (one rename: name and content appear together). :func:`find_verified` re-hashes the file on read;
  a file whose bytes no longer match its name (a flipped bit, a truncation, garbage) is reported
  on stderr with its path, deleted when the cache is writable, and treated as a miss, so the stage
  recomputes it. The same holds for a file that hashes right but does not parse (:func:`bad_entry`).
- **Atomic.** :func:`write_atomic` writes a temp file next to the target and renames it; on any
  error the temp file is removed.
- **Disk full.** ``ENOSPC``/``EDQUOT``/``EROFS`` while writing become :class:`StorageError`
  (an infrastructure error: exit 2) naming the path. Memory-mapped outputs are preallocated with
  ``posix_fallocate`` (:func:`preallocate`), so a full disk is an error before the first byte is
  written instead of a SIGBUS on a page fault of a sparse file.

Hashing costs one sequential read of the file (sha256 ≈ 0.2 s per 150 MB on one core, e.g. the
vectors of 100k chunks); memory-mapped vector files are verified once per process and file
(:func:`find_verified` with ``memo``). Figures: ``docs/architecture.md``, "Stage cache integrity".
"""

from __future__ import annotations

import errno
import hashlib
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

DIGEST_LEN = 32
_VERIFIED: set[tuple[str, int, int]] = set()  # (path, size, mtime_ns) hashed OK in this process
_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class StorageError(OSError):
    """The disk under the cache failed us (full, read-only, quota): infrastructure, exit 2."""

    def __str__(self) -> str:  # the message already names the path; no "[Errno 28]" prefix
        return str(self.strerror)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()[:DIGEST_LEN]


def tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def storage_error(e: OSError, path: Path, what: str) -> StorageError:
    """``e`` as a StorageError naming ``path`` (what was being written and why it failed)."""
    why = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied"}.get(
        e.errno, "no space left on device" if e.errno in _SPACE else (e.strerror or str(e))
    )
    err = StorageError(e.errno, f"cannot write {what} {path}: {why}")
    err.filename = str(path)
    return err


def write_atomic(path: Path, write: Callable[[Path], None], what: str = "cache file") -> Path:
    """``write(tmp)`` then rename to ``path``; the temp file never survives an error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        _remove(tmp)
        if isinstance(e, OSError) and not isinstance(e, StorageError):
            raise storage_error(e, path, what) from e
        raise
    return path


def write_verified(directory: Path, key: str, suffix: str, write: Callable[[Path], None]) -> Path:
    """Write an entry via a temp file, then rename it to ``{key}.{digest}{suffix}``."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(directory / f"{key}{suffix}")
    try:
        write(tmp)
        final = directory / f"{key}.{file_digest(tmp)}{suffix}"
        os.replace(tmp, final)
    except BaseException as e:
        _remove(tmp)
        if isinstance(e, OSError) and not isinstance(e, StorageError):
            raise storage_error(e, directory / f"{key}{suffix}", "cache entry") from e
        raise
    return final


def preallocate(path: Path, nbytes: int) -> None:
    """Reserve ``nbytes`` for ``path`` now: ENOSPC here, not a SIGBUS on a sparse memmap later."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # no fallocate here: write zeros instead
            _zero_fill(fd, nbytes)
        else:
            raise
    finally:
        os.close(fd)


def _zero_fill(fd: int, nbytes: int) -> None:
    block = bytes(1 << 20)
    os.lseek(fd, 0, os.SEEK_SET)
    done = 0
    while done < nbytes:
        done += os.write(fd, block[: min(len(block), nbytes - done)])


def report_bad(path: Path, why: str, writable: bool) -> None:
    """Say which cache file is bad and drop it (kept on a read-only cache: just not used)."""
    action = "deleted; recomputing" if writable else "ignored (read-only cache); recomputing"
    print(f"[cache] corrupt entry {path}: {why}; {action}", file=sys.stderr, flush=True)
    if writable:
        _remove(path)


def find_verified(directory: Path, key: str, suffix: str, writable: bool, memo: bool = False) -> Path | None:
    """The entry of ``key`` whose bytes match the digest in its name, or None (bad ones reported).

    ``memo``: trust a file already verified in this process while its size and mtime are
    unchanged (memory-mapped vectors, re-opened by every config of a sweep).
    """
    if not directory.is_dir():
        return None
    for path in sorted(directory.glob(f"{key}.*{suffix}")):
        digest = path.name[len(key) + 1 : -len(suffix)]
        if len(digest) != DIGEST_LEN:
            continue
        try:
            st = path.stat()
            stamp = (str(path), st.st_size, st.st_mtime_ns)
            if memo and stamp in _VERIFIED:
                return path
            actual = file_digest(path)
        except OSError as e:
            report_bad(path, f"unreadable ({e.strerror or e})", writable)
            continue
        if actual != digest:
            report_bad(path, f"content digest {actual} does not match its name", writable)
            continue
        if memo:
            _VERIFIED.add(stamp)
        return path
    return None


def bad_entry(path: Path, e: BaseException, writable: bool) -> None:
    """A verified file that still does not load (e.g. written by a broken writer): report, drop."""
    _VERIFIED.difference_update({s for s in _VERIFIED if s[0] == str(path)})
    report_bad(path, f"does not load ({type(e).__name__}: {str(e)[:200]})", writable)


def is_writable(directory: Path) -> bool:
    """Whether files can be created under ``directory`` (False on a read-only mount or chmod a-w)."""
    d = directory
    while not d.exists() and d != d.parent:
        d = d.parent
    return os.access(d, os.W_OK) and not _read_only_mount(d)


def _read_only_mount(d: Path) -> bool:
    try:
        return bool(os.statvfs(d).f_flag & os.ST_RDONLY)
    except OSError:
        return False
