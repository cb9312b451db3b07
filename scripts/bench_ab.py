"""Paired A/B benchmark of two git revisions: CPU and wall per stage, side by side with the load.

Each revision runs in a worktree of its own (made here with ``git worktree add --detach`` under
``--workdir`` unless it exists, the shared ``.venv`` symlinked in, ``PYTHONPATH`` set to it, so the
revision's code is what runs). Runs alternate A B, B A, A B, … (a drift of the machine's load falls
on both sides), each with fresh stores under ``--workdir``. Per run:

- **CPU**: user + sys of the whole process tree (the sweep and what it ran: the llama.cpp server),
  read from ``/proc`` while it lives and from ``getrusage(RUSAGE_CHILDREN)`` when it ends;
- **CPU per block**: the tree's CPU between the run's progress lines, charged to the block that
  printed ``[name] started`` (``[judging]``, ``[judge card: verdicts]``, …; ``other`` outside any);
- **wall per stage**: the timing table the run prints (``stage seconds share``);
- **load**: ``os.getloadavg()`` before and after.

On a shared machine wall times follow the load; CPU seconds much less. A ratio is B / A of the
medians over the pairs. Prints figures, asserts nothing (a timed assertion belongs in no test).

    python scripts/bench_ab.py --a 3824cda --b HEAD --pairs 3
    python scripts/bench_ab.py --a main --b h-perf -- retriever=bm25 generation_subset=6

The arguments after ``--`` replace the default sweep overrides (the issue-42 run below); the
tracking store, cache and Hydra dirs are always per-run places under ``--workdir``.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ARGS = (
    "retriever=bm25",
    "generation_subset=6",
    "judge=heuristic",
    "cache_enabled=false",
    "force=true",
)
_TABLE_HEAD = re.compile(r"^stage\s+seconds\s+share\s*$")
_TABLE_ROW = re.compile(r"^(\w+)\s+(-?\d+(?:\.\d+)?)(?:\s+(-?\d+(?:\.\d+)?)%)?")
_BLOCK = re.compile(r"^\[([^\]]+)\] (started|done|interrupted)\b")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_timing_table(text: str) -> dict[str, float]:
    """The last timing table in a run's output: stage -> seconds (``total`` included).

    The table is a header ``stage  seconds  share`` then one row per stage ``name  12.3  45.6%``
    and a ``total  27.0`` row; anything after ``total`` (or a line that is no row) ends it."""
    out: dict[str, float] = {}
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if _TABLE_HEAD.match(line.strip())]
    if not heads:
        return out
    for line in lines[heads[-1] + 1 :]:
        m = _TABLE_ROW.match(line.strip())
        if not m:
            break
        out[m.group(1)] = float(m.group(2))
        if m.group(1) == "total":
            break
    return out


def block_cpu(events: list[tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per progress block from ``(line, tree_cpu_s)`` events in output order: the CPU
    between an event and the next is charged to the block whose ``[name] started`` line is the
    latest not yet closed by its ``done`` (``other`` when none is open; the first event is the
    start of the run at CPU 0 when it is not a block line)."""
    out: dict[str, float] = {}
    current, last = "other", 0.0
    for line, cpu in events:
        out[current] = out.get(current, 0.0) + max(cpu - last, 0.0)
        last = cpu
        m = _BLOCK.match(line.strip())
        if m:
            current = m.group(1) if m.group(2) == "started" else "other"
    return {k: round(v, 2) for k, v in out.items() if v > 0}


def _proc_children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids


def tree_cpu(pid: int) -> float:
    """User + sys seconds of ``pid`` and its live descendants, with the children they reaped."""
    kids, total, todo = _proc_children(), 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in f[11:15]) / _TICK  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            continue
        todo += kids.get(p, [])
    return total


@dataclass
class Run:
    rev: str
    cpu_s: float
    wall_s: float
    stages: dict[str, float]
    blocks: dict[str, float]
    load: tuple[float, float]
    rc: int
    log: str = ""
    extra: dict = field(default_factory=dict)


