"""``dry_run=true``: what a sweep would call, and cost, before it spends anything (docs/endpoints.md,
"Dry run").

    python -m rag_experiments.sweep -m prompt=concise,cite generator=openai dry_run=true

Every config is composed, checked and assembled as for a run; then the real pipeline runs on the
eval set with the endpoint client in dry mode (``stages.dry_calls``): no request is sent, each one
is recorded as the real step built it, and the steps read placeholder replies. No MLflow run is
created (the store is only read, to see which configs the sweep would skip as FINISHED). The stage
cache is read, never written: hits are counted as free, and what one config computes is kept in
memory for the next (:class:`DryCache`), as a real sweep's cache would serve it. Printed: a row per
config and remote step (calls, input tokens, output tokens at most, cost, cache hits), the totals,
the budget's verdict and each endpoint's least wall time under its declared limits. Exit 0; bad
input exits 2 as a run would.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag_experiments.core.cache import StageCache
from rag_experiments.core.formatting import text_table
from rag_experiments.core.identity import code_fingerprint
from rag_experiments.core.run_names import run_name, varying_keys
from rag_experiments.core.slots import SLOTS, steps
from rag_experiments.judge.validity import add_card
from rag_experiments.run.assemble import ComposedJob, print_problems
from rag_experiments.run.pipeline import run_pipeline
from rag_experiments.run.types import JobSettings
from rag_experiments.stages import call_budget, dry_calls, endpoint

#: the table's lines for calls made outside a slot's step: the judge's card and the config checks
#: (an embeddings probe, an app's); the card's stage-cache stores
CARD, CHECKS = "judge card", "checks"
CARD_STORES = ("card_verdict", "judge_card")


def lines() -> list[str]:
    """The table's lines in run order: each step's (``core.slots.steps``: named as in the timings
    and the run's ``steps`` tag), then the card's and the checks'."""
    return [*(s.step for s in steps()), CARD, CHECKS]


def spared() -> dict[str, tuple[str, ...]]:
    """Each line's stage-cache stores, whose hits spare its calls (``core.slots.Slot.stored``)."""
    return {**{s.step: s.stored for s in steps()}, CARD: CARD_STORES}


class DryCache(StageCache):
    """The stage cache as a dry run uses it: hits on disk are read, nothing is written to disk
    (placeholder answers must never be served to a real run); what the dry run computes is kept in
    memory, so a later config of the same dry sweep finds it as a real sweep would. ``disk``:
    hits on disk per stage, ``asked``: keys looked up per stage."""

    def __init__(self, root: str | Path, enabled: bool = True) -> None:
        super().__init__(root, enabled)
        self.writable, self._warned = False, True  # read-only, silently: the dry run says so itself
        self._memory: dict[tuple[str, str], str] = {}
        self.disk: Counter = Counter()
        self.asked: Counter = Counter()
        self.earlier: Counter = Counter()  # hits on what an earlier config of this dry run computed

    def get_json_many(self, stage: str, keys: list[str]) -> dict[str, Any]:
        found = super().get_json_many(stage, keys)
        self.disk[stage] += len(found)
        self.asked[stage] += len(set(keys))
        more = {
            k: json.loads(self._memory[(stage, k)])
            for k in keys
            if k not in found and (stage, k) in self._memory
        }
        self.earlier[stage] += len(more)
        self.stats[f"{stage}.hit"] += len(more)
        self.stats[f"{stage}.miss"] -= len(more)
        return found | more

    def put_json_many(self, stage: str, items: dict[str, Any]) -> None:
        if self.enabled:
            self._memory.update({(stage, k): json.dumps(v) for k, v in items.items()})


@dataclass
class Row:
    """One config's dry run: its calls in order, and what the cache and the store spare."""

    name: str
    calls: list[dry_calls.DryCall] = field(default_factory=list)
    disk: Counter = field(default_factory=Counter)
    asked: Counter = field(default_factory=Counter)
    earlier: Counter = field(default_factory=Counter)
    skipped: str = ""  # the FINISHED run a real sweep would skip this config for
    budget: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    drawn: int = 0  # queries whose chunks were drawn, not retrieved (:class:`NoModel`)


def ranks(stage: Any) -> bool:
    """A retriever (``search``) or a reranker (``score``)."""
    return hasattr(stage, "search") or hasattr(stage, "score")


def local_model(stage: Any) -> bool:
    """True when ``stage`` computes on a local model only and sends no request: it says so
    (``remote = False``: the heuristic judge, a cross-encoder), or it ranks with an embedder that
    does (a dense or hybrid retriever, a dense reranker on MiniLM); BM25 has none."""
    emb = getattr(stage, "embedder", None) if ranks(stage) else None
    return getattr(stage, "remote", True) is False or getattr(getattr(emb, "inner", emb), "remote", True) is False


class NoModel:
    """A dry run's stand-in for a retriever or reranker on a local model (:func:`local_model`):
    which chunks a prompt carries changes its tokens, never which requests are made, so no model is
    loaded. It keeps the stage's identity, so what the stage cache holds (a real run's ranking, its
    rerank scores) is used as it is; otherwise each question's chunks are drawn at random, seeded by
    the question, and a reranker keeps the first stage's order. ``drawn``: questions ranked so."""

    def __init__(self, stage: Any) -> None:
        self.identity, self.candidates = stage.identity, getattr(stage, "candidates", 0)
        self.n = self.drawn = 0

    def index(self, chunks: list) -> None:
        self.n = len(chunks)

    def search(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        idx = np.full((len(queries), k), -1, dtype=np.int64)
        for i, q in enumerate(queries):
            seed = int.from_bytes(hashlib.sha256(q.encode()).digest()[:8], "little")
            pick = np.random.default_rng(seed).choice(self.n, size=min(k, self.n), replace=False)
            idx[i, : len(pick)] = pick
        self.drawn += len(queries)
        return idx, np.where(idx >= 0, 1.0 / (1.0 + np.arange(k)), -np.inf).astype(np.float32)

    def score(self, queries: list[str], texts: list[list[str]]) -> list[np.ndarray]:
        self.drawn += len(queries)
        return [np.zeros(len(ts), np.float32) for ts in texts]


def step_of(c: dry_calls.DryCall) -> str:
    """The table's line of a call: the step it was made in (``run.steps`` labels it with its slot;
    an embedder's requests are the step's that embeds), the card's or the config checks'."""
    return {s.name: s.step for s in steps()}.get(c.step, c.step or CHECKS)


def _sum(calls: list[dry_calls.DryCall]) -> tuple[int, int, int, float | None]:
    """(calls, input tokens, output tokens at most, cost or None when a call is unpriced)."""
    usd = None if any(c.usd is None for c in calls) else sum(c.usd for c in calls)
    return len(calls), sum(c.tokens_in for c in calls), sum(c.tokens_out for c in calls), usd


def _usd(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.6f}"


def _cached(row: Row, line: str) -> str:
    """Hits on disk of the line's cache entries out of its lookups, and the hits on what an earlier
    config of the sweep computes (a real sweep finds those in the cache too)."""
    stores = spared().get(line, ())
    asked, earlier = sum(row.asked[s] for s in stores), sum(row.earlier[s] for s in stores)
    if not asked:
        return "–"
    return f"{sum(row.disk[s] for s in stores)} of {asked} hit" + (
        f", {earlier} from an earlier config" if earlier else ""
    )


def table(rows: list[Row]) -> str:
    """One line per config and remote step (a step that makes no call but finds its results in the
    cache included), then each config's total."""
    out = []
    for r in rows:
        if r.skipped and not r.calls:
            out.append(
                [
                    r.name,
                    "(all)",
                    "0",
                    "0",
                    "0",
                    "0",
                    f"skipped: run {r.skipped} FINISHED (force=true re-runs)",
                ]
            )
            continue
        by_step: dict[str, list] = defaultdict(list)
        for line, stores in spared().items():  # all from the cache: no call, still a line
            if any(r.disk[s] + r.earlier[s] for s in stores):
                by_step[line] = []
        for c in r.calls:
            by_step[step_of(c)].append(c)
        order = lines()
        ranked = sorted(by_step.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
        for i, (step, calls) in enumerate(ranked):
            n, tin, tout, usd = _sum(calls)
            out.append(
                [r.name if i == 0 else "", step, str(n), str(tin), str(tout), _usd(usd), _cached(r, step)]
            )
        n, tin, tout, usd = _sum(r.calls)
        out.append([r.name if not by_step else "", "= config", str(n), str(tin), str(tout), _usd(usd), ""])
    return text_table(["config", "step", "calls", "tokens in", "tokens out ≤", "cost USD", "cached"], out)


def budget_verdict(rows: list[Row], budget: dict) -> str:
    """The budget's verdict, by the rule of ``stages.call_budget`` applied to the recorded calls
    in the order they would be made: a call is refused once ``max_calls`` calls were made, or when
    the cost so far plus its bound (``call_budget.call_bound``) would pass ``max_usd``; the cost so
    far counts each call at its output bound (``max_tokens``), so a verdict on ``max_usd`` is the
    pessimistic one."""
    max_calls, max_usd = budget.get("max_calls"), budget.get("max_usd")
    if max_calls is None and max_usd is None:
        return "budget: none set (budget.max_calls, budget.max_usd)"
    made, spent = 0, 0.0
    for j, r in enumerate(rows):
        for k, c in enumerate(r.calls):
            why = ""
            if max_calls is not None and made >= max_calls:
                why = f"budget.max_calls={max_calls}"
            elif max_usd is not None and spent + c.bound > max_usd:
                why = f"budget.max_usd={max_usd:g} (at most {spent:.6f} USD spent, the next call up to {c.bound:.6f})"
            if why:
                before = f"after config {j} ({rows[j - 1].name})" if j else "in the first config"
                later = len(rows) - j - 1
                rest = f", the {later} config(s) after it are not started" if later else ""
                return (f"budget: exceeds {why}: the sweep would stop {before}: config {j + 1} ({r.name}) "
                        f"is FAILED at its call {k + 1} of {len(r.calls)}{rest}; the same command with a larger "
                        "budget resumes")  # fmt: skip
            made, spent = made + 1, spent + (c.usd or 0.0)
    parts = ([f"budget.max_calls={max_calls} ({made} calls)"] if max_calls is not None else []) + (
        [f"budget.max_usd={max_usd:g} (at most {spent:.6f} USD)"] if max_usd is not None else []
    )
    return "budget: fits " + " and ".join(parts)


def wall_lines(rows: list[Row]) -> list[str]:
    """Per endpoint, the least wall time its declared limits allow: ``(calls - 1) · 60 / rpm``
    (attempts are paced evenly) and ``input tokens · 60 / tpm`` (replies' tokens are at least
    their input), the larger; ``max_concurrency`` bounds it only with the latency of a call."""
    calls: dict[str, list] = defaultdict(list)
    for r in rows:
        for c in r.calls:
            calls[c.key].append(c)
    limits, out = endpoint.limits(), []
    for key, cs in sorted(calls.items()):
        conc, rpm, tpm = limits.get(key, (0, 0.0, 0.0))
        tin = sum(c.tokens_in for c in cs)
        bounds = ([f"rpm={rpm:g}: {(len(cs) - 1) * 60 / rpm:.1f} s"] if rpm else []) + (
            [f"tpm={tpm:g}: {tin * 60 / tpm:.1f} s"] if tpm else []
        )
        least = max([(len(cs) - 1) * 60 / rpm if rpm else 0.0, tin * 60 / tpm if tpm else 0.0])
        conc_txt = f"; max_concurrency={conc}: at least {len(cs)} × a call's latency ÷ {conc}" if conc else ""
        what = (
            f"at least {least:.1f} s ({', '.join(bounds)})" if bounds else "no rpm/tpm declared: not bounded"
        )
        out.append(f"  {key}: {len(cs)} calls, {what}{conc_txt}")
    return out


def print_report(rows: list[Row], budget: dict) -> None:
    print(f"dry run: {len(rows)} config(s); nothing was sent and no MLflow run was created")
    print(table(rows))
    n, tin, tout, usd = _sum([c for r in rows for c in r.calls])
    print(
        f"total: {n} calls, {tin} tokens in, at most {tout} tokens out, cost {_usd(usd)} USD"
        + (" (n/a: an endpoint has no price)" if usd is None else "")
    )
    print(budget_verdict(rows, budget))
    if lines := wall_lines(rows):
        print("least wall time per endpoint (its declared limits):")
        print("\n".join(lines))
    print("assumptions:")
    print(
        f"  input tokens = ceil(chars / {call_budget.CHARS_PER_TOKEN}) of each request's text (the budget's rule)"
    )
    print("  output tokens = each request's max_tokens: an upper bound (a model may stop sooner)")
    print(f"  an answer's claims are its sentences' (judge.claims.split_claims): {dry_calls.CLAIMS_PER_ANSWER} for an answer "
          "not in the cache (stages.dry_calls.CLAIMS_PER_ANSWER), a cached answer's own; the judge's verdict calls follow "
          "(judge.fold=true: none, its one call per answer returns them)")  # fmt: skip
    print(
        "  a logprob judge's endpoint returns logprobs (else each verdict takes a second, constrained call)"
    )
    print(
        "  every reply is readable (an unparseable verdict of the judge card is not cached: a real sweep asks it again)"
    )
    if drawn := [r for r in rows if r.drawn]:
        print(f"  estimates: {len(drawn)} of {len(rows)} config(s) rank with a local model whose results the stage cache "
              "does not hold; not run (no request to count): each question's chunks are drawn at random from the "
              "config's chunks, seeded by the question (a local reranker keeps that order), so their calls are the real "
              "run's and the tokens in of the steps after retrieval are k chunks of the config's sizes, not its top k")  # fmt: skip
    for note in sorted({n for r in rows for n in r.notes}):
        print(f"note: {note}")


def finished_run(settings: JobSettings, chash: str) -> str:
    """The FINISHED run a real sweep would skip this config for ("" none or ``force=true``): the
    store is read, never created or written."""
    from rag_experiments.tracking import writer as tracking

    if settings.force:
        return ""
    uri = tracking.resolve_uri(settings.tracking_uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).exists():
        return ""
    client = tracking.open_store(uri)
    exp = client.get_experiment_by_name(settings.experiment_name)
    if exp is None:
        return ""
    done, _ = tracking.resume_decision(client, exp.experiment_id, chash, code_fingerprint())
    return done.info.run_id if done is not None else ""


def dry_job(job: ComposedJob, name: str, cache: DryCache) -> Row:
    """One config, assembled and run on the eval set in dry mode; exits 2 on bad input."""
    from rag_experiments.tracking import writer as tracking

    mark = dry_calls.mark()
    problems, loaded, settings = job.assemble(cache)
    if problems:
        print_problems([f"job {name}: {p}" for p in problems], "no run was created: fix these inputs first")
        sys.exit(2)
    identities = loaded.stages.identities()
    chash = tracking.config_hash(settings.full, loaded.corpus.digest, loaded.evalset.digest, identities)
    row = Row(name, budget=dict(settings.full.get("budget") or {}))
    if run_id := finished_run(settings, chash):  # its assembly's calls (an app's probe) are still made
        row.skipped, row.calls = run_id, dry_calls.calls()[mark:]
        return row
    disk, asked, earlier = Counter(cache.disk), Counter(cache.asked), Counter(cache.earlier)
    stages = loaded.stages
    if stages.judge is not None and local_model(stages.judge):
        # a judge on a local model only (heuristic, verifier) sends nothing to count: not run, so a
        # dry run takes seconds instead of embedding every claim (its card likewise)
        stages = dataclasses.replace(stages, judge=None, judge_repeats=())
        row.notes.append(f"judge {type(loaded.stages.judge).__name__}: a local model, no request: not run")
    # a stage that ranks or scores on a local model: its cached results, else chunks drawn (NoModel)
    stand_in = {s.name: NoModel(x) for s in SLOTS if ranks(x := getattr(stages, s.name, None)) and local_model(x)}
    stages = dataclasses.replace(stages, **stand_in)
    # no metric is printed: scored at k only, no bootstrap, no budget tokenizer (the ranking's depth,
    # part of its cache key, is the run's)
    run = dataclasses.replace(settings.run, ks=(settings.run.k,), rank_depth=settings.run.depth, token_budgets=(), n_resamples=0)
    res = run_pipeline(stages, loaded.data, run, cache)
    row.drawn = sum(s.drawn for s in stand_in.values())
    card_mark = dry_calls.mark()
    add_card(settings.card, stages, loaded.corpus.docs, cache, res, settings.progress)
    dry_calls.label(card_mark, "judge card")
    row.calls = dry_calls.calls()[mark:]
    row.disk, row.asked, row.earlier = cache.disk - disk, cache.asked - asked, cache.earlier - earlier
    if any(c.path.endswith("/embeddings") for c in row.calls):
        row.notes.append(
            "embedding=openai: cached vectors and FINISHED runs not checked (both keyed by the probe's reply)"
        )
    if settings.racing is not None:
        row.notes.append("racing=true: counted for every item (racing may stop a config sooner)")
    return row


def _priced(calls: list[dry_calls.DryCall]) -> None:
    """Each call's cost at its endpoint's prices as they are now: a price declared after the call
    was recorded (an embedder's, set when it is built, after its probe in the config check) counts."""
    for c in calls:
        if c.usd is None and call_budget.priced(c.key):
            c.usd = call_budget.reply_cost(
                c.key, {"prompt_tokens": c.tokens_in, "completion_tokens": c.tokens_out}
            )


def report(jobs: list[ComposedJob]) -> int:
    """The dry run of a sweep's composed jobs: the report, exit 0 (2: bad input)."""
    varying = varying_keys([list(j.overrides) for j in jobs]) if len(jobs) > 1 else None
    names = [run_name(list(j.overrides), varying) or f"config {i + 1}" for i, j in enumerate(jobs)]
    dry_calls.start()
    try:
        problems = [f"job {name}: {p}" for name, j in zip(names, jobs, strict=True) for p in j.problems()]
        if problems:  # every job checked before any runs, as a multirun does
            print_problems(problems, "no run was created: fix these inputs first")
            return 2
        checks = dry_calls.mark()
        root, enabled = jobs[0].cache_place()
        cache = DryCache(root, enabled=enabled)
        rows = [dry_job(j, name, cache) for name, j in zip(names, jobs, strict=True)]
        if checks and rows:  # the config checks' requests (an embeddings probe) come first
            rows[0].calls[:0] = dry_calls.calls()[:checks]
    finally:
        dry_calls.stop()
    _priced([c for r in rows for c in r.calls])
    print_report(rows, rows[0].budget if rows else {})
    return 0
