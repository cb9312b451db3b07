"""What tracing costs at scale: 1k / 5k / 20k eval items over a 5,000-document corpus; prints, asserts nothing.

    python scripts/bench_trace_scale.py                       # sizes 1000 5000 20000
    python scripts/bench_trace_scale.py --sizes 1000 --docs 1000

Corpus and eval set are synthesized (seeded, no download): documents of ~40 sentences drawn from a
Zipf-distributed vocabulary of made-up words; each eval item quotes one sentence of one document
as its gold evidence and asks with 6 of that sentence's words (half of them misspelt by one
letter), tagged by query length. Retrieval only (``retriever=bm25``, ``generator=none``), every
run cold (``cache_enabled=false``), each in a fresh process into a fresh sqlite store per size.

Per size (a fresh sqlite store each): a traces-off run, a first traced run (it creates the eval
set's evaluation dataset), a later traced run (the dataset is reused). Printed side by side, one
column per size (the ratios are the figures to read; absolute times are inflated by other jobs on
a shared 2-core machine, so the load average before every step is printed):

- cold run wall time, traces off / first traced run / later traced run, and their ratios;
- the ``traces`` stage (in-run timer: the run's ``timings`` tag / per-stage table row), of which
  the eval-set dataset (tag ``traces`` ``dataset_seconds``), and its share of the traces-off run,
  first run and later run;
- store growth per item per run (the later run; the first one without the dataset, which is
  written once per eval set: its tables' bytes, sqlite ``dbstat``), and the dataset's size;
- ``compare`` of two runs (``python -m rag_experiments.compare A B``, its wall time);
- reading one run's traces back (``mlflow.search_traces(run_id=...)``, full traces with spans).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
ENV.pop("MLFLOW_TRACKING_URI", None)


def synth(root: Path, n_docs: int, n_items: int, seed: int = 0) -> tuple[Path, Path]:
    """A JSONL corpus of ``n_docs`` documents and an eval set of ``n_items`` items (module doc)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(30000)})
    cum = list(itertools.accumulate(1 / (i + 1) for i in range(len(vocab))))  # Zipf, cumulated once
    docs, sentences = [], []
    for d in range(n_docs):
        sents = []
        for _ in range(40):
            words = rng.choices(vocab, cum_weights=cum, k=rng.randint(8, 18))
            sents.append(" ".join(words).capitalize() + ".")
        doc_id = f"doc{d:05d}.md"
        docs.append({"doc_id": doc_id, "title": doc_id, "text": " ".join(sents)})
        sentences += [(doc_id, s) for s in sents]
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    items = []
    for i, (doc_id, sent) in enumerate(rng.sample(sentences, n_items)):
        words = sent.rstrip(".").lower().split()
        q = rng.sample(words, min(6, len(words)))
        q = [w[:-1] + rng.choice(letters) if j % 2 and len(w) > 3 else w for j, w in enumerate(q)]
        items.append(
            {
                "id": f"q{i:05d}",
                "query": " ".join(q),
                "gold_evidence": [{"doc_id": doc_id, "quote": sent}],
                "tags": ["long" if len(words) > 12 else "short"],
            }
        )
    evalset = root / "evalset.jsonl"
    evalset.write_text("".join(json.dumps(r) + "\n" for r in items))
    return corpus, evalset