def worktree(rev: str, workdir: Path, venv: Path) -> Path:
    """A detached worktree of ``rev`` under ``workdir`` with ``venv`` linked in (made once)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=10", rev], check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    wt = workdir / f"wt-{sha}"
    if not wt.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(wt), sha], check=True)
    if not (wt / ".venv").exists():
        (wt / ".venv").symlink_to(venv)
    return wt


def run_once(wt: Path, rev: str, args: list[str], rundir: Path) -> Run:
    """One run of the sweep at worktree ``wt``, its CPU, wall, timing table and blocks."""
    rundir.mkdir(parents=True, exist_ok=True)
    places = [f"tracking.uri=sqlite:///{rundir}/mlflow.db", f"tracking.artifact_root={rundir}/mlruns",
              f"cache_dir={rundir}/cache", f"hydra.run.dir={rundir}/hydra"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(wt), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    cmd = [str(wt / ".venv" / "bin" / "python"), "-m", "rag_experiments.sweep", *args, *places]
    load0 = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=wt, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    events: list[tuple[str, float]] = [("", 0.0)]
    lines: list[str] = []
    peak = [0.0]

    def sample() -> None:  # the tree's CPU also between lines: a child's CPU is lost when it ends unreaped
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_cpu(proc.pid))
            time.sleep(0.5)

    threading.Thread(target=sample, daemon=True).start()
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if _BLOCK.match(line.strip()):
            events.append((line, tree_cpu(proc.pid)))
    rc = proc.wait()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    events.append(("", max(cpu, peak[0])))
    text = "".join(lines)
    (rundir / "out.txt").write_text(text)
    return Run(rev, cpu, wall, parse_timing_table(text), block_cpu(events), (load0, os.getloadavg()[0]), rc,
               log=str(rundir / "out.txt"))  # fmt: skip


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or b is None else f"{b / a:.2f}"


def summary(runs_a: list[Run], runs_b: list[Run], name_a: str, name_b: str) -> str:
    """Medians of A and B and their ratio B/A: whole-tree CPU and wall, then CPU per progress
    block, then wall per stage of the timing table; the per-pair values and the load under them."""
    rows = [("CPU, whole tree", [r.cpu_s for r in runs_a], [r.cpu_s for r in runs_b]),
            ("wall, whole run", [r.wall_s for r in runs_a], [r.wall_s for r in runs_b])]  # fmt: skip
    blocks = list(dict.fromkeys(k for r in runs_a + runs_b for k in r.blocks))
    rows += [(f"CPU [{k}]", [r.blocks.get(k, 0.0) for r in runs_a], [r.blocks.get(k, 0.0) for r in runs_b])
             for k in blocks]  # fmt: skip
    stages = list(dict.fromkeys(k for r in runs_a + runs_b for k in r.stages))
    rows += [(f"wall {k}", [r.stages[k] for r in runs_a if k in r.stages], [r.stages[k] for r in runs_b if k in r.stages])
             for k in stages]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    out = [f"{'':<{width}}  {name_a[:12]:>12}  {name_b[:12]:>12}  ratio  per pair (A / B)"]
    for label, a, b in rows:
        ma, mb = _median(a), _median(b)
        pairs = "  ".join(f"{x:.1f}/{y:.1f}" for x, y in zip(a, b, strict=False))
        out.append(f"{label:<{width}}  {_fmt(ma):>12}  {_fmt(mb):>12}  {_ratio(ma, mb):>5}  {pairs}")
    loads = "  ".join(f"{ra.load[0]:.1f}-{ra.load[1]:.1f}/{rb.load[0]:.1f}-{rb.load[1]:.1f}"
                      for ra, rb in zip(runs_a, runs_b, strict=False))  # fmt: skip
    out.append(f"{'load (1-min avg, start-end)':<{width}}  {'':>12}  {'':>12}  {'':>5}  {loads}")
    bad = [r for r in runs_a + runs_b if r.rc != 0]
    if bad:
        out.append("FAILED runs (exit code != 0): " + ", ".join(f"{r.rev} rc={r.rc} ({r.log})" for r in bad))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", default="3824cda", help="the reference revision (default 3824cda)")
    ap.add_argument("--b", default="HEAD", help="the revision measured against it (default HEAD)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench_ab"))
    ap.add_argument("--venv", type=Path, default=REPO / ".venv", help="the virtualenv both worktrees use")
    ns = ap.parse_args(own)
    args = extra or list(DEFAULT_ARGS)
    ns.workdir.mkdir(parents=True, exist_ok=True)
    venv = ns.venv.resolve()
    wts = {"a": worktree(ns.a, ns.workdir, venv), "b": worktree(ns.b, ns.workdir, venv)}
    runs: dict[str, list[Run]] = {"a": [], "b": []}
    for i in range(ns.pairs):
        for side in ("a", "b") if i % 2 == 0 else ("b", "a"):
            rev = ns.a if side == "a" else ns.b
            r = run_once(wts[side], rev, args, ns.workdir / "runs" / f"{i}-{side}")
            runs[side].append(r)
            print(f"pair {i + 1} {side}={rev}: cpu {r.cpu_s:.1f} s, wall {r.wall_s:.1f} s, load "
                  f"{r.load[0]:.1f}-{r.load[1]:.1f}, rc {r.rc}, stages {r.stages}, cpu blocks {r.blocks}",
                  flush=True)  # fmt: skip
    print()
    print(f"A = {ns.a}, B = {ns.b}, {ns.pairs} alternating pairs; ratio = median B / median A")
    print(summary(runs["a"], runs["b"], ns.a, ns.b))
    return 0 if all(r.rc == 0 for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
