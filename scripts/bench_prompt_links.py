"""What linking every trace to its prompt version costs: one run's traces written with and without
the link, side by side in one process, on both trace paths.

    python scripts/bench_prompt_links.py              # all 168 bundled items, 3 rounds
    python scripts/bench_prompt_links.py --limit 40 --rounds 5

One retrieval-only sweep (BM25, bundled sample) makes the per-query table, given an answer per item
(only answered items' traces are linked: this is the case where every item was generated, with
chat and judge spans); then each round writes
that run's traces four times into one sqlite store, interleaved: fast path (one transaction) with
and without ``prompt_version``, public API path with and without (the order alternates between
rounds). Printed: seconds per variant
(median), the ratio with/without per path (median of the per-round ratios: pairs run back to back,
so a load change moves both alike), and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def per_query(root: Path, limit: int | None):
    """The per-query table of one retrieval-only run of the bundled sample, and its store."""
    uri = f"sqlite:///{root}/m.db"
    args = [
        sys.executable, "-m", "rag_experiments.sweep", "generator=none", "retriever=bm25",
        f"tracking.uri={uri}", f"tracking.artifact_root={root}/mlruns", "tracking.traces=false",
        f"cache_dir={root}/cache", "progress=false", f"hydra.run.dir={root}/outputs", "experiment_name=bench",
        *([f"evalset.limit={limit}"] if limit else []),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    p = subprocess.run(args, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"sweep failed:\n{p.stderr[-3000:]}")
    import pandas as pd
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("bench").experiment_id
    run = c.search_runs([exp], max_results=1)[0]
    df = pd.read_parquet(c.download_artifacts(run.info.run_id, "per_query.parquet", str(root)))
    return uri, exp, df.assign(answer=[f"answer {i}" for i in range(len(df))], latency_generation_s=0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=None, help="first N eval items (default: all)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    import mlflow
    from mlflow import MlflowClient

    from rag_experiments.evalset.corpus import Corpus
    from rag_experiments.evalset.load import EvalSet, sample_dir
    from rag_experiments.tracking.traces import TraceJob, TraceSettings, write_traces

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        uri, exp, df = per_query(root, a.limit)
        corpus = Corpus(str(sample_dir() / "docs"))
        evalset = EvalSet(str(sample_dir() / "evalset.jsonl"), corpus)
        c = MlflowClient(tracking_uri=uri)
        mlflow.set_tracking_uri(uri)
        pv = c.register_prompt("bench-prompt", "Context: {{context}} Q: {{question}}")
        times: dict[tuple[str, bool], list[float]] = {}
        for path in ("fast", "public"):  # untimed: a process's first trace write pays one-off set-up
            run = c.create_run(exp).info.run_id
            job = TraceJob(TraceSettings(k=5, path=path), evalset.items, corpus.docs, evalset.digest)
            write_traces(uri, run, exp, df, job)
        for r in range(a.rounds):
            for path in ("fast", "public"):
                for linked in (False, True) if r % 2 == 0 else (True, False):  # order effects cancel
                    run = c.create_run(exp).info.run_id
                    t = time.perf_counter()
                    job = TraceJob(
                        TraceSettings(k=5, path=path), evalset.items, corpus.docs, evalset.digest,
                        prompt_version=(pv.name, 1) if linked else None,
                    )  # fmt: skip
                    write_traces(uri, run, exp, df, job)
                    times.setdefault((path, linked), []).append(time.perf_counter() - t)
                    got = mlflow.search_traces(
                        locations=[exp], run_id=run, filter_string=f"prompt = '{pv.name}/1'", return_type="list"
                    )
                    assert len(got) == (len(df) if linked else 0), (path, linked, len(got))  # measured what it says
    med = statistics.median
    print(f"{len(df)} traces per run, {a.rounds} rounds, sqlite")
    print(f"{'path':<8}{'without s':>11}{'with s':>9}{'added s':>9}{'added/trace ms':>16}{'ratio':>8}")
    for path in ("fast", "public"):
        off, on = times[(path, False)], times[(path, True)]
        ratio = med(b / x for x, b in zip(off, on, strict=True))
        added = med(b - x for x, b in zip(off, on, strict=True))
        print(
            f"{path:<8}{med(off):>11.2f}{med(on):>9.2f}{added:>9.2f}{added / len(df) * 1000:>16.2f}{ratio:>8.3f}"
        )
    for key, ts in times.items():
        print(f"  {key[0]:<7} {'with' if key[1] else 'without':<8}", " ".join(f"{t:.2f}" for t in ts))
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} (2 cores)")


if __name__ == "__main__":
    main()
