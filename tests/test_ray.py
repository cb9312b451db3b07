"""Distributed sweeps: a real two-node Ray cluster (hydra/launcher=ray) and submitit's local executor.

Each config of the multirun runs in another process than the sweep's driver; the MLflow store
and the stage cache are shared through absolute paths (a shared filesystem on a real cluster).
The Ray nodes are started with ``ray start --block`` in their own process group, and only that
group is stopped afterwards (``ray stop`` would end every Ray on the machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tests.sweep_helpers import REPO, make_tiny, run_sweep, sweep_args

RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    # Ray 2.60's ray.init() turns token auth on and writes ~/.ray/auth_token, which later
    # `ray start` nodes pick up: throwaway test clusters stay without it
    env["RAY_AUTH_MODE"] = "disabled"
    # Ray workers are children of the node processes: they import our code from the same place
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _start_node(args: list[str], log: Path, timeout: float = 180) -> subprocess.Popen:
    """``ray start --block ARGS`` in a new process group; returns once the node is up."""
    out = open(log, "w")  # noqa: SIM115  (closed by the OS when the node ends)
    p = subprocess.Popen(
        [RAY, "start", "--block", "--disable-usage-stats", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=_env(),
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while "Ray runtime started" not in log.read_text():
        if p.poll() is not None or time.monotonic() > deadline:
            _stop(p)
            raise AssertionError(f"ray node did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    return p


def _stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGTERM)  # --block: the node stops what it started
        p.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def ray_cluster():
    tmp = Path(tempfile.mkdtemp(prefix="ray"))  # short: Ray puts Unix sockets in here
    port = _free_port()
    common = ["--num-cpus=1", "--object-store-memory=80000000"]
    head = _start_node(
        ["--head", f"--port={port}", f"--temp-dir={tmp}", "--include-dashboard=false", *common],
        tmp / "head.log",
    )
    try:
        worker = _start_node([f"--address=127.0.0.1:{port}", *common], tmp / "worker.log")
    except AssertionError:
        _stop(head)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    yield f"127.0.0.1:{port}"
    _stop(worker)
    _stop(head)
    shutil.rmtree(tmp, ignore_errors=True)


def _sweep_runs(root: Path):
    c = MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")
    runs = c.search_runs([c.get_experiment_by_name("test").experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("is_parent") == "true"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


def _cache_files(root: Path, stage: str) -> int:
    return len(list((root / "cache" / stage).rglob("*.*")))


def test_ray_sweep_runs_each_config_as_a_task_on_a_two_node_cluster(ray_cluster, tmp_path):
    docs, ev = make_tiny(tmp_path)
    run_sweep(
        tmp_path,
        "-m",
        "chunking=fixed,markdown",
        "retriever.k=3,5",
        "retriever=bm25",  # retrieval only, no model to load: the launcher is what is tested
        "generator=none",
        "hydra/launcher=ray",
        f"hydra.launcher.ray.init.address={ray_cluster}",
        *sweep_args(tmp_path, docs, ev),
    )
    parents, children = _sweep_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    seen = [(r.data.params["chunking"], r.data.params["retriever.k"], r.info.status) for r in children]
    # Ray re-runs a task whose worker it lost (under load, seen once in CI: 5 children); the retry
    # resumes like a re-run, so a config may have an extra, unfinished child, never a missing one
    finished = [r for r in children if r.info.status == "FINISHED"]
    assert len({r.data.tags["config_hash"] for r in finished}) == 4, seen
    assert len({r.data.tags["config_hash"] for r in children}) == 4, seen
    combos = {(r.data.params["chunking"], r.data.params["retriever.k"]) for r in finished}
    assert combos == {("fixed", "3"), ("fixed", "5"), ("markdown", "3"), ("markdown", "5")}
    # one shared stage cache: 2 chunkings -> 2 chunk sets; k does not change the search depth
    assert _cache_files(tmp_path, "chunks") == 2 and _cache_files(tmp_path, "rankings") == 2


def test_submitit_local_sweep(tmp_path):
    docs, ev = make_tiny(tmp_path)
    run_sweep(
        tmp_path,
        "-m",
        "retriever.k=3,5",
        "retriever=bm25",
        "generator=none",
        "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10",
        *sweep_args(tmp_path, docs, ev),
    )
    parents, children = _sweep_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}


@pytest.fixture
def local_ray(monkeypatch):
    """No Ray running here yet; whatever the test starts in-process is shut down afterwards."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no ~/.ray/auth_token left behind (see _env)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    )
    assert not ray.is_initialized()
    yield ray
    ray.shutdown()


