"""Taking a file lock without looking hung: who holds it, and that we are waiting.

The holder writes ``host:pid`` into the lock file once it has the lock; a process that finds the
lock taken prints that holder and the lock's path on stderr, once, then blocks until the kernel
hands the lock over (``flock`` is released when the holder exits, even on kill -9).
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO


def holder_of(path: Path) -> str:
    """``pid P on host H`` as written by the holder, or ``an unknown process`` (not written yet)."""
    try:
        host, pid = path.read_text().strip().rsplit(":", 1)
        return f"pid {int(pid)} on host {host}"
    except (OSError, ValueError):
        return "an unknown process"


def acquire(f: IO[str], path: Path, what: str = "") -> None:
    """Exclusive ``flock`` on the open file ``f`` (at ``path``); a named lock (``what``, e.g. a
    config_hash) says on stderr when it waits. Unnamed locks (store creation, parent election) are
    held for milliseconds and wait silently."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB if what else fcntl.LOCK_EX)
    except BlockingIOError:
        t0 = time.perf_counter()
        print(
            f"[waiting] {what} is held by {holder_of(path)} ({path}); "
            "waiting for it to finish (Ctrl-C to stop)",
            file=sys.stderr,
            flush=True,
        )
        fcntl.flock(f, fcntl.LOCK_EX)
        print(f"[waiting] got {what} after {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    f.seek(0)
    f.truncate()
    f.write(f"{socket.gethostname()}:{os.getpid()}\n")
    f.flush()
