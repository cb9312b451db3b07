"""A config already running elsewhere: the waiting process says who holds the lock. A read-only
cache: a run whose every stage is a cache hit needs no write access."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from rag_experiments.core.cache import StageCache
from rag_experiments.tracking import writer
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

HOLD = """
import sys, time
from rag_experiments.tracking import writer
with writer.config_lock(sys.argv[1], "0", "c0ffee" * 10):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_waiting_on_a_config_lock_names_the_holder(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, uri, "4"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        t0 = time.perf_counter()
        with writer.config_lock(uri, "0", "c0ffee" * 10):
            waited = time.perf_counter() - t0
    finally:
        holder.wait(timeout=30)
    err = capsys.readouterr().err
    assert waited > 2.5, "the lock was not held past the quiet wait (lock_wait.QUIET_S)"
    assert f"pid {holder.pid} on host {socket.gethostname()}" in err, err
    assert "waiting" in err and "config_hash c0ffeec0ffee" in err and ".lock" in err, err


def test_an_uncontended_lock_prints_nothing(tmp_path, capsys):
    with writer.config_lock(f"sqlite:///{tmp_path}/mlflow.db", "0", "beef"):
        pass
    assert capsys.readouterr().err == ""


@contextlib.contextmanager
def read_only(src: Path, at: Path):
    """``src`` seen read-only at ``at``: a read-only bind mount as root (root ignores modes),
    ``chmod -R a-w`` otherwise."""
    at.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        subprocess.run(["mount", "--bind", str(src), str(at)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(at)], check=True)
        try:
            yield at
        finally:
            subprocess.run(["umount", "-l", str(at)], check=False)
    else:
        at.rmdir()
        os.symlink(src, at)
        subprocess.run(["chmod", "-R", "a-w", str(src)], check=True)
        try:
            yield at
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(src)], check=True)


def test_read_only_cache_serves_hits_and_computes_misses_without_storing(tmp_path, capfd):
    src = tmp_path / "cache"
    values = {"a": [1, "x"], "b": {"t": "y"}}
    StageCache(src).put_json_many("generations", values)
    StageCache(src).put_array("rankings", "ab" * 32, idx=[[1, 2]])
    with read_only(src, tmp_path / "ro") as ro:
        cache = StageCache(ro)
        assert not cache.writable
        assert cache.get_json_many("generations", ["a", "b", "c"]) == values
        assert cache.get_array("rankings", "ab" * 32)["idx"].tolist() == [[1, 2]]
        cache.put_json_many("generations", {"c": 3})  # a miss: computed by the caller, not stored
        cache.put_array("rankings", "cd" * 32, idx=[[0]])
    err = capfd.readouterr().err
    assert err.count(f"[cache] {ro} is read-only") == 1, err


def test_sweep_with_a_read_only_cache_where_every_stage_hits(tmp_path):
    docs, ev = make_tiny(tmp_path, n_items=3)
    args = [a for a in sweep_args(tmp_path, docs, ev) if not a.startswith("cache_dir=")]
    grid = ["generator=none", "retriever=dense", "retriever.index=faiss_hnsw", "retriever.k=3"]  # + sqlite
    run_sweep(tmp_path, *args, *grid, f"cache_dir={tmp_path}/cache")  # fills the cache
    with read_only(tmp_path / "cache", tmp_path / "ro") as ro:
        p = run_sweep(tmp_path, *args, *grid, f"cache_dir={ro}", "force=true", check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "unable to open database file" not in p.stderr and "read-only" not in p.stderr, p.stderr[-2000:]
    misses = re.findall(r"'([\w_]+)\.miss': (\d+)", p.stdout)
    assert "chunks.hit': 1" in p.stdout and "rankings.hit': 1" in p.stdout, p.stdout[-1500:]
    assert all(n == "0" for _, n in misses), p.stdout[-1500:]  # every stage hit
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    a, b = (r.data.metrics for r in runs)
    assert a["mrr"] == b["mrr"] and a["hit_at_3"] == b["hit_at_3"]
