"""Benchmark dense retrieval at 10k / 100k / 1M chunks, and the Ray figures; prints, asserts nothing.

Corpus: real text that ships with this environment, no download: every ``.py``/``.md``/``.rst``/
``.txt`` file under the venv's site-packages (sorted paths, ~360 MB here), cut into ~400-character
windows at whitespace starting every ~200 characters (overlapping windows, as fixed-size chunking
with overlap does: non-overlapping ones give fewer than 1M), duplicates and mostly non-letter
windows dropped. Queries: the first 120 characters of held-out windows.

Figures
  embedding   MiniLM through DenseRetriever.index (streamed into the memmap store) vs a bare
              ``SentenceTransformer.encode`` on the same texts (ratio); the static (model2vec)
              embedder's throughput on the largest size, streamed.
  per size    (static vectors, a subprocess each, so peak RSS is per size)
              exact: query latency p50/p95 (one query at a time) and a batched pass, which is
              the ground truth (blocked numpy search over the memmap);
              faiss_hnsw / faiss_ivf: build time, latency p50/p95, recall@10 against exact.
  --ray       Ray Data embedding (static, 2 actors) vs in-process, and a 4-config sweep's wall
              time on a local Ray head offering 1 vs 2 CPUs (``bench_ray_sweep``).

    python scripts/bench_scale.py [--sizes 10000 100000 1000000] [--st-chunks 300] [--queries 200]
    python scripts/bench_scale.py --ray [--ray-embed 20000]

Budget: the 1M row needs ~3 GB of RAM in the search process and, on a contended 2-core machine,
about an hour (1M static embeddings, then a 1M-vector HNSW graph); --ray about 10 minutes.
The machine this ran on is shared and contended: absolute times are inflated, ratios less so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # in-process ray.init would write ~/.ray/auth_token
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def corpus_texts(n: int, width: int = 400, stride: int = 200) -> list[str]:
    """The first ``n`` distinct windows of the text files in site-packages, in sorted path order.

    A window is ~``width`` characters ending at whitespace; a new one starts every ~``stride``
    characters (stride < width: overlapping windows, the usual fixed-size chunking with overlap;
    the site-packages text, ~360 MB here, holds too few non-overlapping windows for 1M chunks).
    Windows that are mostly non-letters (tables of numbers, minified code) are dropped.
    """
    seen: set[str] = set()
    out: list[str] = []
    roots = [Path(p) for p in site.getsitepackages()]
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix not in {".py", ".md", ".rst", ".txt"} or not path.is_file():
                continue
            try:
                text = re.sub(r"\s+", " ", path.read_text(encoding="utf-8", errors="ignore"))
            except OSError:
                continue
            i = 0
            while i < len(text) and len(out) < n:
                j = text.rfind(" ", i, i + width)
                j = i + width if j <= i else j
                w = text[i:j].strip()
                nxt = text.find(" ", i + stride, j)  # the next window starts at a word
                i = nxt + 1 if nxt > i else j + 1
                if len(w) > 100 and w not in seen and sum(c.isalpha() for c in w) > 0.6 * len(w):
                    seen.add(w)
                    out.append(w)
            if len(out) >= n:
                return out
    return out


def rss_mib() -> float:
    """Peak RSS of this process image (VmHWM; ru_maxrss would carry the parent's peak across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000, q))


def bench_embedding(n_st: int, n_static: int, work: Path, static_cache: Path | None) -> dict:
    from rag_experiments.core.cache import CachedEmbedder, StageCache
    from rag_experiments.core.types import Chunk
    from rag_experiments.stages.embedding import SentenceTransformerEmbedder, StaticEmbedder
    from rag_experiments.stages.retrieval import DenseRetriever
    from rag_experiments.stages.vector_store import embed_to_memmap

    t = time.perf_counter()
    texts = corpus_texts(max(n_st, n_static) + 1000)
    out: dict = {"corpus_windows": len(texts), "corpus_s": time.perf_counter() - t}
    st = SentenceTransformerEmbedder(show_progress=False)
    st.encode(texts[:8])  # model load outside the timings
    sample = texts[:n_st]
    t = time.perf_counter()
    st.model.encode(sample, batch_size=64, convert_to_numpy=True, normalize_embeddings=True)
    bare = time.perf_counter() - t
    chunks = [Chunk(f"c{i}", "d", 0, len(x), x, {}) for i, x in enumerate(sample)]
    ret = DenseRetriever(CachedEmbedder(st, StageCache(work / "cache_st")), embed_batch=512)
    t = time.perf_counter()
    ret.index(chunks)
    ours = time.perf_counter() - t
    out["minilm"] = {
        "n": n_st,
        "bare_chunks_per_s": n_st / bare,
        "ours_chunks_per_s": n_st / ours,
        "ours_over_bare_time": ours / bare,
    }
    static = StaticEmbedder(cache_dir=str(static_cache or work / "cache_static"))
    static.encode(texts[:8])  # distillation (once) and load outside the timings
    t = time.perf_counter()
    m = embed_to_memmap(lambda b: static.encode(b), texts[:n_static], work / "static.npy", "float32", 4096)
    dt = time.perf_counter() - t
    out["static"] = {"n": n_static, "chunks_per_s": n_static / dt, "dim": int(m.shape[1])}
    q = np.asarray(static.encode([x[:120] for x in texts[n_static : n_static + 1000]], kind="query"))
    np.save(work / "queries.npy", q)
    out["embedding_peak_rss_mib"] = rss_mib()
    return out


def _recall_curve(kind: str, index, q: np.ndarray, truth: np.ndarray) -> list[dict]:
    """Recall@10 and batched per-query time at wider search beams on the same index (no rebuild):
    HNSW ``efSearch`` / IVF ``nprobe`` — what quality the search-time knob buys."""
    from rag_experiments.stages.retrieval import ann_recall

    out = []
    for value in (128, 256, 512) if kind == "faiss_hnsw" else (32, 64, 128):
        if kind == "faiss_hnsw":
            index.hnsw.efSearch = value
        else:
            index.nprobe = value
        t = time.perf_counter()
        _, idx = index.search(q, 10)
        ms = (time.perf_counter() - t) * 1000 / len(q)
        out.append({"param": value, "recall_at_10": float(np.nanmean(ann_recall(idx, truth, 10))), "ms": ms})
    return out


def _curve_note(kind: str, curve: list[dict]) -> str:
    """``efSearch 128: 0.95 @ 0.4 ms; ...`` — the wider-beam points of :func:`_recall_curve`."""
    name = "efSearch" if kind == "faiss_hnsw" else "nprobe"
    return "; ".join(f"{name} {c['param']}: {c['recall_at_10']:.3f} @ {c['ms']:.2f} ms" for c in curve)


def bench_size(n: int, n_q: int, work: Path) -> dict:
    """One size in its own process: exact vs HNSW vs IVF over the first n static vectors."""
    from rag_experiments.stages.retrieval import ann_recall, exact_search
    from rag_experiments.stages.vector_store import build_faiss

    base = rss_mib()
    m = np.load(work / "static.npy", mmap_mode="r")[:n]
    q = np.load(work / "queries.npy")[:n_q]
    res: dict = {"n": n, "queries": len(q)}
    lat = []
    for row in q:
        t = time.perf_counter()
        exact_search(row[None, :], m, 10)
        lat.append(time.perf_counter() - t)
    t = time.perf_counter()
    truth, _ = exact_search(q, m, 10)
    res["exact"] = {"p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "batched_s": time.perf_counter() - t}
    # base row: narrow beams (ef_search 64, nprobe 16); _recall_curve adds the wider ones incl. the defaults
    params = {"hnsw_m": 32, "ef_construction": 80, "ef_search": 64, "ivf_nlist": 0, "ivf_nprobe": 16}
    for kind in ("faiss_hnsw", "faiss_ivf"):
        t = time.perf_counter()
        index = build_faiss(kind, m, params)
        build = time.perf_counter() - t
        if kind == "faiss_hnsw":
            index.hnsw.efSearch = params["ef_search"]
        else:
            index.nprobe = params["ivf_nprobe"]
        lat = []
        for row in q:
            t = time.perf_counter()
            index.search(row[None, :], 10)
            lat.append(time.perf_counter() - t)
        _, idx = index.search(q, 10)
        res[kind] = {
            "build_s": build,
            "p50_ms": pct(lat, 50),
            "p95_ms": pct(lat, 95),
            "recall_at_10": float(np.nanmean(ann_recall(idx, truth, 10))),
            "curve": _recall_curve(kind, index, q, truth),
        }
        del index
    res["peak_rss_mib"] = rss_mib()
    res["rss_before_mib"] = base
    return res


def _ray_node(num_cpus: int, tmp: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """A local Ray head (``ray start --block``, own process group) offering ``num_cpus`` CPUs."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp / f"head{num_cpus}.log"
    ray_bin = str(Path(sys.executable).parent / "ray")
    args = [ray_bin, "start", "--block", "--head", f"--port={port}", f"--num-cpus={num_cpus}"]
    args += [f"--temp-dir={tmp}", "--include-dashboard=false", "--object-store-memory=100000000"]
    p = subprocess.Popen(
        args, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )  # noqa: SIM115
    deadline = time.monotonic() + 300
    while "Ray runtime started" not in log.read_text():
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ray head did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)
    return p, f"127.0.0.1:{port}"


def _stop_node(p: subprocess.Popen) -> None:
    import signal

    os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)


def _children_seconds(uri: str) -> float:
    """Sum of the sweep's child runs' durations (end - start): the work the jobs did."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("bench").experiment_id])
    kids = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return sum((r.info.end_time - r.info.start_time) / 1000 for r in kids)


RAY_SWEEP = ["chunking=fixed,sentence,recursive,markdown", "generator=none", "cache_enabled=false"]


def bench_ray_sweep(work: Path) -> list[dict]:
    """Wall time of one 4-config sweep (retrieval only, MiniLM dense, bundled sample, no stage
    cache so the configs share no work) on a local Ray head offering 1, then 2 CPUs.

    One BLAS/torch thread per job (``OMP_NUM_THREADS=1``), so a job uses one CPU and the
    number of CPUs Ray offers is the parallelism. Ray's start-up is outside the timing; the
    driver's own work (composing and validating every job) is inside it, in both.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env["RAY_AUTH_MODE"] = "disabled"  # a throwaway local cluster: no ~/.ray/auth_token written
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("MLFLOW_TRACKING_URI", None)
    out = []
    for cpus in (1, 2):
        root = work / f"ray_sweep_{cpus}"
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="rb"))  # short: Ray puts Unix sockets in here
        head, address = _ray_node(cpus, tmp, env)
        try:
            load = os.getloadavg()
            t = time.perf_counter()
            args = [sys.executable, "-m", "rag_experiments.sweep", "-m", "hydra/launcher=ray"]
            args += [f"hydra.launcher.ray.init.address={address}", *RAY_SWEEP, "progress=false"]
            args += [f"tracking.uri=sqlite:///{root}/mlflow.db", f"tracking.artifact_root={root}/mlruns"]
            args += [f"cache_dir={root}/cache", f"hydra.sweep.dir={root}/multirun", "experiment_name=bench"]
            p = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=3600)
            wall = time.perf_counter() - t
            if p.returncode != 0:
                raise RuntimeError(f"sweep failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
            out.append(
                {
                    "cpus": cpus,
                    "wall_s": wall,
                    "jobs_s": _children_seconds(f"sqlite:///{root}/mlflow.db"),
                    "load_before": load,
                    "load_after": os.getloadavg(),
                }
            )
        finally:
            _stop_node(head)
    return out


def bench_ray_embedding(n: int, work: Path, static_cache: Path | None) -> dict:
    """Static-embedder throughput into the memmap store: in this process vs Ray Data (2 actors)."""
    import ray

    from rag_experiments.stages.embedding import StaticEmbedder
    from rag_experiments.stages.vector_store import embed_to_memmap, embed_to_memmap_ray

    texts = corpus_texts(n)
    static = StaticEmbedder(cache_dir=str(static_cache or work / "cache_static"))
    static.encode(texts[:8])
    t = time.perf_counter()
    a = embed_to_memmap(lambda b: static.encode(b), texts, work / "ray_local.npy", "float32", 4096)
    local = time.perf_counter() - t
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=300_000_000)
    try:
        t = time.perf_counter()
        b = embed_to_memmap_ray(static, texts, work / "ray_data.npy", "float32", 4096, 2)
        on_ray = time.perf_counter() - t
    finally:
        ray.shutdown()
    return {
        "n": len(texts),
        "local_per_s": len(texts) / local,
        "ray_per_s": len(texts) / on_ray,
        "equal": bool(np.array_equal(a, b)),
        "load": os.getloadavg(),
    }


def report_ray(work: Path, embed_n: int, static_cache: Path | None) -> None:
    if embed_n:
        e = bench_ray_embedding(embed_n, work, static_cache)
        print(
            f"Ray Data embedding (static, {e['n']} chunks, 2 actors on a local 2-CPU Ray): "
            f"local {e['local_per_s']:.0f}/s, Ray {e['ray_per_s']:.0f}/s, ratio Ray/local "
            f"{e['ray_per_s'] / e['local_per_s']:.2f}; vectors equal: {e['equal']}; load average {e['load']}"
        )
    runs = bench_ray_sweep(work)
    for r in runs:
        print(
            f"4-config sweep on Ray with {r['cpus']} CPU(s): {r['wall_s']:.1f}s wall, jobs' own time "
            f"{r['jobs_s']:.1f}s (overlap {r['jobs_s'] / r['wall_s']:.2f}) "
            f"(load average before {r['load_before'][0]:.1f}, after {r['load_after'][0]:.1f})"
        )
    print(f"speed-up 1 -> 2 CPUs: {runs[0]['wall_s'] / runs[1]['wall_s']:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--st-chunks", type=int, default=300, help="chunks for the MiniLM throughput ratio")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--workdir", type=Path)
    p.add_argument("--static-cache", type=Path, help="a cache_dir that already holds the distilled model")
    p.add_argument("--ray", action="store_true", help="only the Ray figures (embedding, 1 vs 2 CPUs)")
    p.add_argument(
        "--ray-embed", type=int, default=50_000, help="chunks for the Ray Data embedding ratio (0: skip)"
    )
    p.add_argument("--_size", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_scale_"))
    if args.ray:
        report_ray(work, args.ray_embed, args.static_cache)
        return
    if args._size:
        print(json.dumps(bench_size(args._size, args.queries, work)))
        return
    emb = bench_embedding(args.st_chunks, max(args.sizes), work, args.static_cache)
    mm = emb["minilm"]
    print(
        f"corpus: {emb['corpus_windows']} windows of site-packages text (.py/.md/.rst/.txt), ~400 chars "
        f"every ~200 (read and cut in {emb['corpus_s']:.0f}s); load average {os.getloadavg()}"
    )
    print(
        f"MiniLM embed, {mm['n']} chunks: bare encode {mm['bare_chunks_per_s']:.0f}/s, "
        f"ours (streamed to memmap) {mm['ours_chunks_per_s']:.0f}/s, time ratio ours/bare {mm['ours_over_bare_time']:.2f}"
    )
    s = emb["static"]
    print(f"static (model2vec, {s['dim']}-d) embed, {s['n']} chunks streamed: {s['chunks_per_s']:.0f}/s")
    print(f"peak RSS of the embedding process: {emb['embedding_peak_rss_mib']:.0f} MiB")
    print(f"\n{'n':>8} {'index':<11} {'build s':>8} {'p50 ms':>8} {'p95 ms':>8} {'recall@10':>9}  notes")
    for n in args.sizes:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--_size",
                str(n),
                "--queries",
                str(args.queries),
                "--workdir",
                str(work),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  (size {n}: load average {os.getloadavg()})")
        e = r["exact"]
        print(
            f"{n:>8} {'exact':<11} {'-':>8} {e['p50_ms']:>8.2f} {e['p95_ms']:>8.2f} {'1':>9}  "
            f"{r['queries']} queries batched: {e['batched_s']:.2f}s; peak RSS {r['peak_rss_mib']:.0f} MiB"
        )
        for kind in ("faiss_hnsw", "faiss_ivf"):
            k = r[kind]
            print(
                f"{n:>8} {kind:<11} {k['build_s']:>8.1f} {k['p50_ms']:>8.2f} {k['p95_ms']:>8.2f} "
                f"{k['recall_at_10']:>9.3f}  " + _curve_note(kind, k["curve"])
            )
    print(f"\nworkdir {work}; machine: {os.cpu_count()} CPUs, shared with other jobs (times inflated)")


if __name__ == "__main__":
    main()
