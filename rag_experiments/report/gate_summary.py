"""The gate's verdict as Markdown for a pull request (``gate … --summary-md FILE``; docs/ci.md).

A view of the console's verdict (``analysis.verdict.GateVerdict``), deciding nothing: the verdict,
the caveats in the console's order (UNDERPOWERED among them whenever the console says it), one
row per metric (baseline, candidate, Δ with its one-sided confidence interval, the bound against
the margin, the test), the config diff and the queries that got worse most, each linked to its
trace on the tracking server (``tracking.trace_links``). Built into a :class:`GateSummary`, laid
out by ``report/templates/gate_summary.md.j2``; every text from data goes through
``report.render.md_inert``. Fit for GitHub's ``$GITHUB_STEP_SUMMARY`` or a PR comment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jinja2
import pandas as pd

from rag_experiments.analysis.attribution import config_diff
from rag_experiments.analysis.verdict import GateVerdict, MetricVerdict
from rag_experiments.core.formatting import fmt_num
from rag_experiments.core.run_record import RunData
from rag_experiments.report.render import TEMPLATES, md_inert
from rag_experiments.tracking.trace_links import run_url, trace_ids_by_item, trace_url

TOP_FLIPS = 10  # queries listed under "worse on the candidate"


@dataclass(frozen=True)
class Link:
    text: str
    url: str = ""  # "" : no link (a run without traces)


@dataclass(frozen=True)
class MetricRow:
    metric: str
    better: str
    baseline: str
    candidate: str
    delta_ci: str  # Δ and its one-sided (1 − α) interval
    bound_vs_margin: str
    test: str
    n: int
    verdict: str


@dataclass(frozen=True)
class Flip:
    metric: str
    item_id: str
    query: str
    baseline: str
    candidate: str
    baseline_trace: Link
    candidate_trace: Link


@dataclass(frozen=True)
class CriticalRow:
    """A critical check failing for the candidate: the item, the check, why, the baseline's result."""

    item_id: str
    query: str
    check: str  # "assert[0] not_contains 'never'"
    detail: str
    baseline: str  # "fails too" | "passes" | "not checked"
    candidate_trace: Link


@dataclass
class GateSummary:
    verdict: str  # PASS / FAIL
    confidence: str  # "95%"
    baseline: Link
    candidate: Link
    rows: list[MetricRow]
    caveats: list[str]  # the console's, in its order
    underpowered: bool
    diff: list[tuple[str, str, str]]
    flips: list[Flip] = field(default_factory=list)
    n_worse: int = 0  # queries worse on some gated metric (flips lists the first TOP_FLIPS)
    critical: list[CriticalRow] = field(default_factory=list)  # listed first: each fails the gate


def _row(m: MetricVerdict) -> MetricRow:
    """The metric's table row; the bound against the limit reads true as written: ``≥``/``≤`` when it
    passes, ``<``/``>`` and ✗ when it fails."""
    e = m.estimate
    bound, limit = (
        fmt_num(e.bound, signed=True),
        fmt_num(-m.power.margin if e.higher_is_better else m.power.margin, signed=True),
    )
    if e.higher_is_better:
        ci, op = f"[{bound}, +∞)", "≥" if m.passed else "<"
    else:
        ci, op = f"(−∞, {bound}]", "≤" if m.passed else ">"
    vs = f"{bound} {op} {limit}" + ("" if m.passed else " ✗")
    return MetricRow(
        m.metric,
        "higher" if e.higher_is_better else "lower",
        fmt_num(e.baseline),
        fmt_num(e.candidate),
        f"{fmt_num(e.delta, signed=True)} {ci}",
        vs,
        m.test.label,
        m.power.n,
        m.verdict,
    )


def worse_queries(
    results: Sequence[MetricVerdict], tb: pd.DataFrame, tc: pd.DataFrame
) -> list[tuple[str, str, float, float]]:
    """(metric, item id, baseline value, candidate value) of every query worse on the candidate for a
    gated metric, failing metrics first, then by how much worse (``candidate − baseline`` in the
    metric's worse direction), then by id: the flipped queries of a 0/1 metric come first."""
    out = []
    for r in sorted(results, key=lambda r: r.passed):
        b, c = tb.set_index("id")[r.metric], tc.set_index("id")[r.metric]
        both = pd.concat([b.rename("b"), c.rename("c")], axis=1, join="inner").dropna()
        worse = (both["b"] - both["c"]) if r.estimate.higher_is_better else (both["c"] - both["b"])
        both = both.assign(w=worse)[worse > 0]
        for item, row in sorted(both.iterrows(), key=lambda kv: (-kv[1]["w"], str(kv[0]))):
            out.append((r.metric, str(item), float(row["b"]), float(row["c"])))
    return out


