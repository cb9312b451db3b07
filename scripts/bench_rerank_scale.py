"""BM25 → dense reranking vs a dense index at 10k / 100k / 1M chunks; prints, asserts nothing.

What it answers (issue 29): ``retriever=bm25 rerank=dense`` embeds only each query's top
``candidates`` chunks, a dense retriever embeds the whole corpus once. What does each cost as the
corpus grows?

Corpus and queries: built as ``scripts/bench_scale.py`` builds them (``corpus_texts``: ~400-character
windows every ~200 characters of the site-packages text, no download); queries are the first 120
characters of held-out windows (after the largest size's windows). Each size runs in its own
subprocess (peak RSS per size), reading the windows from a file the parent wrote once.

Figures per size (columns side by side at the end)
  BM25        index build time (``BM25Retriever.index``: bm25s tokenising and indexing), the memory
              the index keeps (RSS after − before, the texts already loaded) and the process's
              peak RSS; query latency one query at a time, ``max(--candidates)`` deep.
  rerank      ``DenseReranker.score`` on one query at a time (no vector cache, as a server
              would): the query and its top-c BM25 candidates embedded with the packaged MiniLM
              (what ``rerank=dense`` uses) and with the static model2vec model bench_scale indexes
              with; ``--rerank-queries`` queries per c after one warm-up. Also the share of
              distinct texts among all queries' candidates (what the sweep's amortised mode, which
              embeds each distinct candidate once per run, would embed).
  dense index for sizes in ``--dense-sizes``: the static model embedding all n chunks into the
              memory-mapped store (``embed_to_memmap``) and exact search over it (one query at a
              time); the MiniLM index's embedding time is n / MiniLM throughput, the throughput
              measured once on ``--st-chunks`` windows (embedding is linear in n). Sizes not in
              ``--dense-sizes`` are PROJECTED linearly from the largest measured dense size and
              marked ``(proj.)``.
  ratios      break-even queries = MiniLM embedding of the whole corpus / MiniLM rerank per query:
              after that many queries one at a time, BM25 → dense has spent as much on embedding as
              the dense index did once (≈ n / c; amortised batches only move it further out).

    python scripts/bench_rerank_scale.py [--sizes 10000 100000 1000000] [--dense-sizes 10000 100000]
        [--candidates 20 50 100] [--queries 200] [--rerank-queries 8] [--st-chunks 500] [--threads N]

``--threads 1`` on a loaded machine: torch's default (one thread per core) made a one-query MiniLM
encode take ≈ 1.2 s at load 9-11 on 2 cores against ≈ 40 ms with one thread (threads waiting for
each other while other processes hold the cores); small per-query batches suffer most.

Budget (``--rerank-queries 5``, all three sizes, shared 2-core machine): 12 min with ``--threads 1``
at load 6-8, 20 min with torch's default threads at load 8-11 (reading 1M windows 2 min, MiniLM
throughput 1-2 min, 2-4.5 min per size, most of it MiniLM re-scoring 5 queries × 170 candidates);
peak RSS 2.5 GB at 1M. The dense 1M column is never measured here (``bench_scale.py``
measures the static 1M index). Times follow the machine's load (printed per size); ratios less so.
A ``--workdir`` re-run reuses the windows and every size already measured there (``size_<n>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from bench_scale import REPO, corpus_texts, pct  # noqa: E402  (also sets the offline env, REPO on sys.path)

MINILM_DIM = 384


def vm(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load(work: Path, n: int) -> tuple[list[str], list[str]]:
    with open(work / "texts.txt", encoding="utf-8") as f:
        texts = [next(f).rstrip("\n") for _ in range(n)]
    return texts, json.loads((work / "queries.json").read_text())


def rerank_per_query(reranker, queries: list[str], cand_texts: list[list[str]]) -> list[float]:
    """Seconds of ``reranker.score`` for one query at a time; the first call (model load) dropped."""
    out = []
    for qi, (q, ts) in enumerate(zip(queries, cand_texts, strict=True)):
        t = time.perf_counter()
        reranker.score([q], [ts])
        if qi:
            out.append(time.perf_counter() - t)
    return out


def bench_size(n: int, args: argparse.Namespace, work: Path) -> dict:
    """One corpus size in its own process: BM25 index and search, per-query dense rerank, and the
    static dense index when ``n`` is in ``--dense-sizes``."""
    from rag_experiments.core.types import Chunk
    from rag_experiments.stages.embedding import SentenceTransformerEmbedder, StaticEmbedder
    from rag_experiments.stages.rerank import DenseReranker
    from rag_experiments.stages.retrieval import BM25Retriever, exact_search
    from rag_experiments.stages.vector_store import embed_to_memmap

    texts, queries = load(work, n)
    queries = queries[: args.queries]
    chunks = [Chunk(f"c{i}", "d", 0, len(x), x, {}) for i, x in enumerate(texts)]
    res: dict = {"n": n, "queries": len(queries), "load_start": os.getloadavg()[0]}
    depth = max(args.candidates)
    rss0 = vm("VmRSS")
    bm25 = BM25Retriever(k=5)
    t = time.perf_counter()
    bm25.index(chunks)
    res["bm25_build_s"] = time.perf_counter() - t
    res["bm25_index_mib"] = vm("VmRSS") - rss0
    res["bm25_peak_rss_mib"] = vm("VmHWM")
    res["texts_rss_mib"] = rss0
    bm25.search(queries[:2], depth)  # warm-up
    lat = []
    for q in queries:
        t = time.perf_counter()
        bm25.search([q], depth)
        lat.append(time.perf_counter() - t)
    idx, _ = bm25.search(queries, depth)
    res["bm25_p50_ms"], res["bm25_p95_ms"] = pct(lat, 50), pct(lat, 95)

    rq = args.rerank_queries + 1  # + the warm-up query
    res["rerank"] = {}
    embedders = {
        "minilm": SentenceTransformerEmbedder(show_progress=False),
        "static": StaticEmbedder(cache_dir=str(args.static_cache or work / "cache_static")),
    }
    for c in args.candidates:
        cand = [[texts[i] for i in row[:c] if i >= 0] for row in idx]
        distinct = len({t for ts in cand for t in ts}) / max(1, sum(len(ts) for ts in cand))
        entry = {"distinct_share": distinct}
        for name, emb in embedders.items():
            secs = rerank_per_query(DenseReranker(emb, candidates=c), queries[:rq], cand[:rq])
            entry[name] = {"median_ms": statistics.median(secs) * 1000, "p95_ms": pct(secs, 95)}
        res["rerank"][c] = entry
    res["load_rerank_end"] = os.getloadavg()[0]

    if n in args.dense_sizes:  # the static dense index: embed all n, then exact search
        static = embedders["static"]
        static.encode(texts[:8])
        rss1 = vm("VmRSS")
        t = time.perf_counter()
        m = embed_to_memmap(lambda b: static.encode(b), texts, work / f"static_{n}.npy", "float32", 4096)
        embed_s = time.perf_counter() - t
        qv = np.asarray(static.encode(queries, kind="query"))
        lat = []
        for row in qv:
            t = time.perf_counter()
            exact_search(row[None, :], m, 10)
            lat.append(time.perf_counter() - t)
        res["dense"] = {
            "static_embed_s": embed_s,
            "static_dim": int(m.shape[1]),
            "vectors_mib": m.nbytes / 2**20,
            "exact_p50_ms": pct(lat, 50),
            "exact_p95_ms": pct(lat, 95),
            "rss_growth_mib": vm("VmRSS") - rss1,
        }
    res["peak_rss_mib"] = vm("VmHWM")
    res["load_end"] = os.getloadavg()[0]
    return res


def minilm_rate(texts: list[str]) -> tuple[float, float]:
    """MiniLM chunks/s on ``texts`` (``encode`` as the dense retriever calls it) and the ms of one
    query embedding (120 characters, median of 20)."""
    from rag_experiments.stages.embedding import SentenceTransformerEmbedder

    st = SentenceTransformerEmbedder(show_progress=False)
    st.encode(texts[:8])  # model load outside the timing
    t = time.perf_counter()
    st.encode(texts, kind="passage")
    rate = len(texts) / (time.perf_counter() - t)
    q = []
    for x in texts[:21]:
        t = time.perf_counter()
        st.encode([x[:120]], kind="query")
        q.append(time.perf_counter() - t)
    return rate, statistics.median(q[1:]) * 1000


def fmt(x: float, proj: bool = False) -> str:
    s = f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}"
    return s + (" (proj.)" if proj else "")


def report(results: list[dict], args, rate: float, q_ms: float) -> None:
    sizes = [r["n"] for r in results]
    measured = [r for r in results if "dense" in r]
    ref = measured[-1] if measured else None
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, f) -> None:
        rows.append((label, [f(r) for r in results]))

    row("load average (1 min) at start / end", lambda r: f"{r['load_start']:.1f} / {r['load_end']:.1f}")
    row("BM25 index build s", lambda r: fmt(r["bm25_build_s"]))
    row("BM25 index memory MiB (RSS growth)", lambda r: fmt(r["bm25_index_mib"]))
    row("BM25 process peak RSS MiB (texts incl.)", lambda r: fmt(r["bm25_peak_rss_mib"]))
    row(
        f"BM25 query p50 / p95 ms ({max(args.candidates)} deep)",
        lambda r: f"{r['bm25_p50_ms']:.2f} / {r['bm25_p95_ms']:.2f}",
    )
    for c in args.candidates:
        row(
            f"rerank MiniLM, c={c}: ms/query median (p95)",
            lambda r, c=c: (
                f"{r['rerank'][c]['minilm']['median_ms']:,.0f} ({r['rerank'][c]['minilm']['p95_ms']:,.0f})"
            ),
        )
    for c in args.candidates:
        row(
            f"rerank static, c={c}: ms/query median (p95)",
            lambda r, c=c: (
                f"{r['rerank'][c]['static']['median_ms']:.2f} ({r['rerank'][c]['static']['p95_ms']:.2f})"
            ),
        )
    for c in args.candidates:
        row(
            f"distinct candidate texts / all, c={c}", lambda r, c=c: f"{r['rerank'][c]['distinct_share']:.2f}"
        )

    def dense(r: dict, key: str) -> tuple[float, bool]:
        if "dense" in r:
            return r["dense"][key], False
        if ref is None:
            return float("nan"), True
        return ref["dense"][key] * r["n"] / ref["n"], True  # linear in n (exact search reads every row)

    row(
        "dense index, MiniLM: embed all n s (n / rate)",
        lambda r: fmt(r["n"] / rate, r["n"] not in args.dense_sizes),
    )
    row("dense index, MiniLM: vectors MiB (384-d f32)", lambda r: fmt(r["n"] * MINILM_DIM * 4 / 2**20))
    row("dense index, static: embed all n s", lambda r: fmt(*dense(r, "static_embed_s")))
    row("dense index, static: vectors MiB", lambda r: fmt(*dense(r, "vectors_mib")))
    row("dense index, static: exact search p50 ms", lambda r: fmt(*dense(r, "exact_p50_ms")))
    row("dense query: MiniLM query embedding ms", lambda r: f"{q_ms:.1f}")
    for c in args.candidates:
        row(
            f"break-even queries, MiniLM, c={c}",
            lambda r, c=c: fmt((r["n"] / rate) / (r["rerank"][c]["minilm"]["median_ms"] / 1000)),
        )
    c_mid = sorted(args.candidates)[len(args.candidates) // 2]
    row(
        "BM25 build s / MiniLM index embed s",
        lambda r: f"{r['bm25_build_s'] / (r['n'] / rate):.4f}",
    )
    row(
        f"query ms: BM25 + MiniLM rerank c={c_mid} / MiniLM query + exact",
        lambda r: (
            f"{r['bm25_p50_ms'] + r['rerank'][c_mid]['minilm']['median_ms']:,.0f} / "
            f"{q_ms + dense(r, 'exact_p50_ms')[0]:,.1f}"
        ),
    )

    width = max(len(lbl) for lbl, _ in rows)
    cols = [max(len(f"{n:,}"), *(len(v[i]) for _, v in rows)) for i, n in enumerate(sizes)]
    print(
        "\n"
        + "chunks".ljust(width)
        + "  "
        + "  ".join(f"{n:,}".rjust(w) for n, w in zip(sizes, cols, strict=True))
    )
    for lbl, vals in rows:
        print(lbl.ljust(width) + "  " + "  ".join(v.rjust(w) for v, w in zip(vals, cols, strict=True)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument(
        "--dense-sizes",
        type=int,
        nargs="*",
        default=[10_000, 100_000],
        help="sizes at which the static dense index is built (others: projected)",
    )
    p.add_argument("--candidates", type=int, nargs="+", default=[20, 50, 100])
    p.add_argument("--queries", type=int, default=200, help="queries for BM25 latency and the distinct share")
    p.add_argument("--rerank-queries", type=int, default=8, help="queries timed per candidates value")
    p.add_argument("--st-chunks", type=int, default=500, help="windows for the MiniLM throughput")
    p.add_argument("--workdir", type=Path)
    p.add_argument("--static-cache", type=Path, help="a cache_dir that already holds the distilled model")
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads (default: torch's own, one per core); 1 avoids oversubscription",
    )
    p.add_argument("--_size", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_rerank_scale_"))
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args._size:
        print(json.dumps(bench_size(args._size, args, work)))
        return
    t = time.perf_counter()
    need = max(args.sizes)
    meta = work / "corpus.json"  # a --workdir re-run reuses the windows it already wrote
    if not (meta.exists() and json.loads(meta.read_text())["n"] >= need):
        texts = corpus_texts(need + args.queries)
        with open(work / "texts.txt", "w", encoding="utf-8") as f:
            for x in texts[:need]:
                f.write(x + "\n")  # corpus_texts collapses whitespace: one window per line
        (work / "queries.json").write_text(json.dumps([x[:120] for x in texts[need:]]))
        meta.write_text(json.dumps({"n": need}))
        del texts
    print(
        f"corpus: {need:,} windows + {args.queries} query windows ready in {time.perf_counter() - t:.0f}s; "
        f"load average {os.getloadavg()}"
    )
    with open(work / "texts.txt", encoding="utf-8") as f:
        sample = [next(f).rstrip("\n") for _ in range(args.st_chunks)]
    rate, q_ms = minilm_rate(sample)
    print(
        f"MiniLM: {rate:.1f} chunks/s on {args.st_chunks} windows; one query {q_ms:.1f} ms; load {os.getloadavg()}"
    )
    results = []
    for n in args.sizes:
        cmd = [
            sys.executable,
            __file__,
            "--_size",
            str(n),
            "--workdir",
            str(work),
            "--queries",
            str(args.queries),
            "--rerank-queries",
            str(args.rerank_queries),
            "--candidates",
            *map(str, args.candidates),
            "--dense-sizes",
            *map(str, args.dense_sizes),
        ]
        if args.static_cache:
            cmd += ["--static-cache", str(args.static_cache)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        t, saved = time.perf_counter(), work / f"size_{n}.json"  # kept: a --workdir re-run reuses it
        if saved.exists():
            print(f"  size {n:,}: reusing {saved}")
        else:
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
            if out.returncode:
                sys.exit(f"size {n}: exit {out.returncode}\n{out.stderr[-3000:]}")
            saved.write_text(out.stdout.strip().splitlines()[-1])
        r = json.loads(saved.read_text())
        r["rerank"] = {int(k): v for k, v in r["rerank"].items()}
        results.append(r)
        print(f"  size {n:,}: {time.perf_counter() - t:.0f}s, load average {os.getloadavg()}", flush=True)
    report(results, args, rate, q_ms)
    print(
        f"\nworkdir {work}; {os.cpu_count()} CPUs shared with other jobs; (proj.) = linear projection "
        f"from {max([n for n in args.sizes if n in args.dense_sizes], default='-')} chunks, not measured"
    )


if __name__ == "__main__":
    main()
