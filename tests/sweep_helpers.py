"""A tiny real corpus + eval set cut from the bundled sample, and a runner for the sweep CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rag_experiments.evalset import sample_dir

TINY_DOCS = ("webhook-retries.md", "rate-limits.md", "refunds.md", "idempotency.md")
REPO = Path(__file__).resolve().parent.parent


def make_tiny(root: Path, n_items: int = 8) -> tuple[Path, Path]:
    """Four sample documents and the eval items whose evidence lies only in them (+1 unanswerable)."""
    docs = root / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    for name in TINY_DOCS:
        shutil.copy(sample_dir() / "docs" / name, docs / name)
    rows, unanswerable = [], None
    for line in (sample_dir() / "evalset.jsonl").read_text().splitlines():
        r = json.loads(line)
        ev = r.get("gold_evidence") or []
        if not ev and unanswerable is None:
            unanswerable = r
        elif ev and all(e["doc_id"] in TINY_DOCS for e in ev) and len(rows) < n_items - 1:
            rows.append(r)
    rows.append(unanswerable)
    ev_path = root / "evalset.jsonl"
    ev_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return docs, ev_path


def sweep_args(root: Path, docs: Path, ev: Path) -> list[str]:
    return [
        "corpus=dir",
        f"corpus.path={docs}",
        "evalset=file",
        f"evalset.path={ev}",
        f"tracking.uri=sqlite:///{root}/mlflow.db",
        f"tracking.artifact_root={root}/mlruns",
        f"cache_dir={root}/cache",
        "progress=false",
        f"hydra.sweep.dir={root}/multirun",
        f"hydra.run.dir={root}/outputs",
        "experiment_name=test",
    ]


def run_sweep(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    p = subprocess.run(
        [sys.executable, "-m", "rag_experiments.sweep", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"sweep failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p
