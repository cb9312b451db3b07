"""A generation + LLM-judge workload against a simulated OpenAI-compatible endpoint at its limit
(docs/endpoints.md, "Measured against the limit").

The endpoint (127.0.0.1, chat completions and embeddings): lognormal latency (median
``--median-s``, sigma 0.5), ``--rpm`` requests per sliding minute and ``--in-flight`` requests at
once, both enforced with 429 + ``Retry-After``, and ``--p500`` of replies a 500. Each client runs
``--items`` generations and then one judge call per answer; reported: wall time against the bound
(successful calls ÷ rpm), rows dropped (an item without an answer or a verdict), retries, 429s.

Clients: ours with the limits declared (``rpm``, ``max_concurrency``), ours with none declared
(adaptive concurrency and Retry-After alone), and ``mlflow.genai.evaluate`` (predict_fn and a
judge scorer calling the endpoint with the OpenAI SDK, MLflow's default concurrency and the SDK's
default retries). RAGAS and DeepEval are run when importable.

    python scripts/bench_endpoint.py                  # 200 items, 120 RPM, 4 in flight (~7 min a client)
    python scripts/bench_endpoint.py --items 40 --rpm 600 --clients ours
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class SimEndpoint:
    """The simulated endpoint; ``stats`` counts what it accepted, refused and failed."""

    def __init__(self, rpm: int, in_flight: int, median_s: float, p500: float, seed: int = 0) -> None:
        self.rpm, self.limit, self.median_s, self.p500 = rpm, in_flight, median_s, p500
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.window: deque[float] = deque()  # accept times within the last 60 s
        self.active = 0
        self.stats = {"ok": 0, "429_rpm": 0, "429_in_flight": 0, "500": 0}
        sim = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict, headers: dict | None = None) -> None:
                raw = json.dumps(body).encode()
                self.send_response(code)
                for k, v in {"Content-Type": "application/json", "Content-Length": str(len(raw)), **(headers or {})}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                verdict, wait = sim.admit()
                if verdict != "ok":
                    return self._send(429, {"error": {"message": f"rate limited ({verdict})"}}, {"Retry-After": str(wait)})
                try:
                    with sim.lock:
                        latency = sim.median_s * math.exp(0.5 * sim.rng.gauss(0, 1))
                        fail = sim.rng.random() < sim.p500
                    time.sleep(latency)
                    if fail:
                        with sim.lock:
                            sim.stats["500"] += 1
                        return self._send(500, {"error": {"message": "internal error"}})
                    with sim.lock:
                        sim.stats["ok"] += 1
                    self._send(200, reply(self.path, body))
                finally:
                    with sim.lock:
                        sim.active -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def admit(self) -> tuple[str, int]:
        """("ok", 0) and a slot taken, or (why, Retry-After seconds)."""
        with self.lock:
            now = time.monotonic()
            while self.window and self.window[0] <= now - 60:
                self.window.popleft()
            if self.active >= self.limit:
                self.stats["429_in_flight"] += 1
                return "in_flight", 1
            if len(self.window) >= self.rpm:
                self.stats["429_rpm"] += 1
                return "rpm", max(1, math.ceil(self.window[0] + 60 - now))
            self.window.append(now)
            self.active += 1
            return "ok", 0

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def reply(path: str, body: dict) -> dict:
    if path.endswith("/embeddings"):
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"index": i, "embedding": [1.0, float(len(t) % 7), 0.5]} for i, t in enumerate(inputs)]
        return {"object": "list", "data": data, "usage": {"prompt_tokens": 8 * len(inputs), "total_tokens": 8 * len(inputs)}}
    text = body["messages"][-1]["content"]
    content = "yes" if text.startswith("JUDGE") else f"answer to {text[:40]}"
    return {"id": "sim", "object": "chat.completion", "model": body.get("model", "sim"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}}  # fmt: skip


QUESTIONS = [f"Question {i}: how long do refunds of order {i} take?" for i in range(10_000)]


def run_ours(sim: SimEndpoint, n: int, declared: bool) -> dict:
    from rag_experiments.stages import endpoint
    from rag_experiments.stages.generation import OpenAICompatibleGenerator

    model = "sim-declared" if declared else "sim-adaptive"
    limits = {"rpm": sim.rpm, "max_concurrency": sim.limit} if declared else {}
    kw = {"base_url": sim.base_url, "model": model, "api_key_env": "BENCH_NO_KEY", "concurrency": 4, **limits}
    gen, judge = OpenAICompatibleGenerator(**kw), OpenAICompatibleGenerator(**kw, max_tokens=4)
    before = endpoint.usage()
    t0 = time.perf_counter()
    answers = gen.generate([[{"role": "user", "content": q}] for q in QUESTIONS[:n]])
    verdicts = judge.generate([[{"role": "user", "content": f"JUDGE is '{a.text}' supported?"}] for a in answers])
    wall = time.perf_counter() - t0
    used = endpoint.usage_since(before)[f"{sim.base_url}#{model}"]
    dropped = sum(bool(a.error) or bool(v.error) for a, v in zip(answers, verdicts, strict=True))
    return {"wall_s": wall, "dropped": dropped, "retries": int(used["retries"]), "calls": 2 * n}


def run_mlflow(sim: SimEndpoint, n: int) -> dict:
    """mlflow.genai.evaluate: predict_fn generates, a scorer judges, both with the OpenAI SDK."""
    import mlflow
    import openai
    from mlflow.genai.scorers import scorer

    tmp = tempfile.mkdtemp(prefix="bench_endpoint_")
    mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
    mlflow.set_experiment("bench-endpoint")
    client = openai.OpenAI(base_url=sim.base_url, api_key="sim")  # the SDK's defaults: 2 retries
    errors = {"predict": 0, "judge": 0}

    def predict_fn(question: str) -> str:
        try:
            r = client.chat.completions.create(model="sim-mlflow", messages=[{"role": "user", "content": question}])
        except Exception:
            errors["predict"] += 1
            raise
        return r.choices[0].message.content

    @scorer
    def supported(outputs) -> bool:
        try:
            r = client.chat.completions.create(
                model="sim-mlflow", max_tokens=4, messages=[{"role": "user", "content": f"JUDGE is '{outputs}' supported?"}]
            )
        except Exception:
            errors["judge"] += 1
            raise
        return r.choices[0].message.content == "yes"

    data = [{"inputs": {"question": q}} for q in QUESTIONS[:n]]
    t0 = time.perf_counter()
    result = mlflow.genai.evaluate(data=data, predict_fn=predict_fn, scorers=[supported])
    wall = time.perf_counter() - t0
    table = result.tables["eval_results"] if hasattr(result, "tables") and "eval_results" in result.tables else None
    scored = 0  # rows with an answer (state OK) and a verdict
    if table is not None:
        col = next((c for c in table.columns if c.startswith("supported")), None)
        ok = table["state"].astype(str).str.endswith("OK") if "state" in table.columns else True
        scored = int((table[col].notna() & ok).sum()) if col else 0
    # retries: the SDK's are not counted; "errors" are calls the SDK gave up on (mlflow may rerun the row)
    return {"wall_s": wall, "dropped": n - scored if table is not None else None, "retries": None,
            "calls": 2 * n, "errors": errors}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--rpm", type=int, default=120)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--median-s", type=float, default=0.4)
    ap.add_argument("--p500", type=float, default=0.01)
    ap.add_argument("--clients", default="ours,ours-adaptive,mlflow")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    rows = []
    for name in args.clients.split(","):
        sim = SimEndpoint(args.rpm, args.in_flight, args.median_s, args.p500)
        try:
            if name == "ours":
                r = run_ours(sim, args.items, declared=True)
            elif name == "ours-adaptive":
                r = run_ours(sim, args.items, declared=False)
            elif name == "mlflow":
                r = run_mlflow(sim, args.items)
            else:
                raise SystemExit(f"--clients: unknown client {name!r} (ours, ours-adaptive, mlflow)")
        finally:
            sim.close()
        # the physical limit: the rate limit, or the in-flight limit at the mean latency if tighter
        mean_latency = args.median_s * math.exp(0.5**2 / 2)
        bound = max(r["calls"] / args.rpm * 60, r["calls"] * mean_latency / args.in_flight)
        r |= {"client": name, "bound_s": bound, "bound_share": bound / r["wall_s"], "server": dict(sim.stats)}
        rows.append(r)
        print(json.dumps(r), flush=True)
    load = os.getloadavg()[0]
    print(f"\n{args.items} items, generation + 1 judge call each; {args.rpm} RPM, {args.in_flight} in flight, "
          f"median {args.median_s} s, {args.p500:.0%} 500s; load average {load:.1f}")  # fmt: skip
    print("| client | wall (s) | bound (s) | bound / wall | rows dropped | retries | 429s | 500s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["server"]
        print(f"| {r['client']} | {r['wall_s']:.1f} | {r['bound_s']:.1f} | {r['bound_share']:.2f} | {r['dropped']} | "
              f"{r['retries'] if r['retries'] is not None else '—'} | {s['429_rpm'] + s['429_in_flight']} | {s['500']} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps({"load": load, "args": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
