"""Racing vs the full sweep, from a full sweep's per-query tables (docs/racing.md, "Measured").

    python scripts/bench_racing.py FULL_SWEEP_ID[,ID2] --metric correctness[,faithfulness]
        [--racing-sweep RACING_SWEEP_ID] [--project 96 168] [--tracking-uri sqlite:///mlflow.db]
        [--batch-size 8] [--alpha 0.05] [--seed 0]

Reads every FINISHED config of FULL_SWEEP_ID (a sweep run without racing), replays racing on its
per-query values in the seeded racing order (``analysis.racing``: the same order, batches and
decisions as the sweep's racing loop) under both launcher schedules — every config at once
(joblib / Ray with a worker per config) and one after another in the sweep's order (the basic
launcher) — and prints, side by side: generation calls (items answered) racing vs full and their
ratio, the configs stopped, and the full sweep's winner and tie set (``select``'s rule: not worse
at p_holm < α) against the survivors, for the shipped method and its variants (rule "any",
max bet 3/4, batches of 4; ``analysis.racing.decide``). ``--project`` resamples the queries (paired)
to larger eval sets to show where racing starts to pay. With ``--racing-sweep`` it also reads a
real racing sweep (``racing=true`` on the same grid) and prints the items each config requested
(``n_generated``): a racing sweep run after the full one replays cached answers, but it requests
exactly the items a cold racing sweep would generate, so that count is its generation calls.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from mlflow.tracking import MlflowClient

from rag_experiments.analysis.racing import MAX_BET, RULE, batch_order, decide, split_stopped
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
           sequential: bool, rule: str = RULE, max_bet: float = MAX_BET) -> dict[str, int]:
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
            vals = {p: values[p][:end] for p in alive}
            if decide(vals, c, k, alpha, hib, False, rule, max_bet).stop:
                stop_at[c] = end
    return {c: stop_at.get(c, n) for c in order}


#: (rule, max bet, batch size or None = --batch-size): the method as shipped first, then variants
VARIANTS = [("leader", 0.5, None), ("any", 0.5, None), ("leader", 0.75, None), ("any", 0.75, None),
            ("any", 0.75, 4)]


def earliest_stop(k: int, alpha: float, max_bet: float) -> int:
    """The fewest items after which any config can be stopped: every d = −1 at the largest bet,
    (1 + max_bet)^t ≥ (K − 1)/α."""
    return math.ceil(math.log((k - 1) / alpha) / math.log1p(max_bet))


def metric_table(runs, metric: str, args) -> None:
    hib = bool(higher_is_better(metric))
    ids, vals = _values(runs, metric)
    perm = batch_order(len(ids), args.seed)
    vals = {c: v[perm] for c, v in vals.items()}
    names = [r.name for r in runs]  # sweep_children: oldest first = the basic launcher's order
    n, k = len(ids), len(runs)
    sel = select_config(runs, metric, hib, [math.nan] * k, alpha=0.05)  # select's tie set
    tie = set(sel.table.loc[sel.table["tie"], "config"])
    best = sel.table.loc[sel.table["run_id"] == sel.best, "config"].iloc[0]
    means = sel.table.set_index("config")["mean"]
    print(f"\n## {metric}: {k} configs × {n} generated items = {k * n} generation calls (full sweep)")
    print(f"full winner: {best} ({means[best]:.3f}); tie set ({len(tie)}, select: not worse at p_holm < 0.05): "
          f"{', '.join(sorted(tie))}")
    print("config means: " + "; ".join(f"{c} {m:.3f}" for c, m in means.sort_values(ascending=not hib).items()))
    print("\n| schedule | rule | max bet | batch | earliest stop | calls racing vs full | fewer | stopped "
          "| winner survives | tie set stopped |\n|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for label, seq in (("all at once (joblib/Ray)", False), ("one after another (basic)", True)):
        for rule, mb, b in VARIANTS:
            b = b or args.batch_size
            done = replay(vals, names, b, args.alpha, hib, seq, rule, mb)
            calls = sum(done.values())
            stopped = {c for c, d in done.items() if d < n}
            first = math.ceil(earliest_stop(k, args.alpha, mb) / b) * b
            print(f"| {label} | {rule} | {mb} | {b} | {first} | {calls} vs {k * n} | {k * n / calls:.2f}× | "
                  f"{len(stopped)} of {k} | {'yes' if best not in stopped else 'NO'} | "
                  f"{', '.join(sorted(tie & stopped)) or 'none'} |")
        done = replay(vals, names, args.batch_size, args.alpha, hib, seq)
        for c in names:
            if done[c] < n:
                print(f"  [{label}, shipped method] {c}: stopped at {done[c]} of {n}")
    if args.project:
        project(vals, names, best, tie, hib, args)
    print(f"\nbest case for this n and K (every loser stopped at the earliest batch, batch {args.batch_size}, "
          f"max bet 0.5): {k * n / (n + (k - 1) * min(n, math.ceil(earliest_stop(k, args.alpha, 0.5) / args.batch_size) * args.batch_size)):.2f}× fewer")


def project(vals: dict[str, np.ndarray], names: list[str], best: str, tie: set[str], hib: bool, args) -> None:
    """What racing would save on a larger eval set drawn like this one: queries resampled with
    replacement (paired: one draw of query indices for every config) to each size of
    ``--project``, ``--project-reps`` times; the all-at-once schedule with the shipped method."""
    rng = np.random.default_rng(args.seed)
    n0, k = len(next(iter(vals.values()))), len(names)
    print(f"\nprojection: eval sets of other sizes resampled from these {n0} queries (paired, "
          f"{args.project_reps} draws each; all at once, shipped method)")
    print("| n | calls racing / full (mean) | fewer (mean) | winner stopped (share of draws) "
          "| a tie-set member stopped |\n|---:|---:|---:|---:|---:|")
    for n in args.project:
        ratios, lost, tie_lost = [], 0, 0
        for _ in range(args.project_reps):
            idx = rng.integers(0, n0, n)
            done = replay({c: v[idx] for c, v in vals.items()}, names, args.batch_size, args.alpha, hib, False)
            ratios.append(sum(done.values()) / (k * n))
            lost += done[best] < n
            tie_lost += any(done[c] < n for c in tie)
        r = float(np.mean(ratios))
        print(f"| {n} | {r:.3f} | {1 / r:.2f}× | {lost / args.project_reps:.3f} | "
              f"{tie_lost / args.project_reps:.3f} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep", help="the full sweep's id (tag sweep_id); several, comma-separated, form one grid")
    p.add_argument("--metric", required=True, help="one or more metrics, comma-separated")
    p.add_argument("--racing-sweep")
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--alpha", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--project", type=int, nargs="*", default=[],
                   help="also project the savings to eval sets of these sizes (paired resampling)")
    p.add_argument("--project-reps", type=int, default=50)
    args = p.parse_args(argv)
    client = MlflowClient(tracking_uri=args.tracking_uri)
    children = [r for sid in args.sweep.split(",") for r in sweep_children(client, sid)]
    runs = [run_data(client, r) for r in sorted(children, key=lambda r: r.info.start_time or 0)]
    k = len(runs)
    print(f"full sweep {args.sweep}; batches of {args.batch_size}; α = {args.alpha}; seed {args.seed}; "
          f"K = {k}: each test at α/(K−1) = {args.alpha / max(k - 1, 1):.4f}")
    for metric in args.metric.split(","):
        metric_table(runs, metric.strip(), args)
    if args.racing_sweep:
        real_sweep(client, args, runs)
    return 0


def real_sweep(client, args, full_runs) -> None:
    """The racing sweep's own record: the items each config requested (``n_generated``: what a cold
    racing sweep generates, whatever the cache held) and its stops, beside the replay."""
    real = [run_data(client, r, with_table=False) for r in sweep_children(client, args.racing_sweep)]
    kept, stopped_runs = split_stopped(real)
    n = {r.name: int(float(client.get_run(r.run_id).data.metrics.get("n_generated", 0))) for r in real}
    full = sum(int(float(client.get_run(r.run_id).data.metrics.get("n_generated", 0))) for r in full_runs)
    calls = sum(n.values())
    print(f"\n## racing sweep {args.racing_sweep} (racing=true, its own runs and tags)")
    print(f"generation calls requested {calls} vs {full} full: {full / max(calls, 1):.2f}× fewer; "
          f"stopped {len(stopped_runs)} of {len(real)}")
    for r in real:
        t = r.tags
        print(f"  {r.name}: {n[r.name]} items, {t.get('racing.status', '?')}"
              + (f" at n={t.get('racing.stopped_at_n')} (delta {t.get('racing.delta')}, upper bound "
                 f"{t.get('racing.upper_bound')})" if t.get("racing.status") == "stopped" else ""))
    print(f"  survivors: {', '.join(r.name for r in kept)}")


if __name__ == "__main__":
    sys.exit(main())
