"""A named lock announces a wait only when it lasts (tracking/lock_wait.py)."""

from __future__ import annotations

import fcntl
import threading
import time

from rag_experiments.tracking.lock_wait import acquire


def _hold(path, seconds: float, held: threading.Event) -> None:
    # a second open file description: flock conflicts with it even inside one process
    with open(path, "a+") as g:
        fcntl.flock(g, fcntl.LOCK_EX)
        g.write("otherhost:4242\n")
        g.flush()
        held.set()
        time.sleep(seconds)


def _wait_for(path, hold_s: float, quiet_s: float, capsys) -> tuple[str, float]:
    held = threading.Event()
    t = threading.Thread(target=_hold, args=(path, hold_s, held))
    t.start()
    held.wait()
    t0 = time.perf_counter()
    with open(path, "a+") as f:
        acquire(f, path, "prompt p", quiet_s=quiet_s)
        waited = time.perf_counter() - t0
        f.seek(0)
        assert f.read().strip().rsplit(":", 1)[1] != "4242"  # the new holder wrote itself
    t.join()
    return capsys.readouterr().err, waited


def test_a_short_wait_says_nothing(tmp_path, capsys):
    err, waited = _wait_for(tmp_path / "l.lock", hold_s=0.3, quiet_s=2.0, capsys=capsys)
    assert waited >= 0.2 and err == ""


def test_a_long_wait_names_the_holder_then_the_time(tmp_path, capsys):
    err, waited = _wait_for(tmp_path / "l.lock", hold_s=0.8, quiet_s=0.2, capsys=capsys)
    assert waited >= 0.7
    first, second = err.strip().splitlines()
    assert "prompt p is held by pid 4242 on host otherhost" in first
    assert second.startswith("[waiting] got prompt p after")
