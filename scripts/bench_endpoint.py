"""A generation + LLM-judge workload against a simulated OpenAI-compatible endpoint at its limit
(docs/endpoints.md, "Measured against the limit and the peers").

The endpoint (127.0.0.1, chat completions and embeddings): lognormal latency (median
``--median-s``, sigma 0.5), ``--rpm`` requests per sliding minute and ``--in-flight`` requests at
once, both enforced with 429 + ``Retry-After``, and ``--p500`` of replies a 500. It answers each
judge protocol with a reply that protocol reads (JSON mode with the schema in the prompt, tool
calls, JSON schemas, logprobs, DeepEval's JSON keys). Each client runs ``--items`` generations,
then judges every answer with its own protocol. Reported: wall time against the bound (successful
requests ÷ rpm, or ÷ in-flight at the mean latency if tighter), rows dropped or NaN (an item
without an answer or a score), judge calls per answer, requests sent, retries, 429s, 500s.

Clients: ours with the limits declared (``rpm``, ``max_concurrency``) and with none declared
(adaptive concurrency and Retry-After alone), both judging with ``LLMJudge`` (claims split by the
LLM, then one logprob verdict per claim), and ours folded (``judge.fold=true``: the claims and their
verdicts in one constrained JSON call per answer, limits declared); ``mlflow.genai.evaluate`` (predict_fn and a scorer making
the same judge calls with the OpenAI SDK); RAGAS and DeepEval (scripts/bench_peers.py), each with
its defaults and with its documented concurrency setting at the endpoint's limits. A peer that is
not installed prints "not installed": they are the ``bench`` extra, in a venv of their own.

    python scripts/bench_endpoint.py                  # 200 items, 120 RPM, 4 in flight (~50 min)
    python scripts/bench_endpoint.py --items 40 --rpm 600 --clients ours,ragas
    python scripts/bench_endpoint.py --items 20 --rpm 6000 --clients ours,ours-folded   # calls per answer, both modes
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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_peers


class SimEndpoint:
    """The simulated endpoint; ``stats`` counts what it accepted, refused and failed."""

    def __init__(self, rpm: int, in_flight: int, median_s: float, p500: float, seed: int = 0) -> None:
        self.rpm, self.limit, self.median_s, self.p500 = rpm, in_flight, median_s, p500
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.window: deque[float] = deque()  # accept times within the last 60 s
        self.active = 0
        self.stats = {"ok": 0, "ok_judge": 0, "429_rpm": 0, "429_in_flight": 0, "500": 0}
        sim = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, code: int, body: dict, headers: dict | None = None) -> None:
                raw = json.dumps(body).encode()
                self.send_response(code)
                for k, v in {
                    "Content-Type": "application/json",
                    "Content-Length": str(len(raw)),
                    **(headers or {}),
                }.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                verdict, wait = sim.admit()
                if verdict != "ok":
                    return self._send(
                        429, {"error": {"message": f"rate limited ({verdict})"}}, {"Retry-After": str(wait)}
                    )
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
                        sim.stats["ok_judge"] += not prompt_text(body).startswith("Question ")
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


ANSWER = "Refunds take five business days. They are paid back to the original card."
CLAIMS = ["Refunds take five business days.", "Refunds are paid back to the original card."]
CONTEXT = "Refunds of order {i} take five business days. They are paid back to the original card."
QUESTIONS = [f"Question {i}: how long do refunds of order {i} take?" for i in range(10_000)]


def prompt_text(body: dict) -> str:
    """Every message's text of a chat request, joined (content parts flattened)."""
    parts = []
    for m in body.get("messages") or []:
        c = m.get("content")
        parts.append(c if isinstance(c, str) else json.dumps(c))
    return "\n".join(parts)