def sweep(root: Path, store: Path, corpus: Path, evalset: Path, n: int, traces: bool) -> dict:
    """One cold retrieval-only run in a fresh process: wall time and the run's tags."""
    args = [
        sys.executable,
        "-m",
        "rag_experiments.sweep",
        "corpus=dir",
        f"corpus.path={corpus}",
        "evalset=file",
        f"evalset.path={evalset}",
        f"evalset.limit={n}",
        "retriever=bm25",
        "generator=none",
        "chunking=fixed",
        f"tracking.uri=sqlite:///{store}",
        f"tracking.artifact_root={root}/mlruns",
        f"tracking.traces={str(traces).lower()}",
        f"cache_dir={root}/cache",
        "cache_enabled=false",
        "metrics.bootstrap_resamples=200",
        "progress=false",
        "force=true",
        f"hydra.run.dir={root}/outputs",
        "experiment_name=scale",
    ]
    t = time.perf_counter()
    p = subprocess.run(args, env=ENV, capture_output=True, text=True, cwd=root)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"sweep failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{store}")
    exp = c.get_experiment_by_name("scale")
    r = c.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"], max_results=1)[0]
    timings = json.loads(r.data.tags.get("timings", "{}"))
    return {
        "wall": wall,
        "run_id": r.info.run_id,
        "experiment_id": exp.experiment_id,
        "timings": timings,
        "stdout": p.stdout,
        "traces": json.loads(r.data.tags.get("traces", "{}")),
    }


def timed(cmd: list[str], root: Path) -> float:
    t = time.perf_counter()
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, cwd=root)
    if p.returncode != 0:
        sys.exit(f"{cmd[2]} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return time.perf_counter() - t


READ_BACK = """
import sys, time, mlflow
mlflow.set_tracking_uri(sys.argv[1])
t = time.perf_counter()
traces = mlflow.search_traces(locations=[sys.argv[3]], run_id=sys.argv[2], return_type="list")
print(len(traces), sum(len(t.data.spans) for t in traces), sum(len(t.info.assessments) for t in traces))
"""


def _dataset_bytes(store: Path) -> int:
    """Bytes of the eval-set dataset's tables (written once per eval set, not per run)."""
    import sqlite3

    with sqlite3.connect(store) as db:
        got = db.execute("SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name LIKE '%dataset%'").fetchone()
    return int(got[0])


def _load() -> str:
    """``uptime``'s load averages (1, 5, 15 min)."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def bench_size(root: Path, corpus: Path, evalset: Path, n: int) -> dict:
    """Per size, in a fresh store: a traces-off run, a first traced run (creates the eval-set
    dataset), a later traced run (reuses it); compare; read the later run's traces back."""
    work = root / f"n{n}"
    work.mkdir()
    store = work / "mlflow.db"
    loads = [_load()]
    off = sweep(work, store, corpus, evalset, n, False)
    size0, ds0 = store.stat().st_size, _dataset_bytes(store)
    loads.append(_load())
    first = sweep(work, store, corpus, evalset, n, True)  # creates the eval-set dataset (once)
    size1, ds1 = store.stat().st_size, _dataset_bytes(store)
    loads.append(_load())
    later = sweep(work, store, corpus, evalset, n, True)  # the dataset exists: reused
    size2 = store.stat().st_size
    uri = f"sqlite:///{store}"
    loads.append(_load())
    compare_s = timed(
        [
            sys.executable,
            "-m",
            "rag_experiments.compare",
            off["run_id"],
            later["run_id"],
            "--tracking-uri",
            uri,
        ],
        work,
    )
    loads.append(_load())
    t = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-c", READ_BACK, uri, later["run_id"], later["experiment_id"]],
        env=ENV,
        capture_output=True,
        text=True,
    )
    read_s = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"read-back failed:\n{p.stderr[-3000:]}")
    n_traces, n_spans, n_assess = (int(x) for x in p.stdout.split())

    def traces_s(r: dict) -> float:
        return r["timings"].get("traces_s", r["traces"].get("seconds", float("nan")))

    return {
        "n": n,
        "off_wall": off["wall"],
        "first_wall": first["wall"],
        "later_wall": later["wall"],
        "first_total_s": first["timings"].get("total_s", float("nan")),
        "later_total_s": later["timings"].get("total_s", float("nan")),
        "first_traces_s": traces_s(first),
        "first_dataset_s": first["traces"].get("dataset_seconds", float("nan")),
        "later_traces_s": traces_s(later),
        "n_traces": n_traces,
        "n_spans": n_spans,
        "n_assessments": n_assess,
        "growth_first_kb": (size1 - size0 - (ds1 - ds0)) / n / 1024,
        "growth_later_kb": (size2 - size1) / n / 1024,
        "dataset_kb": (ds1 - ds0) / 1024,
        "compare_s": compare_s,
        "read_s": read_s,
        "loads": loads,
        "stage_table": first["stdout"][first["stdout"].find("stage") :].split("\nmodel calls")[0],
    }


