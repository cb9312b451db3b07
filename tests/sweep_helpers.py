"""A tiny real corpus + eval set cut from the bundled sample, and the runners tests share.

``make_tiny`` writes the inputs; ``tiny_inputs`` loads them; ``tiny_pipeline`` runs the library
pipeline on them (markdown chunks, BM25 at k=3); ``run_sweep`` runs the sweep CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from rag_experiments.core.cache import StageCache
from rag_experiments.core.types import EvalItem
from rag_experiments.evalset.corpus import Corpus
from rag_experiments.evalset.load import EvalSet, sample_dir
from rag_experiments.run.pipeline import PipelineResult, run_pipeline
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages.chunking import MarkdownChunker
from rag_experiments.stages.retrieval import BM25Retriever

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


TinyInputs = tuple[Corpus, list[EvalItem], StageCache]


def tiny_inputs(root: Path, n_items: int) -> TinyInputs:
    """``make_tiny`` under ``root``, loaded: (corpus, eval items, a stage cache in ``root/cache``)."""
    docs, ev = make_tiny(root, n_items=n_items)
    corpus = Corpus(str(docs))
    return corpus, EvalSet(str(ev), corpus).items, StageCache(root / "cache")


def tiny_pipeline(inputs: TinyInputs, ks: tuple[int, ...] = (1, 3), **stages) -> PipelineResult:
    """``run_pipeline`` on ``tiny_inputs``: markdown chunks, BM25 at k=3, 50 bootstrap resamples.

    ``stages``: ``generator``, ``prompt``, ``judge``, ``pricing``, ``replicates`` (none: a
    retrieval-only run).
    """
    corpus, items, cache = inputs
    pricing, replicates = stages.pop("pricing", None), stages.pop("replicates", 1)
    built = Stages(
        chunker=MarkdownChunker(),
        chunking_cfg={"_target_": "rag_experiments.stages.chunking.MarkdownChunker"},
        retriever=stages.pop("retriever", None) or BM25Retriever(k=3),
        **stages,
    )
    settings = RunSettings(
        k=3, ks=tuple(ks), n_resamples=50, progress=False, pricing=pricing, replicates=replicates
    )
    return run_pipeline(built, PipelineData(corpus.docs, corpus.digest, items), settings, cache)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def run_sweep(
    root: Path, *args: str, check: bool = True, timeout: float = 900
) -> subprocess.CompletedProcess:
    """``python -m rag_experiments.sweep ARGS`` in ``root``, offline, with no inherited tracking URI;
    a non-zero exit raises (with the output's tails) unless ``check=False``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    p = subprocess.run(
        [sys.executable, "-m", "rag_experiments.sweep", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"sweep failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p


def tiny_job(root: Path, *overrides: str, n_items: int = 8, ctx=None):
    """One assembled job on ``make_tiny``'s inputs, as ``sweep.main`` builds it (Hydra's compose API,
    ``assemble.load_inputs``, ``assemble.job_settings``): a ``run.sweep.Job`` for ``run_job`` with a
    run store. ``overrides`` come after the tiny corpus's (BM25 unless they say otherwise); ``ctx``:
    Hydra's runtime (``assemble.HydraContext``), None for a single run."""
    import time

    from hydra import compose, initialize_config_dir

    from rag_experiments.run.assemble import job_settings, load_inputs
    from rag_experiments.run.sweep import describe_job

    docs, ev = make_tiny(root, n_items=n_items)
    base = [
        "corpus=dir", f"corpus.path={docs}", "evalset=file", f"evalset.path={ev}", "retriever=bm25",
        f"cache_dir={root}/cache", "progress=false", "experiment_name=test", "metrics.bootstrap_resamples=100",
        f"tracking.uri=sqlite:///{root}/mlflow.db", f"tracking.artifact_root={root}/mlruns",
    ]  # fmt: skip
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "rag_experiments" / "conf")):
        cfg = compose("config", overrides=[*base, *overrides])
    cache = StageCache(root / "cache")
    inputs = load_inputs(cfg, cache)
    return describe_job(job_settings(cfg, ctx), inputs, cache, time.perf_counter())
