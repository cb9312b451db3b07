"""What verifying the stage cache on read costs; prints figures, asserts nothing.

Figures (each the median of ``--repeat`` runs, file in the page cache, as on a warm re-run):
  sample    the bundled sample's cache entries for the default chunking (chunks parquet, the
            MiniLM vector memmap, rankings and chunk-token npz): read with and without the sha256
            check, and the sum against the time a fully cached retrieval-only run spends reading
            them.
  --chunks  a synthetic float32 vector memmap of N x 384 (N = 100,000 by default, 154 MB): open
            memory-mapped (np.load, lazy) vs hash + open, and vs one exact-search pass over it
            (what every dense run does with the matrix anyway); a second open in the same process
            is free (verified once per process and file).

    python scripts/bench_cache_verify.py [--chunks 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

from rag_experiments.core.cache_files import file_digest, find_verified  # noqa: E402


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _reader(path: Path):
    import pandas as pd

    if path.suffix == ".parquet":
        return lambda: pd.read_parquet(path)
    if path.suffix == ".npz":
        return lambda: dict(np.load(path, allow_pickle=False))
    return lambda: np.asarray(np.load(path, mmap_mode="r")).sum()  # a search reads every page


def bench_sample(repeat: int) -> None:
    from rag_experiments.core.cache import CachedEmbedder, StageCache
    from rag_experiments.evalset.corpus import Corpus
    from rag_experiments.evalset.load import EvalSet, sample_dir
    from rag_experiments.run.pipeline import run_pipeline
    from rag_experiments.run.types import PipelineData, RunSettings, Stages
    from rag_experiments.stages.chunking import MarkdownChunker
    from rag_experiments.stages.embedding import SentenceTransformerEmbedder
    from rag_experiments.stages.retrieval import DenseRetriever

    root = Path(tempfile.mkdtemp(prefix="bench_verify_"))
    corpus = Corpus(str(sample_dir() / "docs"))
    items = EvalSet(str(sample_dir() / "evalset.jsonl"), corpus).items

    def run():
        cache = StageCache(root)
        t = time.perf_counter()
        stages = Stages(
            chunker=MarkdownChunker(),
            chunking_cfg={"_target_": "markdown"},
            retriever=DenseRetriever(CachedEmbedder(SentenceTransformerEmbedder(show_progress=False), cache)),
        )
        settings = RunSettings(k=5, ks=(1, 3, 5, 10), n_resamples=200, progress=False)
        run_pipeline(stages, PipelineData(corpus.docs, corpus.digest, items), settings, cache)
        return time.perf_counter() - t

    run()  # fills the cache
    warm = statistics.median(run() for _ in range(repeat))
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".parquet", ".npz", ".npy"))
    total_hash = total_read = 0.0
    print(f"{'entry':<34} {'bytes':>10} {'read ms':>9} {'sha256 ms':>10}")
    for f in files:
        read = _median(_reader(f), repeat)
        hashed = _median(lambda f=f: file_digest(f), repeat)
        total_hash, total_read = total_hash + hashed, total_read + read
        print(
            f"{f.parent.parent.name + '/' + f.name[:12] + '…' + f.suffix:<34} {f.stat().st_size:>10} "
            f"{read * 1e3:>9.2f} {hashed * 1e3:>10.2f}"
        )
    print(
        f"sample: verification {total_hash * 1e3:.1f} ms over {len(files)} entries; reading them "
        f"{total_read * 1e3:.1f} ms; a fully cached retrieval-only run {warm:.2f} s "
        f"(verification = {100 * total_hash / warm:.1f} % of it)"
    )


def bench_memmap(n: int, repeat: int) -> None:
    d = Path(tempfile.mkdtemp(prefix="bench_verify_mm_"))
    m = np.random.default_rng(0).standard_normal((n, 384), dtype=np.float32)
    m /= np.linalg.norm(m, axis=1, keepdims=True)
    tmp = d / "x.npy"
    np.save(tmp, m)
    key = "k" * 64
    path = d / f"{key}.{file_digest(tmp)}.npy"
    os.replace(tmp, path)
    del m
    open_only = _median(lambda: np.load(path, mmap_mode="r"), repeat)
    hashed = _median(lambda: file_digest(path), repeat)
    q = np.random.default_rng(1).standard_normal((168, 384)).astype(np.float32)
    mm = np.load(path, mmap_mode="r")
    search = _median(lambda: np.argpartition(-(q @ np.asarray(mm).T), 10, axis=1), repeat)
    find_verified(d, key, ".npy", True, memo=True)
    memo = _median(lambda: find_verified(d, key, ".npy", True, memo=True), repeat)
    mb = path.stat().st_size / 1e6
    print(
        f"memmap {n} x 384 float32 ({mb:.0f} MB): open {open_only * 1e3:.2f} ms, sha256 {hashed:.3f} s "
        f"({mb / hashed:.0f} MB/s), exact search of 168 queries {search:.3f} s, "
        f"second verified open in the process {memo * 1e3:.2f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-sample", action="store_true")
    a = ap.parse_args()
    if not a.skip_sample:
        bench_sample(a.repeat)
    bench_memmap(a.chunks, a.repeat)


if __name__ == "__main__":
    main()
