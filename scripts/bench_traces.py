"""What tracing costs: the same retrieval-only run on the bundled sample with and without traces.

    python scripts/bench_traces.py            # all 168 items, generator=none
    python scripts/bench_traces.py --limit 40
    python scripts/bench_traces.py --cold     # measured runs recompute every stage (a first run)
    python scripts/bench_traces.py --cold --public   # also the public-API writer (no fast path)

A first traced run fills the stage cache and creates the eval-set dataset (as the first run of a
sweep does), then each variant runs ``--repeat`` times in a fresh process (``force=true``) into the
same sqlite store. Printed: the wall
time of each process and, with traces, the run's ``traces`` tag (traces written and seconds
spent in ``log_traces``, dataset included).
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


def run(
    root: Path, store: str, traces: bool, limit: int | None, cold: bool = False, path: str = "auto"
) -> tuple[float, dict]:
    args = (
        [
            sys.executable,
            "-m",
            "rag_experiments.sweep",
            "generator=none",
            f"tracking.uri=sqlite:///{root}/{store}.db",
            f"tracking.artifact_root={root}/mlruns",
            f"tracking.traces={str(traces).lower()}",
            f"cache_dir={root}/cache",
            "progress=false",
            "force=true",
            f"hydra.run.dir={root}/outputs",
            "experiment_name=bench",
        ]
        + ([f"evalset.limit={limit}"] if limit else [])
        + (["cache_enabled=false"] if cold else [])
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAG_EXPERIMENTS_TRACES": path}
    env.pop("MLFLOW_TRACKING_URI", None)
    t = time.perf_counter()
    p = subprocess.run(args, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"sweep failed:\n{p.stderr[-3000:]}")
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{root}/{store}.db")
    exp = c.get_experiment_by_name("bench")
    r = c.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)[0]
    return wall, json.loads(r.data.tags.get("traces", "{}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=None, help="first N eval items (default: all)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument(
        "--cold", action="store_true", help="measured runs recompute every stage (cache_enabled=false)"
    )
    ap.add_argument(
        "--public", action="store_true", help="also traces=true through the public MLflow API (no fast path)"
    )
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        first = run(root, "store", True, a.limit)  # fills the stage cache, creates the eval-set dataset
        rows = {False: [], True: [], "public": []}
        for _ in range(a.repeat):
            for traces in (False, True):
                rows[traces].append(run(root, "store", traces, a.limit, a.cold))
            if a.public:
                rows["public"].append(run(root, "store", True, a.limit, a.cold, path="public"))
    report(rows[False], rows[True], first)
    if a.public:
        print("public MLflow API path (RAG_EXPERIMENTS_TRACES=public), same pairs:")
        report(rows[False], rows["public"], first)


def report(off: list[tuple[float, dict]], on: list[tuple[float, dict]], first: tuple[float, dict]) -> None:
    """Medians over the interleaved repetitions; ratios per pair (off_i, on_i), then their median:
    pairs run back to back, so a load change between them moves both alike."""
    print(
        f"{'rep':<6}{'traces=false s':>16}{'traces=true s':>15}{'log_traces s':>14}{'wall ratio':>12}{'log_traces/off':>16}"
    )
    for i, ((w0, _), (w1, info)) in enumerate(zip(off, on, strict=True)):
        print(
            f"{i:<6}{w0:>16.2f}{w1:>15.2f}{info['seconds']:>14.2f}{w1 / w0:>12.3f}{info['seconds'] / w0:>16.3f}"
        )
    med = statistics.median
    w_off, w_on = med(w for w, _ in off), med(w for w, _ in on)
    secs = med(i["seconds"] for _, i in on)
    print(
        f"median: traces=false {w_off:.2f} s, traces=true {w_on:.2f} s, wall overhead "
        f"{(med(w1 / w0 for (w0, _), (w1, _) in zip(off, on, strict=True)) - 1) * 100:.1f}%; "
        f"log_traces {secs:.2f} s for {on[-1][1]['n']} traces = "
        f"{med(i['seconds'] / w0 for (w0, _), (_, i) in zip(off, on, strict=True)) * 100:.1f}% of the traces=false run"
    )
    print(
        f"first traced run in a fresh store (also creates the eval-set dataset): log_traces {first[1]['seconds']} s"
    )
    print(f"load average {os.getloadavg()[0]:.1f} (2 cores; timings inflated by other jobs when > 2)")


if __name__ == "__main__":
    main()
