"""What a dense reranker adds per query when it serves one query at a time; prints, asserts nothing.

The sweep's ``latency_rerank_s`` for rerank=dense is amortised: the pipeline hands the reranker
every query at once and each distinct candidate text is embedded once per run (stages/rerank.py).
A server reranking one query embeds that query and its ``candidates`` chunks alone; this measures
that: the bundled sample, markdown chunks, BM25 top ``--candidates``, then ``DenseReranker.score``
on one query at a time with no vector cache, ``--n`` queries, after one warm-up query.

    python scripts/bench_rerank.py [--n 24] [--candidates 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

from rag_experiments.evalset.corpus import Corpus  # noqa: E402
from rag_experiments.evalset.load import EvalSet, sample_dir  # noqa: E402
from rag_experiments.stages.chunking import MarkdownChunker, chunk_corpus  # noqa: E402
from rag_experiments.stages.embedding import SentenceTransformerEmbedder  # noqa: E402
from rag_experiments.stages.rerank import DenseReranker  # noqa: E402
from rag_experiments.stages.retrieval import BM25Retriever  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--candidates", type=int, default=50)
    args = ap.parse_args()
    corpus = Corpus(str(sample_dir() / "docs"))
    items = EvalSet(str(sample_dir() / "evalset.jsonl"), corpus).items[: args.n + 1]
    chunks = chunk_corpus(MarkdownChunker(), corpus.docs)
    bm25 = BM25Retriever(k=5)
    bm25.index(chunks)
    t = time.perf_counter()
    idx, _ = bm25.search([it.query for it in items], args.candidates)
    bm25_ms = (time.perf_counter() - t) * 1000 / len(items)
    rr = DenseReranker(SentenceTransformerEmbedder(show_progress=False), candidates=args.candidates)
    seconds = []
    for qi, it in enumerate(items):
        texts = [chunks[i].text for i in idx[qi] if i >= 0]
        t = time.perf_counter()
        rr.score([it.query], [texts])
        if qi:  # the first query loads the model
            seconds.append(time.perf_counter() - t)
    ms = np.array(seconds) * 1000
    print(f"{len(chunks)} chunks; BM25 search {bm25_ms:.1f} ms/query (batched)")
    print(
        f"dense rerank of {args.candidates} candidates, one query at a time, n={len(ms)}: "
        f"median {statistics.median(ms):.0f} ms, p95 {np.percentile(ms, 95):.0f} ms"
    )
    print("load average:", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()