def schema_instance(schema: dict, defs: dict | None = None) -> object:
    """A small JSON value that ``schema`` accepts: every property of an object, arrays of two
    items, the first enum/const value, strings a sentence, integers 1 (RAGAS's "supported"), and
    ``$ref`` followed into ``$defs``."""
    defs = schema.get("$defs", schema.get("definitions", {})) if defs is None else defs
    if "$ref" in schema:
        return schema_instance(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [o for o in schema[key] if o.get("type") != "null"] or schema[key]
            return schema_instance(options[0], defs)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {k: schema_instance(v, defs) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [schema_instance(schema.get("items") or {}, defs) for _ in range(2)]
    return {"string": CLAIMS[0], "integer": 1, "number": 1.0, "boolean": True, "null": None}[kind]


def schema_in_prompt(prompt: str) -> dict | None:
    """The JSON schema written after "json_schema:" in a prompt (Instructor's JSON mode), or None."""
    at = prompt.find("json_schema:")
    if at < 0:
        return None
    try:
        schema, _ = json.JSONDecoder().raw_decode(prompt[at + len("json_schema:") :].lstrip())
    except ValueError:
        return None
    return schema if isinstance(schema, dict) else None


def chat_text(prompt: str) -> str:
    """The simulated model's reply to a free-text prompt: a valid reply for each judge protocol
    benchmarked (ours, DeepEval's faithfulness), else a two-sentence answer."""
    if "Break the answer below into short" in prompt:  # our LLMJudge.split
        return "\n".join(f"- {c}" for c in CLAIMS)
    if "You check whether a claim" in prompt:  # our verdict (constrained fallback)
        return "yes"
    if "List the answer's claims, each with" in prompt:  # our folded call (judge.fold=true)
        return json.dumps({"claims": [{"claim": c, "supported": "yes"} for c in CLAIMS]})
    low = prompt.lower()
    # DeepEval's faithfulness prompts ask for JSON with one key each (checked most specific first)
    if '"verdicts"' in low:
        return json.dumps({"verdicts": [{"verdict": "yes"} for _ in CLAIMS]})
    if '"truths"' in low:
        return json.dumps({"truths": CLAIMS})
    if '"claims"' in low:
        return json.dumps({"claims": CLAIMS})
    if '"reason"' in low:
        return json.dumps({"reason": "The claims follow from the context."})
    return ANSWER


def reply(path: str, body: dict) -> dict:
    """The simulated endpoint's 200 body: embeddings, a tool call (Instructor's structured output),
    a JSON-schema reply, a yes with logprobs (our judge), or :func:`chat_text`."""
    if path.endswith("/embeddings"):
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"index": i, "embedding": [1.0, float(len(t) % 7), 0.5]} for i, t in enumerate(inputs)]
        return {
            "object": "list",
            "data": data,
            "usage": {"prompt_tokens": 8 * len(inputs), "total_tokens": 8 * len(inputs)},
        }
    message: dict = {"role": "assistant", "content": None}
    logprobs = None
    tools, fmt = body.get("tools"), body.get("response_format") or {}
    if tools:
        fn = tools[0]["function"]
        args = json.dumps(schema_instance(fn.get("parameters") or {}))
        message["tool_calls"] = [
            {"id": "call_0", "type": "function", "function": {"name": fn["name"], "arguments": args}}
        ]
    elif fmt.get("type") == "json_schema":
        message["content"] = json.dumps(schema_instance(fmt["json_schema"].get("schema") or {}))
    elif fmt.get("type") == "json_object":  # Instructor's JSON mode: the schema is in the prompt
        schema = schema_in_prompt(prompt_text(body))
        message["content"] = json.dumps(schema_instance(schema)) if schema else chat_text(prompt_text(body))
    elif body.get("logprobs"):
        message["content"] = "yes"
        tops = [
            {"token": "yes", "logprob": -0.05, "bytes": None},
            {"token": "no", "logprob": -3.0, "bytes": None},
        ]
        logprobs = {"content": [{"token": "yes", "logprob": -0.05, "bytes": None, "top_logprobs": tops}]}
    else:
        message["content"] = chat_text(prompt_text(body))
    choice = {"index": 0, "message": message, "logprobs": logprobs,
              "finish_reason": "tool_calls" if tools else "stop"}  # fmt: skip
    return {"id": "sim", "object": "chat.completion", "created": 0, "model": body.get("model", "sim"),
            "choices": [choice], "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60}}  # fmt: skip


def bound_seconds(calls: int, rpm: float, in_flight: int, median_s: float) -> float:
    """The physical limit for ``calls`` successful requests: max(calls·60/rpm, calls·E[latency]/in_flight),
    E[latency] = median·exp(σ²/2) with σ = 0.5 (lognormal)."""
    mean_latency = median_s * math.exp(0.5**2 / 2)
    return max(calls / rpm * 60, calls * mean_latency / in_flight)


def judge_answers(judge, answers: list[str], contexts: list[str], workers: int = 4) -> list[bool]:
    """Our judge protocol per answer (``LLMJudge``: claims split by the LLM, then one verdict per
    claim; folded: both from one call); True where the answer was judged in full (no failed split
    or folded call, no unparseable verdict)."""
    from rag_experiments.core.parallel import thread_map

    def one(pair: tuple[str, str]) -> bool:
        if judge.fold:
            claims, verdicts, _ = judge.fold_verdicts(*pair)
        else:
            claims = judge.split(pair[0])
            verdicts = [] if judge.last_error() or not claims else judge.verdicts(claims, pair[1])
        return not judge.last_error() and bool(claims) and all(v.label != "unparseable" for v in verdicts)

    return thread_map(one, list(zip(answers, contexts, strict=True)), workers)


def run_ours(sim: SimEndpoint, n: int, declared: bool, fold: bool = False) -> dict:
    from rag_experiments.judge.llm import LLMJudge
    from rag_experiments.stages import endpoint
    from rag_experiments.stages.generation import OpenAICompatibleGenerator

    model = "sim-declared" if declared else "sim-adaptive"
    limits = {"rpm": sim.rpm, "max_concurrency": sim.limit} if declared else {}
    kw = {"base_url": sim.base_url, "model": model, "api_key_env": "BENCH_NO_KEY", "concurrency": 4, **limits}
    gen, judge = OpenAICompatibleGenerator(**kw), LLMJudge(**kw, fold=fold)
    before = endpoint.usage()
    t0 = time.perf_counter()
    answers = gen.generate([[{"role": "user", "content": q}] for q in QUESTIONS[:n]])
    ok = [False] * n
    live = [i for i, a in enumerate(answers) if not a.error]
    judged = judge_answers(judge, [answers[i].text for i in live], [CONTEXT.format(i=i) for i in live])
    for i, j in zip(live, judged, strict=True):
        ok[i] = j
    wall = time.perf_counter() - t0
    used = endpoint.usage_since(before)[f"{sim.base_url}#{model}"]
    return {"wall_s": wall, "dropped": n - sum(ok), "retries": int(used["retries"]), "judged": len(live)}


def run_mlflow(sim: SimEndpoint, n: int) -> dict:
    """mlflow.genai.evaluate: predict_fn generates, a scorer judges with our protocol (claims split
    by the LLM, one verdict per claim), both with the OpenAI SDK and its defaults (2 retries)."""
    import mlflow
    import openai
    from mlflow.genai.scorers import scorer

    from rag_experiments.judge.llm import DECOMPOSE_USER, VERDICT_SYSTEM, fill, verdict_user

    tmp = tempfile.mkdtemp(prefix="bench_endpoint_")
    mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
    mlflow.set_experiment("bench-endpoint")
    client = openai.OpenAI(base_url=sim.base_url, api_key="sim")
    chat = client.chat.completions.create

    def predict_fn(question: str) -> str:
        return (
            chat(model="sim-mlflow", messages=[{"role": "user", "content": question}])
            .choices[0]
            .message.content
        )

    @scorer
    def supported(inputs, outputs) -> bool:
        i = int(inputs["question"].split(":")[0].split()[-1])
        listed = chat(
            model="sim-mlflow", messages=[{"role": "user", "content": fill(DECOMPOSE_USER, answer=outputs)}]
        )
        claims = [ln[2:] for ln in listed.choices[0].message.content.splitlines() if ln.startswith("- ")]
        verdicts = [
            chat(model="sim-mlflow", max_tokens=3, logprobs=True, top_logprobs=20,
                 messages=[{"role": "system", "content": VERDICT_SYSTEM},
                           {"role": "user", "content": verdict_user(c, CONTEXT.format(i=i))}]).choices[0].message.content
            for c in claims
        ]  # fmt: skip
        return bool(claims) and all(v.strip().lower() == "yes" for v in verdicts)

    data = [{"inputs": {"question": q}} for q in QUESTIONS[:n]]
    t0 = time.perf_counter()
    result = mlflow.genai.evaluate(data=data, predict_fn=predict_fn, scorers=[supported])
    wall = time.perf_counter() - t0
    table = (
        result.tables["eval_results"]
        if hasattr(result, "tables") and "eval_results" in result.tables
        else None
    )
    scored = 0  # rows with an answer (state OK) and a verdict
    if table is not None:
        col = next((c for c in table.columns if c.startswith("supported")), None)
        ok = table["state"].astype(str).str.endswith("OK") if "state" in table.columns else True
        scored = int((table[col].notna() & ok).sum()) if col else 0
    # the SDK's retries are not counted by it
    return {"wall_s": wall, "dropped": n - scored if table is not None else None, "retries": None}


CLIENTS = {
    "ours": "ours, limits declared (`rpm`, `max_concurrency`)",
    "ours-adaptive": "ours, nothing declared (adaptive concurrency, `Retry-After`)",
    "ours-folded": "ours folded (`judge.fold=true`: claims and verdicts in one call), limits declared",
    "mlflow": "`mlflow.genai.evaluate` (predict_fn + a scorer, OpenAI SDK defaults)",
    "ragas": "RAGAS `evaluate`, its defaults (`RunConfig()`: 16 workers)",
    "ragas-limits": "RAGAS `evaluate`, `RunConfig(max_workers=in-flight)`",
    "deepeval": "DeepEval `evaluate`, its defaults (`AsyncConfig()`: 20 concurrent)",
    "deepeval-limits": "DeepEval `evaluate`, `AsyncConfig(max_concurrent=in-flight, throttle_value=4·60/rpm)`",
}


def run_client(name: str, sim: SimEndpoint, n: int) -> dict:
    """One client's row, or ``{"skipped": why}`` when its library is not installed."""
    if name in ("ours", "ours-adaptive", "ours-folded"):
        return run_ours(sim, n, declared=name != "ours-adaptive", fold=name == "ours-folded")
    if name == "mlflow":
        return run_mlflow(sim, n)
    import bench_peers

    bench_peers.set_offline_env()
    lib = name.split("-")[0]
    why = bench_peers.missing(lib)
    if why:
        return {"skipped": why}
    run = bench_peers.run_ragas if lib == "ragas" else bench_peers.run_deepeval
    return run(sim, n, name.endswith("-limits"), QUESTIONS, CONTEXT)


def table(rows: list[dict]) -> list[str]:
    """The Markdown table of docs/endpoints.md, one line per client."""
    out = ["| client | wall (s) | bound (s) | bound / wall | rows dropped or NaN | judge calls / answer "
           "| requests sent | retries | 429s | 500s |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if "skipped" in r:
            out.append(f"| {CLIENTS[r['client']]} | {r['skipped']} |" + " — |" * 8)
            continue
        s = r["server"]
        dropped = str(r["dropped"])
        if r["dropped"] and "judged" in r:  # where the rows went: no answer, or no score
            no_answer = r["items"] - r["judged"]
            dropped += f" ({no_answer} answers, {r['dropped'] - no_answer} scores)"
        if r.get("error"):
            dropped += f"; {r['error']}"
        retries = r["retries"] if r["retries"] is not None else "—"
        out.append(f"| {CLIENTS[r['client']]} | {r['wall_s']:.1f} | {r['bound_s']:.1f} | {r['bound_share']:.2f} | "
                   f"{dropped} | {r['judge_calls_per_answer']:.2f} | {r['requests']} | {retries} | {r['http_429']} | {s['500']} |")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--rpm", type=int, default=120)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--median-s", type=float, default=0.4)
    ap.add_argument("--p500", type=float, default=0.01)
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    names = args.clients.split(",")
    unknown = [c for c in names if c not in CLIENTS]
    if unknown:
        print(f"--clients: unknown client(s) {unknown} (known: {', '.join(CLIENTS)})", file=sys.stderr)
        return 2
    load_before = os.getloadavg()
    rows = []
    for name in names:
        sim = SimEndpoint(args.rpm, args.in_flight, args.median_s, args.p500)
        try:
            r = run_client(name, sim, args.items)
        finally:
            sim.close()
        r |= {"client": name, "items": args.items}
        if "skipped" not in r:
            s = dict(sim.stats)
            judged = r.get("judged", args.items)
            r |= {"server": s, "bound_s": bound_seconds(s["ok"], args.rpm, args.in_flight, args.median_s),
                  "http_429": s["429_rpm"] + s["429_in_flight"], "requests": s["ok"] + s["429_rpm"] + s["429_in_flight"] + s["500"],
                  "judge_calls_per_answer": s["ok_judge"] / max(1, judged)}  # fmt: skip
            r["bound_share"] = r["bound_s"] / r["wall_s"]
        rows.append(r)
        print(json.dumps(r), flush=True)
    load_after = os.getloadavg()
    print(f"\n{args.items} items, a generation each then the judge; {args.rpm} RPM, {args.in_flight} in flight, "
          f"median {args.median_s} s, {args.p500:.0%} 500s; load average (1, 5, 15 min) before "
          f"{', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in load_after)}")  # fmt: skip
    print("\n".join(table(rows)))
    if args.out:
        Path(args.out).write_text(json.dumps({"load_before": load_before, "load_after": load_after,
                                              "args": vars(args), "rows": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
