"""Racing vs the full sweep, from a full sweep's per-query tables (docs/racing.md, "Measured").

    python scripts/bench_racing.py FULL_SWEEP_ID --metric correctness [--racing-sweep RACING_SWEEP_ID]
        [--tracking-uri sqlite:///mlflow.db] [--batch-size 8] [--alpha 0.05] [--seed 0]

Reads every FINISHED config of FULL_SWEEP_ID (a sweep run without racing), replays racing on its
per-query values in the seeded racing order (``analysis.racing``: the same order, batches and
decisions as the sweep's racing loop) under both launcher schedules — every config at once
(joblib / Ray with a worker per config) and one after another in the sweep's order (the basic
launcher) — and prints, side by side: generation calls (items answered) racing vs full and their
ratio, the configs stopped, and the full sweep's winner and tie set (``select``'s rule: not worse
at p_holm < α) against the survivors. With ``--racing-sweep`` it also reads a real racing sweep
(run with ``racing=true`` on the same grid) and prints its calls and stops from the run tags.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from mlflow.tracking import MlflowClient

from rag_experiments.analysis.racing import batch_order, decide, split_stopped
from rag_experiments.analysis.select import select_config
from rag_experiments.evaluation.registry import higher_is_better
from rag_experiments.tracking.runs import run_data, sweep_children


def _values(runs, metric: str) -> tuple[list[str], dict[str, np.ndarray]]:
    """The generated ids in file order and, per config name, its values in racing order."""
    first = runs[0].table
    gen = first["generated"].astype(bool) if "generated" in first else np.ones(len(first), bool)
    ids = list(first.loc[gen, "id"].astype(str))
    return ids, {r.name: r.series(metric).reindex(ids).to_numpy(float) for r in runs}


def replay(values: dict[str, np.ndarray], order: list[str], batch: int, alpha: float, hib: bool,
           sequential: bool) -> dict[str, int]:
    """{config: items answered} under racing; ``order``: the configs in launch order."""
    n = len(next(iter(values.values())))
    k = len(values)
    ends = list(range(batch, n, batch))  # a decision after every batch but the last
    stop_at: dict[str, int] = {}
    for end in ends:
        for c in order:
            if c in stop_at:
                continue
            peers = order[: order.index(c) + 1] if sequential else order
            alive = [p for p in peers if p == c or stop_at.get(p, n) >= end]
            if len(alive) < 2:
                continue
            dec = decide({p: values[p][:end] for p in alive}, c, k, alpha, hib, with_bound=False)
            if dec.stop:
                stop_at[c] = end
    return {c: stop_at.get(c, n) for c in order}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep")
    p.add_argument("--metric", required=True)
    p.add_argument("--racing-sweep")
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    client = MlflowClient(tracking_uri=args.tracking_uri)
    runs = [run_data(client, r) for r in sweep_children(client, args.sweep)]
    hib = bool(higher_is_better(args.metric))
    ids, vals = _values(runs, args.metric)
    perm = batch_order(len(ids), args.seed)
    vals = {c: v[perm] for c, v in vals.items()}
    names = [r.name for r in runs]  # sweep_children: oldest first = the basic launcher's order
    n, k = len(ids), len(runs)
    sel = select_config(runs, args.metric, hib, [math.nan] * k, alpha=0.05)  # select's tie set
    tie = set(sel.table.loc[sel.table["tie"], "config"])
    best = sel.table.loc[sel.table["run_id"] == sel.best, "config"].iloc[0]
    print(f"full sweep {args.sweep}: {k} configs × {n} generated items = {k * n} generation calls")
    print(f"metric {args.metric}; batches of {args.batch_size}; α = {args.alpha}; seed {args.seed}")
    print(f"full winner: {best} ({args.metric} {sel.table['mean'].max() if hib else sel.table['mean'].min():.3f}); "
          f"tie set ({len(tie)}): {', '.join(sorted(tie))}")
    for label, seq in (("all at once (joblib/Ray)", False), ("one after another (basic)", True)):
        done = replay(vals, names, args.batch_size, args.alpha, hib, seq)
        calls = sum(done.values())
        stopped = {c for c, d in done.items() if d < n}
        print(f"\n[{label}] generation calls {calls} vs {k * n} full: {k * n / calls:.2f}× fewer; "
              f"stopped {len(stopped)} of {k}")
        print(f"  winner survives: {best not in stopped}; tie-set members stopped: "
              f"{sorted(tie & stopped) or 'none'}")
        for c in names:
            print(f"  {c:<60} answered {done[c]:>4}{'  (stopped)' if c in stopped else ''}")
    if args.racing_sweep:
        real = [run_data(client, r, with_table=False) for r in sweep_children(client, args.racing_sweep)]
        kept, stopped_runs = split_stopped(real)
        calls = sum(int(float(client.get_run(r.run_id).data.metrics.get("n_generated", 0))) for r in real)
        print(f"\n[racing sweep {args.racing_sweep}] generation calls {calls} vs {k * n} full: "
              f"{k * n / max(calls, 1):.2f}× fewer; stopped {len(stopped_runs)} of {len(real)}; survivors: "
              f"{', '.join(r.name for r in kept)}")
        print(f"  winner survives: {best in {r.name for r in kept}}; tie-set members stopped: "
              f"{sorted(tie & {r.name for r in stopped_runs}) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
