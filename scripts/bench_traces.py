"""What tracing costs: the same retrieval-only run on the bundled sample with and without traces.

    python scripts/bench_traces.py            # all 168 items, generator=none
    python scripts/bench_traces.py --limit 40
    python scripts/bench_traces.py --cold     # measured runs recompute every stage (a first run)

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


def run(root: Path, store: str, traces: bool, limit: int | None, cold: bool = False) -> tuple[float, dict]:
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
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
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
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        first = run(root, "store", True, a.limit)  # fills the stage cache, creates the eval-set dataset
        rows = {False: [], True: []}
        for _ in range(a.repeat):
            for traces in (False, True):
                rows[traces].append(run(root, "store", traces, a.limit, a.cold))
    off, on = rows[False], rows[True]
    w_off, w_on = statistics.median(w for w, _ in off), statistics.median(w for w, _ in on)
    print(f"{'':<28}{'traces=false':>14}{'traces=true':>14}{'overhead':>10}")
    print(f"{'process wall time (s)':<28}{w_off:>14.1f}{w_on:>14.1f}{(w_on / w_off - 1) * 100:>9.1f}%")
    secs = statistics.median(i["seconds"] for _, i in on)
    print(
        f"log_traces: {on[-1][1]['n']} traces in {secs:.2f} s (dataset + spans + assessments) "
        f"= {secs / w_off * 100:.1f}% of the traces=false run"
    )
    print(
        f"first traced run in a fresh store (also creates the eval-set dataset): log_traces {first[1]['seconds']} s"
    )


if __name__ == "__main__":
    main()
