"""Benchmark the sweep machinery on the bundled sample; prints measured figures, asserts nothing.

Part "retrieval" (issue 3): the 18-config grid of conf/experiment/full_grid.yaml, retrieval only,
  (a) cold      fresh cache and store
  (b) warm      identical re-run (resume: every config already FINISHED) and, separately, a
                forced re-run that recomputes metrics and re-logs from the warm stage cache
  (c) naive     cache_enabled=false: every config re-chunks, reloads and re-embeds (and re-distils
                the static model), as a plain Hydra multirun would
  (d) lower     the unique work only: each unique (chunking, embedding) corpus and the queries
                embedded once (static model distilled once), nothing else
Part "generation" (issue 4): the default full run, then a 3-prompt sweep after it; time per
stage, model calls made and calls served from cache (read back from the runs' MLflow tags).
Part "traces" (issue 13): tracing overhead on a retrieval-only run of the sample, traces on vs off,
interleaved repetitions, fully cached and cold (``scripts/bench_traces.py``, run twice).
Part "tokps" (issue 11): llama.cpp prompt and decode tokens/s of the packaged SmolLM2 on real
k=5 prompts of the sample, with the server settings before (2 slots, spinning threads, prompt
cache) and after (1 slot, poll=0, no prompt cache), read from the server's own per-request timings.

Every scenario runs in a fresh subprocess (imports and model loads included) and its peak RSS
is read from the child's rusage.

    python scripts/bench_sweep.py [--part retrieval|generation|traces|tokps|all] [--workdir DIR] [--skip-naive]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

LOWER_BOUND = r"""
import os, sys, json
os.environ["HF_HUB_OFFLINE"] = "1"; os.environ["TRANSFORMERS_OFFLINE"] = "1"
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from rag_experiments.evalset.corpus import Corpus
from rag_experiments.evalset.load import EvalSet, sample_dir
from rag_experiments.stages.chunking import chunk_corpus
corpus = Corpus(str(sample_dir() / "docs"))
queries = [it.query for it in EvalSet(str(sample_dir() / "evalset.jsonl"), corpus).items]
conf = sys.argv[1]; cache_dir = sys.argv[2]
with initialize_config_dir(config_dir=conf, version_base="1.3"):
    chunkings = {c: instantiate(compose("config", overrides=[f"chunking={c}"]).chunking) for c in ("fixed", "sentence", "markdown")}
    embedders = {e: instantiate(compose("config", overrides=[f"embedding={e}", f"cache_dir={cache_dir}"]).embedding) for e in ("minilm", "static")}
for c, chunker in chunkings.items():
    texts = [ch.text for ch in chunk_corpus(chunker, corpus.docs)]
    for e, emb in embedders.items():
        emb.encode(texts, kind="passage")
for emb in embedders.values():
    emb.encode(queries, kind="query")
"""


TOKPS = r"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
import httpx
from hydra.utils import instantiate
from omegaconf import OmegaConf
from rag_experiments.evalset.corpus import Corpus
from rag_experiments.evalset.load import EvalSet, sample_dir
from rag_experiments.stages.chunking import MarkdownChunker, chunk_corpus
from rag_experiments.stages.generation import local_server
server, body, n, conf = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
concurrency = body.pop("_concurrency", 1)
corpus = Corpus(str(sample_dir() / "docs"))
items = EvalSet(str(sample_dir() / "evalset.jsonl"), corpus).items
chunks = chunk_corpus(MarkdownChunker(), corpus.docs)
prompt = instantiate(OmegaConf.load(f"{conf}/prompt/concise.yaml"))
prompts = [prompt.render(items[i].query, chunks[5 * i : 5 * i + 5]) for i in range(n)]
url = local_server(**server) + "/chat/completions"
def one(messages):
    r = httpx.post(url, json={"messages": messages, "max_tokens": 96, "temperature": 0, "seed": 0, **body}, timeout=900)
    return r.json()["timings"]
one(prompts[0][:1] + [{"role": "user", "content": "hi"}])  # warm-up
t = time.perf_counter()
with ThreadPoolExecutor(concurrency) as pool:
    ts = list(pool.map(one, prompts))
wall = time.perf_counter() - t
pn, pms = sum(x["prompt_n"] for x in ts), sum(x["prompt_ms"] for x in ts)
dn, dms = sum(x["predicted_n"] for x in ts), sum(x["predicted_ms"] for x in ts)
print(json.dumps({"prompt_tokens": pn, "prompt_tok_s": pn / pms * 1e3, "decode_tokens": dn,
                  "decode_tok_s": dn / dms * 1e3, "wall_s": wall, "s_per_answer": wall / n}))
"""

