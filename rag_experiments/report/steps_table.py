"""The report's per-step rows: what each step of a run did (seconds, calls, failed items, tokens,
cost), and the cost keys shown per config — both from the slot declarations (``core.slots``), so a
slot declared later appears without editing the report."""

from __future__ import annotations

from rag_experiments.core.run_record import parse_json
from rag_experiments.core.slots import steps
from rag_experiments.report.load import Config
from rag_experiments.report.model import Analysis, Paragraph, f3, table, text


def cost_keys() -> dict[str, int]:
    """Cost keys shown per config, with their decimals, from the slots (``core.slots``): the run's
    cost, each priced step's tokens, each serving step's 95th-percentile latency."""
    keys = {"cost_usd": 6}
    keys |= {f"tokens_{side}/{s.column}": 0 for s in steps() if s.priced for side in ("in", "out")}
    return keys | {f"latency_p95_ms/{s.column}": 1 for s in steps() if s.column and s.serving}


def step_rows_of(c: Config) -> list[dict]:
    """A run's per-step rows: its ``steps`` tag (``evaluation.cost.step_rows``); for a run logged
    before it, the same rows from its ``timings`` tag and metrics (no calls, no cost)."""
    rows = parse_json(c.tags.get("steps"), None)
    if isinstance(rows, list):
        return rows
    timings, m = parse_json(c.tags.get("timings"), {}) or {}, c.metrics
    return [
        {"step": s.step, "seconds": timings[f"{s.step}_s"], "calls": None, "errors": m.get(s.errors),
         "tokens_in": m.get(f"tokens_in/{s.column}"), "tokens_out": m.get(f"tokens_out/{s.column}"), "cost_usd": None}
        for s in steps() if f"{s.step}_s" in timings
    ]  # fmt: skip


STEP_HEADERS = ["config", "step", "seconds", "calls", "errors", "tokens in", "tokens out", "cost_usd"]


def step_table(an: Analysis) -> list:
    """Per config, one row per step that ran (the run loop's records, ``core.slots`` order): its
    seconds, model calls, failed items, tokens and cost; [] when no run logged any."""
    rows = [
        [c.label, r.get("step", "?"), f3(r.get("seconds"), nd=1), f3(r.get("calls"), nd=0), f3(r.get("errors"), nd=0),
         f3(r.get("tokens_in"), nd=0), f3(r.get("tokens_out"), nd=0), f3(r.get("cost_usd"), nd=6)]
        for c in an.configs for r in step_rows_of(c)
    ]  # fmt: skip
    if not rows:
        return []
    note = Paragraph(text("What each step of the run did: wall time, model calls (0: all from the cache), "
                          "items it failed on (the same command retries them), tokens and cost."))  # fmt: skip
    return [note, table(STEP_HEADERS, rows)]
