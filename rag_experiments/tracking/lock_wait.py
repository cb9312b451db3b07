"""Taking a file lock without looking hung: who holds it, and that we are waiting.

The holder writes ``host:pid`` into the lock file once it has the lock; a process that finds the
lock taken for longer than ``QUIET_S`` prints that holder and the lock's path on stderr, once, then
blocks until the kernel hands the lock over (``flock`` is released when the holder exits, even on
kill -9). Waits shorter than that (another job registering a prompt) say nothing: a message that
ends "got it after 0.0s" is noise.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from typing import IO

QUIET_S = 2.0  # a named lock is polled this long before the wait is announced


def holder_of(path: Path) -> str:
    """``pid P on host H`` as written by the holder, or ``an unknown process`` (not written yet)."""
    try:
        host, pid = path.read_text().strip().rsplit(":", 1)
        return f"pid {int(pid)} on host {host}"
    except (OSError, ValueError):
        return "an unknown process"


def _poll(f: IO[str], seconds: float) -> bool:
    """Try the lock without blocking for up to ``seconds``; True once it is ours."""
    end = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)


def acquire(f: IO[str], path: Path, what: str = "", quiet_s: float = QUIET_S) -> None:
    """Exclusive ``flock`` on the open file ``f`` (at ``path``); a named lock (``what``, e.g. a
    config_hash) says on stderr when it waits longer than ``quiet_s``. Unnamed locks (store
    creation, parent election) are held for milliseconds and wait silently."""
    if not what:
        fcntl.flock(f, fcntl.LOCK_EX)
    elif not _poll(f, quiet_s):
        t0 = time.perf_counter() - quiet_s
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