# Server settings of the local generator before and after issue 11 (conf/generator/local.yaml).
TOKPS_SETTINGS = {
    "before (2 slots, poll 50, prompt cache)": (
        {"n_threads": 2, "n_parallel": 2, "poll": 50},
        {"repeat_penalty": 1.15, "_concurrency": 2},
    ),
    "after (1 slot, poll 0, no prompt cache)": (
        {"n_threads": 2, "n_parallel": 1, "poll": 0},
        {"repeat_penalty": 1.15, "cache_prompt": False, "_concurrency": 2},
    ),
    "after, 1 thread": (
        {"n_threads": 1, "n_parallel": 1, "poll": 0},
        {"repeat_penalty": 1.15, "cache_prompt": False, "_concurrency": 1},
    ),
}


def tokps(work: Path, n: int) -> None:
    """Prompt and decode tok/s per server setting, each in a fresh process (own server)."""
    conf = str(REPO / "rag_experiments" / "conf")
    print(f"\n## llama.cpp tokens/s, SmolLM2-135M Q4_1, {n} k=5 prompts of the sample (max_tokens 96)")
    print(f"load average before: {os.getloadavg()[0]:.1f} (contention inflates every figure)")
    print(f"{'setting':<42} {'prompt tok':>10} {'prompt tok/s':>12} {'decode tok/s':>12} {'s/answer':>9}")
    for name, (server, body) in TOKPS_SETTINGS.items():
        _, _, out = run([PY, "-c", TOKPS, json.dumps(server), json.dumps(body), str(n), conf], work)
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"{name:<42} {r['prompt_tokens'] / n:>10.0f} {r['prompt_tok_s']:>12.1f} "
            f"{r['decode_tok_s']:>12.1f} {r['s_per_answer']:>9.1f}"
        )