def _texts(n: int) -> list[str]:
    words = "retry webhook signature invoice refund region audit token limit key rotate page".split()
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 11)) + f" {i}" for i in range(n)]


def test_ray_data_embedding_gives_the_local_vectors(local_ray, tmp_path):
    """MiniLM (the static embedder's equality is printed by ``bench_scale.py --ray``: its
    distillation takes minutes on a contended machine)."""
    from rag_experiments.core.cache import CachedEmbedder, StageCache
    from rag_experiments.core.types import Chunk
    from rag_experiments.stages.embedding import SentenceTransformerEmbedder
    from rag_experiments.stages.retrieval import DenseRetriever

    def embedder(**ray):
        return SentenceTransformerEmbedder(show_progress=False, **ray)

    chunks = [Chunk(f"c{i}", "d", 0, len(t), t, {}) for i, t in enumerate(_texts(70))]
    mats, caches = {}, {}
    for path in ("local", "ray"):
        ray_cfg = {"ray": "true", "ray_min_chunks": 50, "ray_concurrency": 2} if path == "ray" else {}
        cache = caches[path] = StageCache(tmp_path / path)
        ret = DenseRetriever(CachedEmbedder(embedder(**ray_cfg), cache), embed_batch=16)
        ret.index(chunks)
        mats[path] = np.asarray(ret._matrix)
        assert cache.stats["vectors_mm.miss"] == 1
        assert local_ray.is_initialized() == (path == "ray"), (
            "the ray path started Ray, the local one did not"
        )
    # the same vectors up to float rounding: each actor's torch runs one thread (Ray's num_cpus=1),
    # the local path as many as it has, and a matmul summed in another order differs in the last bit
    assert float(np.abs(mats["local"] - mats["ray"]).max()) <= 1e-6
    # identity (hence every cache key) does not say where the vectors were computed
    files = {
        # the cache key (the name before the content digest): same for both paths
        p: sorted(x.name.split(".")[0] for x in (tmp_path / p / "vectors_mm").rglob("*.npy"))
        for p in mats
    }
    assert files["local"] == files["ray"] and len(files["local"]) == 1
    # below the threshold the local path is used even with ray=true
    small = DenseRetriever(
        CachedEmbedder(embedder(ray="true", ray_min_chunks=1000), StageCache(tmp_path / "s"))
    )
    assert not small.embedder.inner.ray_plan.use_ray(len(chunks))


def test_ray_keys_are_validated_and_not_in_config_hash():
    from rag_experiments.core.identity import semantic_config
    from rag_experiments.run.config_schema import ConfigError, _embedding, _Group

    g = _Group("embedding", {"ray": "sometimes", "ray_min_chunks": 0, "ray_concurrency": 2})
    _embedding(g)
    assert g.problems == [
        "conf/embedding: ray: must be one of auto, true, false (got 'sometimes')",
        "conf/embedding: ray_min_chunks: must be an integer >= 1 (got 0)",
    ]
    assert ConfigError
    a = {"embedding": {"name": "m", "ray": False, "ray_min_chunks": 10}}
    b = {"embedding": {"name": "m", "ray": "true", "ray_min_chunks": 99, "ray_concurrency": 4}}
    assert semantic_config(a) == semantic_config(b) == {"embedding": {"name": "m"}}
