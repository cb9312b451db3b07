"""A config already running elsewhere: the waiting process says who holds the lock. A read-only
cache: a run whose every stage is a cache hit needs no write access."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from rag_experiments.tracking import writer

HOLD = """
import sys, time
from rag_experiments.tracking import writer
with writer.config_lock(sys.argv[1], "0", "c0ffee" * 10):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_waiting_on_a_config_lock_names_the_holder(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, uri, "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.perf_counter()
        with writer.config_lock(uri, "0", "c0ffee" * 10):
            waited = time.perf_counter() - t0
    finally:
        holder.wait(timeout=30)
    err = capsys.readouterr().err
    assert waited > 0.5, "the lock was not held"
    assert f"pid {holder.pid} on host {socket.gethostname()}" in err, err
    assert "waiting" in err and "config_hash c0ffeec0ffee" in err and ".lock" in err, err


def test_an_uncontended_lock_prints_nothing(tmp_path, capsys):
    with writer.config_lock(f"sqlite:///{tmp_path}/mlflow.db", "0", "beef"):
        pass
    assert capsys.readouterr().err == ""