ROWS = [  # (label, formatter of one size's figures); sizes side by side as columns
    ("cold run, traces off (wall s)", lambda r: f"{r['off_wall']:.1f}"),
    ("cold run, traces on, first run of the eval set (wall s)", lambda r: f"{r['first_wall']:.1f}"),
    ("cold run, traces on, a later run (wall s)", lambda r: f"{r['later_wall']:.1f}"),
    (
        "wall ratio on / off: first, later",
        lambda r: f"{r['first_wall'] / r['off_wall']:.2f}, {r['later_wall'] / r['off_wall']:.2f}",
    ),
    ("tracing s (in-run timer), first run", lambda r: f"{r['first_traces_s']:.1f}"),
    ("  of which the eval-set dataset s", lambda r: f"{r['first_dataset_s']:.1f}"),
    ("tracing s, later run", lambda r: f"{r['later_traces_s']:.1f}"),
    ("tracing share of the off run: first run", lambda r: f"{r['first_traces_s'] / r['off_wall']:.1%}"),
    ("tracing share of the off run: later run", lambda r: f"{r['later_traces_s'] / r['off_wall']:.1%}"),
    (
        "tracing share of its own run (stage table): first, later",
        lambda r: (
            f"{r['first_traces_s'] / r['first_total_s']:.1%}, {r['later_traces_s'] / r['later_total_s']:.1%}"
        ),
    ),
    ("traces written per run", lambda r: f"{r['n_traces']}"),
    ("store growth KB / item / run (later run)", lambda r: f"{r['growth_later_kb']:.2f}"),
    ("store growth KB / item, first run w/o dataset", lambda r: f"{r['growth_first_kb']:.2f}"),
    ("eval-set dataset MB (once per eval set)", lambda r: f"{r['dataset_kb'] / 1024:.1f}"),
    ("compare of two runs (wall s)", lambda r: f"{r['compare_s']:.1f}"),
    ("read one run's traces back (wall s)", lambda r: f"{r['read_s']:.1f}"),
    ("load average (1 min) before each step", lambda r: " / ".join(x.split()[0] for x in r["loads"])),
]


def report(rows: list[dict]) -> None:
    width = max(len(label) for label, _ in ROWS)
    cols = [max(22, *(len(f(r)) for _, f in ROWS)) for r in rows]
    print(f"{'items':<{width}}  " + "  ".join(f"{r['n']:>{c}}" for r, c in zip(rows, cols, strict=True)))
    for label, f in ROWS:
        print(f"{label:<{width}}  " + "  ".join(f"{f(r):>{c}}" for r, c in zip(rows, cols, strict=True)))
    for r in rows:
        print(
            f"\n{r['n']} items: {r['n_spans']} spans, {r['n_assessments']} assessments read back; "
            f"per-stage table of the first traced run:\n{r['stage_table']}"
        )
    print(f"\nload average {_load()} (uptime; 2 cores: timings inflated by other jobs when > 2)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000])
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--keep", type=Path, help="work in this directory and keep it (default: a temp dir)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        corpus, evalset = synth(root, a.docs, max(a.sizes))
        rows = []
        for n in a.sizes:
            rows.append(bench_size(root, corpus, evalset, n))
            report(rows)  # after every size: a long session still leaves the finished rows
            print(f"[{n} items done, load {os.getloadavg()[0]:.1f}]", flush=True)


if __name__ == "__main__":
    main()