def run(cmd: list[str], cwd: Path, env: dict | None = None) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB of the child, stdout) for one subprocess."""
    t = time.perf_counter()
    p = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"command failed: {' '.join(cmd)}\n{out[-3000:]}")
    return wall, ru.ru_maxrss / 1024, out


def sweep(*args: str) -> list[str]:
    return [PY, "-m", "rag_experiments.sweep", *args, "progress=false"]


def retrieval(work: Path, skip_naive: bool) -> None:
    grid = ["+experiment=full_grid", "generator=none", f"hydra.sweep.dir={work}/multirun"]
    store = lambda name: [f"tracking.uri=sqlite:///{work}/{name}.db", f"tracking.artifact_root={work}/mlruns"]  # noqa: E731
    res = {}
    res["cold"] = run(sweep(*grid, *store("a"), f"cache_dir={work}/cache"), work)
    res["warm (resume)"] = run(sweep(*grid, *store("a"), f"cache_dir={work}/cache"), work)
    res["warm (force, from cache)"] = run(
        sweep(*grid, *store("b"), f"cache_dir={work}/cache", "force=true"), work
    )
    if not skip_naive:
        res["naive (no cache)"] = run(
            sweep(*grid, *store("c"), f"cache_dir={work}/nocache", "cache_enabled=false"), work
        )
    res["lower bound"] = run(
        [PY, "-c", LOWER_BOUND, str(REPO / "rag_experiments" / "conf"), str(work / "lb_cache")], work
    )
    print("\n## retrieval grid: 3 chunkings x 2 embeddings x 3 k = 18 configs, bundled sample")
    print(f"{'scenario':<28} {'wall s':>8} {'peak RSS MiB':>13}")
    for name, (wall, rss, _) in res.items():
        print(f"{name:<28} {wall:>8.1f} {rss:>13.0f}")
    cold, lower = res["cold"][0], res["lower bound"][0]
    print(f"skipped on resume: {res['warm (resume)'][2].count('[skip]')} of 18")
    if "naive (no cache)" in res:
        print(f"naive/cold        {res['naive (no cache)'][0] / cold:6.2f}   (target >= 5)")
    print(f"cold/lower-bound  {cold / lower:6.2f}   (target <= 1.3)")
    print(f"warm/cold         {res['warm (resume)'][0] / cold:6.3f}   (identical re-run; target <= 0.05)")
    print(
        f"warm-force/cold   {res['warm (force, from cache)'][0] / cold:6.3f}   (recompute metrics + re-log from cache)"
    )


def _child_stats(db: Path, experiment: str) -> list[dict]:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = c.get_experiment_by_name(experiment)
    runs = c.search_runs([exp.experiment_id], max_results=100, order_by=["attributes.start_time ASC"])
    return [
        {
            "name": r.info.run_name,
            "timings": json.loads(r.data.tags.get("timings", "{}")),
            "calls": json.loads(r.data.tags.get("model_calls", "{}")),
        }
        for r in runs
        if r.data.tags.get("is_parent") != "true"
    ]


def generation(work: Path, limit: int | None) -> None:
    store = [
        *([f"evalset.limit={limit}"] if limit else []),
        f"tracking.uri=sqlite:///{work}/gen.db",
        f"tracking.artifact_root={work}/mlruns",
        f"cache_dir={work}/cache",
        f"hydra.sweep.dir={work}/multirun",
        f"hydra.run.dir={work}/outputs",
    ]
    t_default, rss_default, out = run(sweep(*store), work)
    t_prompts, rss_prompts, out2 = run(
        sweep("+experiment=ablate_prompt", "experiment_name=rag-sample", *store), work
    )
    n = limit or "all 168"
    print(
        f"\n## full pipeline on the bundled sample, {n} queries (generator=local SmolLM2-135M, judge=heuristic)"
    )
    print(f"default run: {t_default:.1f} s wall (target <= 300 s), peak RSS {rss_default:.0f} MiB")
    print(f"3-prompt sweep after it: {t_prompts:.1f} s wall, peak RSS {rss_prompts:.0f} MiB")
    print(f"{'run':<40} {'chunk':>6} {'retr':>6} {'gen':>7} {'judge':>7} {'total':>7}  model calls")
    for r in _child_stats(work / "gen.db", "rag-sample"):
        t = r["timings"]
        print(
            f"{r['name'][:40]:<40} {t.get('chunking_s', 0):>6.1f} {t.get('retrieval_s', 0):>6.1f} "
            f"{t.get('generation_s', 0):>7.1f} {t.get('judging_s', 0):>7.1f} {t.get('total_s', 0):>7.1f}  {r['calls']}"
        )
    for line in (out + out2).splitlines():
        if line.startswith(("model calls", "[skip]")):
            print("  " + line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=["retrieval", "generation", "traces", "tokps", "all"], default="all")
    ap.add_argument("--tokps-n", type=int, default=6, help="tokps part: prompts per setting")
    ap.add_argument("--workdir", help="scratch dir (default: a fresh temp dir, removed afterwards)")
    ap.add_argument("--skip-naive", action="store_true", help="skip the slow no-cache scenario")
    ap.add_argument("--limit", type=int, help="generation part: first N eval items only")
    ap.add_argument("--repeat", type=int, default=3, help="traces part: interleaved on/off pairs")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_sweep_"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    print(f"workdir {work}; cores {os.cpu_count()}; python {sys.version.split()[0]}")
    try:
        if args.part in ("retrieval", "all"):
            retrieval(work / "retrieval", args.skip_naive) if (work / "retrieval").mkdir(
                exist_ok=True
            ) is None else None
        if args.part in ("generation", "all"):
            (work / "generation").mkdir(exist_ok=True)
            generation(work / "generation", args.limit)
        if args.part in ("traces", "all"):
            for mode in ([], ["--cold"]):
                print(f"\n== traces: {'cold' if mode else 'fully cached'} re-runs", flush=True)
                subprocess.run(
                    [PY, str(REPO / "scripts" / "bench_traces.py"), "--repeat", str(args.repeat), *mode]
                )
        if args.part in ("tokps", "all"):
            tokps(work, args.tokps_n)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