def build_summary(
    uri: str,
    rb: RunData,
    rc: RunData,
    tb: pd.DataFrame,
    tc: pd.DataFrame,
    verdict: GateVerdict,
    top: int = TOP_FLIPS,
) -> GateSummary:
    """The summary's data; reads the two runs' trace ids (one search per run) for the flip links
    and the critical checks' links (``verdict.critical``, listed first)."""
    worse = worse_queries(verdict.metrics, tb, tc)
    flips = []
    traces: dict = {}
    if (worse and top) or verdict.critical:
        traces = {r.run_id: trace_ids_by_item(uri, r.experiment_id, r.run_id) for r in (rb, rc)}
    if worse and top:
        queries = dict(zip(tb["id"].astype(str), tb["query"] if "query" in tb else tb["id"], strict=True))

        def link(run: RunData, item: str) -> Link:
            tid = traces[run.run_id].get(item)
            return Link("trace", trace_url(uri, run.experiment_id, tid)) if tid else Link("no trace")

        seen: set[str] = set()
        for metric, item, b, c in worse:
            if len(flips) == top:
                break
            if item in seen:  # one row per query: its worst metric
                continue
            seen.add(item)
            flips.append(
                Flip(
                    metric,
                    item,
                    str(queries.get(item, "")),
                    fmt_num(b),
                    fmt_num(c),
                    link(rb, item),
                    link(rc, item),
                )
            )
    diff = [
        (k, "–" if a is None else str(a), "–" if b is None else str(b))
        for k, (a, b) in config_diff(rb.params, rc.params).items()
    ]
    crit = []
    for f in verdict.critical:
        tid = traces.get(rc.run_id, {}).get(f.item_id)
        trace = Link("trace", trace_url(uri, rc.experiment_id, tid)) if tid else Link("no trace")
        crit.append(
            CriticalRow(f.item_id, f.query, f"assert[{f.index}] {f.check}", f.detail, f.baseline, trace)
        )
    return GateSummary(
        verdict=verdict.verdict,
        confidence=f"{100 * (1 - verdict.alpha):g}%",
        baseline=Link(rb.label, run_url(uri, rb.experiment_id, rb.run_id)),
        candidate=Link(rc.label, run_url(uri, rc.experiment_id, rc.run_id)),
        rows=[_row(m) for m in verdict.metrics],
        caveats=verdict.caveat_lines(),
        underpowered=verdict.underpowered,
        diff=diff,
        flips=flips,
        n_worse=len({item for _, item, _, _ in worse}),
        critical=crit,
    )


def _md_url(url: str) -> str:
    """A link destination CommonMark reads whole: ``<…>`` around it, angle brackets and spaces escaped."""
    return "<" + url.replace(" ", "%20").replace("<", "%3C").replace(">", "%3E") + ">"


@cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=False, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
    )  # fmt: skip
    env.filters["cell"] = md_inert
    env.filters["url"] = _md_url
    return env


def render_summary(s: GateSummary) -> str:
    return _env().get_template("gate_summary.md.j2").render(s=s)


def write_summary(args, reader, verdict: GateVerdict) -> Path | None:
    """``gate``'s one call: with ``--summary-md FILE`` (``args.summary_md``), resolve the two runs
    again (``args.baseline``, ``args.candidate``, ``args.experiment``), build, render, write FILE;
    None without the flag."""
    if not getattr(args, "summary_md", None):
        return None
    rb, rc = reader.resolve(args.baseline, args.experiment), reader.resolve(args.candidate, args.experiment)
    tb, tc = reader.per_query(rb), reader.per_query(rc)
    s = build_summary(reader.uri, rb, rc, tb, tc, verdict)
    out = Path(args.summary_md)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_summary(s), encoding="utf-8")
    return out
