"""A reproducible research report for a sweep or a run (DESIGN §6).

    python -m rag_experiments.report.build RUN_OR_SWEEP [--out DIR] [--baseline RUN] [--no-log]

RUN_OR_SWEEP is a ``sweep_id``, a sweep's parent run (id or name) or a single run (id or name).
Writes ``report.md``, a self-contained ``report.html`` (plots embedded as data URIs, inline CSS, no
external request) and the PNG plots into DIR (default ``reports/<sweep_id or run>``), and logs them
under ``report/`` on the sweep's parent run (the run itself for a single run) unless ``--no-log``.

Sections, in order: the question (factors and levels), results per config (every headline metric
with its 95 % CI), one-factor-at-a-time attribution, plots, worst queries, metric definitions,
reproducibility. Generation parts appear only when the runs have generation metrics.
Exit codes: 0 ok, 2 bad input (unknown run or sweep, missing per-query table).
"""

from __future__ import annotations

import argparse
import base64
import html
import inspect
import json
import math
import re
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from rag_experiments.analysis.attribution import (
    RunData,
    SweepAttribution,
    _level,  # the level definition factor_effects uses, so labels match its tables
    factor_effects,
    infer_factors,
    is_bookkeeping,
)
from rag_experiments.compare import EFFECT_HEADERS, NOISE_HEADERS, effect_rows, noise_rows
from rag_experiments.evaluation.labels import FAILURE_LABELS
from rag_experiments.tracking.runs import (
    RunInputError,
    resolve_run,
    run_data,
    run_label,
    sweep_children,
    tracking_uri,
)

GENERATION_METRICS = ("faithfulness", "answer_relevance", "correctness")
RATE_ORDER = ("rate_ok", "rate_retrieval_failure", "rate_generation_failure", "rate_correct_without_evidence")
LABEL_COLORS = {
    "ok": "#2ca02c",
    "retrieved": "#98df8a",
    "retrieval_failure": "#d62728",
    "generation_failure": "#ff7f0e",
    "correct_without_evidence": "#9467bd",
    "error": "#7f7f7f",
}
SECTIONS = (
    ("question", "Question"),
    ("results", "Results per config"),
    ("attribution", "Attribution (one factor at a time)"),
    ("plots", "Plots"),
    ("worst", "Worst queries"),
    ("definitions", "Metric definitions"),
    ("reproducibility", "Reproducibility"),
)


# --------------------------------------------------------------------------------------------- document model
# One list of blocks rendered twice (Markdown and HTML), so the two files never disagree.


@dataclass
class Doc:
    title: str
    blocks: list[tuple] = field(default_factory=list)

    def section(self, anchor: str, title: str) -> None:
        self.blocks.append(("h2", anchor, title))

    def h3(self, text: str) -> None:
        self.blocks.append(("h3", text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def ul(self, items: Sequence[str]) -> None:
        self.blocks.append(("ul", list(items)))

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        self.blocks.append(("table", list(headers), [list(map(str, r)) for r in rows]))

    def pre(self, text: str) -> None:
        self.blocks.append(("pre", text))

    def img(self, png: Path, caption: str) -> None:
        self.blocks.append(("img", png, caption))


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render_markdown(doc: Doc) -> str:
    out = [f"# {doc.title}", ""]
    for b in doc.blocks:
        kind = b[0]
        if kind == "h2":
            out += [f"## {b[2]}", ""]
        elif kind == "h3":
            out += [f"### {b[1]}", ""]
        elif kind == "p":
            out += [b[1], ""]
        elif kind == "ul":
            out += [f"- {x}" for x in b[1]] + [""]
        elif kind == "table":
            headers, rows = b[1], b[2]
            out.append("| " + " | ".join(map(_md_cell, headers)) + " |")
            out.append("|" + "|".join("---" for _ in headers) + "|")
            out += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in rows]
            out.append("")
        elif kind == "pre":
            out += ["```", b[1].rstrip("\n"), "```", ""]
        elif kind == "img":
            out += [f"![{b[2]}]({b[1].name})", "", f"*{b[2]}*", ""]
    return "\n".join(out).rstrip() + "\n"


_INLINE_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")


def _inline(text: str) -> str:
    s = html.escape(text, quote=False)
    s = _INLINE_CODE.sub(r"<code>\1</code>", s)
    return _BOLD.sub(r"<strong>\1</strong>", s)


CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0 auto;max-width:1180px;
padding:1.5rem 2rem;color:#1d1d1f;line-height:1.45}
h1{font-size:1.6rem;border-bottom:2px solid #333;padding-bottom:.3rem}
h2{font-size:1.3rem;margin-top:2.2rem;border-bottom:1px solid #bbb;padding-bottom:.2rem}
h3{font-size:1.05rem;margin-top:1.4rem}
nav ol{columns:2;font-size:.92rem}
.tw{overflow-x:auto;margin:.6rem 0 1rem}
table{border-collapse:collapse;font-size:.84rem}
th,td{border:1px solid #ccc;padding:.25rem .45rem;vertical-align:top;text-align:left}
th{background:#f1f1f3}
tr:nth-child(even) td{background:#fafafa}
code,pre{font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:.82rem}
pre{background:#f6f6f8;border:1px solid #ddd;padding:.6rem;overflow-x:auto;white-space:pre-wrap}
figure{margin:1rem 0 1.6rem}
figure img{max-width:100%;border:1px solid #ddd}
figcaption{font-size:.85rem;color:#555}
"""


def render_html(doc: Doc) -> str:
    """Self-contained HTML: inline CSS, images as base64 data URIs, no script, no external link."""
    toc = "".join(f'<li><a href="#{a}">{html.escape(t)}</a></li>' for a, t in SECTIONS)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(doc.title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(doc.title)}</h1>",
        f"<nav><ol>{toc}</ol></nav>",
    ]
    open_section = False
    for b in doc.blocks:
        kind = b[0]
        if kind == "h2":
            if open_section:
                parts.append("</section>")
            parts.append(f'<section id="{b[1]}"><h2>{html.escape(b[2])}</h2>')
            open_section = True
        elif kind == "h3":
            parts.append(f"<h3>{_inline(b[1])}</h3>")
        elif kind == "p":
            parts.append(f"<p>{_inline(b[1])}</p>")
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in b[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{_inline(h)}</th>" for h in b[1])
            body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in b[2])
            parts.append(
                f'<div class="tw"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
            )
        elif kind == "pre":
            parts.append(f"<pre>{html.escape(b[1])}</pre>")
        elif kind == "img":
            data = base64.b64encode(Path(b[1]).read_bytes()).decode("ascii")
            cap = html.escape(b[2])
            parts.append(
                f'<figure><img src="data:image/png;base64,{data}" alt="{cap}">'
                f"<figcaption>{cap}</figcaption></figure>"
            )
    if open_section:
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------------------------- loading


@dataclass
class Target:
    """What the report is about: the runs, and where to log the report."""

    label: str  # sweep_id, or the run's name
    runs: list[Run]
    log_run_id: str  # the parent run (sweep) or the run itself
    parent: Run | None
    sweep_id: str | None


def resolve_target(client: MlflowClient, target: str, experiment: str | None = None) -> Target:
    """A sweep_id, a sweep's parent run (id or name), or a single run (id or name)."""
    children = sweep_children(client, target, experiment)
    if children:
        pid = children[0].data.tags.get("mlflow.parentRunId")
        parent = _get_run(client, pid)
        return Target(target, children, pid or children[0].info.run_id, parent, target)
    run = resolve_run(client, target, experiment)
    tags = run.data.tags
    sweep_id = tags.get("sweep_id")
    if tags.get("is_parent") == "true" and sweep_id:
        kids = [
            r
            for r in sweep_children(client, sweep_id, experiment)
            if r.data.tags.get("mlflow.parentRunId") == run.info.run_id
        ]
        if not kids:
            raise RunInputError(f"sweep parent {run_label(run)} has no child runs")
        return Target(sweep_id, kids, run.info.run_id, run, sweep_id)
    if tags.get("is_parent") == "true":
        raise RunInputError(f"run {run_label(run)} is a sweep parent without a sweep_id tag")
    return Target(run.info.run_name or run.info.run_id, [run], run.info.run_id, None, None)


def _get_run(client: MlflowClient, run_id: str | None) -> Run | None:
    if not run_id:
        return None
    try:
        return client.get_run(run_id)
    except Exception:  # noqa: BLE001 - a deleted parent only loses the sweep-level tags
        return None


@dataclass
class Config:
    """One run of the report, with its short label and per-query table."""

    run: Run
    data: RunData
    label: str

    @property
    def metrics(self) -> dict[str, float]:
        return dict(self.run.data.metrics)

    @property
    def table(self) -> pd.DataFrame:
        assert self.data.table is not None
        return self.data.table


def load_configs(client: MlflowClient, runs: Sequence[Run]) -> tuple[list[Config], list[str]]:
    data = [run_data(client, r) for r in runs]
    factors = infer_factors(data)
    configs = []
    for r, d in zip(runs, data, strict=True):
        if factors:
            label = ", ".join(f"{f}={_level(d, f)}" for f in factors)
        else:
            label = r.info.run_name or r.info.run_id[:8]
        configs.append(Config(r, d, label))
    seen = Counter(c.label for c in configs)
    for c in configs:  # replicate runs (same levels) stay distinguishable
        if seen[c.label] > 1:
            c.label = f"{c.label} ({c.run.info.run_id[:6]})"
    return configs, factors


# --------------------------------------------------------------------------------------------- helpers


def _f(x: Any, nd: int = 3, signed: bool = False) -> str:
    if x is None:
        return "–"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(v):
        return "–"
    return f"{v:+.{nd}f}" if signed else f"{v:.{nd}f}"


def _p(p: Any) -> str:
    if p is None or (isinstance(p, float) and math.isnan(p)):
        return "–"
    return "<1e-4" if p < 1e-4 else f"{p:.4f}"


def _with_ci(m: dict[str, float], key: str) -> str:
    if key not in m:
        return "–"
    return f"{_f(m[key])} [{_f(m.get(key + '_ci_low'))}, {_f(m.get(key + '_ci_high'))}]"


def _context_k(configs: Sequence[Config]) -> int:
    """The context k (retriever.k) most configs share; ties go to the larger k."""
    ks = Counter(int(float(c.run.data.params.get("retriever.k", 5))) for c in configs)
    return max(ks, key=lambda k: (ks[k], k))


def _logged_ks(configs: Sequence[Config], prefix: str = "hit_at_") -> list[int]:
    ks: set[int] = set()
    for c in configs:
        ks |= {int(k[len(prefix) :]) for k in c.metrics if re.fullmatch(re.escape(prefix) + r"\d+", k)}
    return sorted(ks)


def has_generation(configs: Sequence[Config]) -> bool:
    return any(m in c.metrics for c in configs for m in GENERATION_METRICS)


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", s).strip("_") or "report"


def _json(s: Any, default: Any) -> Any:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return default
    try:
        return json.loads(s) if isinstance(s, str) else s
    except ValueError:
        return default


def relevance_matrix(table: pd.DataFrame, min_coverage: float) -> tuple[np.ndarray, np.ndarray]:
    """(rel, answerable) from the logged ``retrieved`` and ``gold_spans`` columns.

    Uses :func:`rag_experiments.evaluation.metrics.relevance_arrays`, the single definition of relevance, so
    hit@k for any k up to the ranking depth is exactly what the pipeline would have logged.
    """
    from rag_experiments.evaluation import metrics as M
    from rag_experiments.types import Chunk, Span

    ranked, gold = [], []
    for ret, gs in zip(table["retrieved"], table["gold_spans"], strict=True):
        ranked.append(
            [
                Chunk(r["chunk_id"], r["doc_id"], int(r["start"]), int(r["end"]), "")
                for r in sorted(_json(ret, []), key=lambda r: r["rank"])
            ]
        )
        gold.append([Span(d, int(s), int(e)) for d, s, e in _json(gs, [])])
    rel, _, _ = M.relevance_arrays(ranked, gold, [], min_coverage)
    answerable = np.array([bool(g) for g in gold])
    return rel, answerable


def _min_coverage(c: Config) -> float:
    return float(c.run.data.params.get("metrics.min_coverage", 0.5))


# --------------------------------------------------------------------------------------------- plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(n: int) -> list:
    plt = _plt()
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _plt().close(fig)
    return path


def hit_curves(configs: Sequence[Config]) -> tuple[dict[str, list[float]], list[str]]:
    """hit@k for k = 1 … ranking depth per config, recomputed from the per-query rankings.

    Checked against the logged ``hit_at_{k}`` metrics; a mismatch is reported, never hidden.
    """
    curves: dict[str, list[float]] = {}
    notes: list[str] = []
    for c in configs:
        t = c.table
        if "retrieved" not in t.columns or "gold_spans" not in t.columns:
            continue
        rel, answerable = relevance_matrix(t, _min_coverage(c))
        if not answerable.any() or rel.shape[1] == 0:
            continue
        cum = np.logical_or.accumulate(rel[answerable], axis=1)
        curve = cum.mean(axis=0).tolist()
        curves[c.label] = curve
        for k, v in enumerate(curve, start=1):
            logged = c.metrics.get(f"hit_at_{k}")
            if logged is not None and abs(logged - v) > 1e-9:
                notes.append(f"{c.label}: hit@{k} recomputed {v:.4f} ≠ logged {logged:.4f}")
    return curves, notes


def plot_hit_curves(configs: Sequence[Config], curves: dict[str, list[float]], path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.4))
    for c, color in zip(configs, _colors(len(configs)), strict=True):
        if c.label not in curves:
            continue
        y = curves[c.label]
        ks = np.arange(1, len(y) + 1)
        ax.plot(ks, y, marker="o", ms=3, color=color, label=c.label)
        logged = [(k, c.metrics[f"hit_at_{k}"]) for k in ks if f"hit_at_{k}" in c.metrics]
        lo = [c.metrics.get(f"hit_at_{k}_ci_low", v) for k, v in logged]
        hi = [c.metrics.get(f"hit_at_{k}_ci_high", v) for k, v in logged]
        if logged:
            x = [k for k, _ in logged]
            v = [v for _, v in logged]
            ax.errorbar(
                x,
                v,
                yerr=[np.subtract(v, lo), np.subtract(hi, v)],
                fmt="none",
                ecolor=color,
                alpha=0.6,
                capsize=3,
            )
    ax.set_xlabel("k (chunks retrieved)")
    ax.set_ylabel("hit@k (answerable queries)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title("hit@k by k (error bars: 95 % CI at the logged ks)")
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def _grouped_bars(
    ax, groups: Sequence[str], series: dict[str, list[float]], errs: dict[str, Any] | None, colors: Sequence
) -> None:
    n = max(len(series), 1)
    width = 0.8 / n
    x = np.arange(len(groups))
    for i, ((name, vals), color) in enumerate(zip(series.items(), colors, strict=False)):
        yerr = None if not errs or name not in errs else errs[name]
        ax.bar(
            x + (i - (n - 1) / 2) * width,
            vals,
            width,
            label=name,
            color=color,
            yerr=yerr,
            capsize=3,
            error_kw={"elinewidth": 1, "alpha": 0.8},
        )
    ax.set_xticks(x)
    ax.set_xticklabels(
        groups, rotation=20 if len(groups) > 3 else 0, ha="right" if len(groups) > 3 else "center", fontsize=8
    )


def _ci_err(c: Config, key: str) -> tuple[float, float, float]:
    v = c.metrics.get(key, float("nan"))
    lo, hi = c.metrics.get(key + "_ci_low", v), c.metrics.get(key + "_ci_high", v)
    return v, max(v - lo, 0.0), max(hi - v, 0.0)


def plot_metric_bars(configs: Sequence[Config], keys: Sequence[str], title: str, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(configs) + 3), 4.2))
    series, errs = {}, {}
    for key in keys:
        vals = [_ci_err(c, key) for c in configs]
        series[key] = [v for v, _, _ in vals]
        errs[key] = [[lo for _, lo, _ in vals], [hi for _, _, hi in vals]]
    _grouped_bars(ax, [c.label for c in configs], series, errs, _colors(len(keys)))
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("mean over queries (95 % CI)")
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def label_counts(configs: Sequence[Config]) -> pd.DataFrame:
    rows = {}
    for c in configs:
        if "failure_label" in c.table.columns:
            rows[c.label] = (
                c.table["failure_label"].fillna("missing").astype(str).value_counts(normalize=True)
            )
    df = pd.DataFrame(rows).T.fillna(0.0)
    order = [x for x in FAILURE_LABELS if x in df.columns] + sorted(set(df.columns) - set(FAILURE_LABELS))
    return df[order] if len(df) else df


def plot_failure_labels(counts: pd.DataFrame, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(counts) + 3), 4.2))
    bottom = np.zeros(len(counts))
    x = np.arange(len(counts))
    for lab in counts.columns:
        vals = counts[lab].to_numpy()
        ax.bar(x, vals, 0.6, bottom=bottom, label=lab, color=LABEL_COLORS.get(lab, "#bcbd22"))
        for xi, (b, v) in enumerate(zip(bottom, vals, strict=True)):
            if v >= 0.06:
                ax.text(xi, b + v / 2, f"{v:.0%}", ha="center", va="center", fontsize=7)
        bottom += vals
    ax.set_xticks(x)
    ax.set_xticklabels(
        counts.index,
        rotation=20 if len(counts) > 3 else 0,
        ha="right" if len(counts) > 3 else "center",
        fontsize=8,
    )
    ax.set_ylabel("share of queries")
    ax.set_ylim(0, 1.0)
    ax.set_title("Failure labels per config")
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    return _save(fig, path)


def tag_table(configs: Sequence[Config], key: str) -> pd.DataFrame:
    """by_tag/{tag}/{key} per config (rows: tags, columns: config labels)."""
    data: dict[str, dict[str, float]] = {}
    pat = re.compile(r"by_tag/(.+)/" + re.escape(key) + "$")
    for c in configs:
        for mk, v in c.metrics.items():
            m = pat.fullmatch(mk)
            if m:
                data.setdefault(c.label, {})[m.group(1)] = v
    df = pd.DataFrame(data).sort_index()
    if df.empty:
        return df
    t = configs[0].table  # the eval set is shared: tag sizes from one table (queries the key is defined on)
    defined = t[key].notna() if key in t.columns else pd.Series(True, index=t.index)
    n = Counter(tag for tags, ok in zip(t["tags"], defined, strict=True) if ok for tag in _tag_list(tags))
    df.index = [f"{tag} (n={n.get(tag, 0)})" for tag in df.index]
    return df


def _tag_list(tags: Any) -> list[str]:
    if tags is None or (isinstance(tags, float) and math.isnan(tags)):
        return []
    if isinstance(tags, str):
        return [x for x in tags.split(",") if x]
    return [str(x) for x in tags]


def plot_tags(tags: pd.DataFrame, key: str, path: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(7.0, 0.9 * len(tags) * max(1, len(tags.columns)) / 2 + 3), 4.4))
    series = {col: tags[col].tolist() for col in tags.columns}
    _grouped_bars(ax, list(tags.index), series, None, _colors(len(series)))
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(f"{key} (mean over the tag's queries)")
    ax.set_title(f"{key} per eval-set tag")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    return _save(fig, path)


def plot_main_effects(att: SweepAttribution, metric: str, path: Path) -> Path | None:
    mar = att.marginals
    if mar.empty or metric not in set(mar["metric"]):
        return None
    factors = list(att.factors)
    plt = _plt()
    fig, axes = plt.subplots(1, len(factors), figsize=(max(5.0, 4.2 * len(factors)), 4.0), squeeze=False)
    for ax, f in zip(axes[0], factors, strict=True):
        d = mar[(mar["factor"] == f) & (mar["metric"] == metric)]
        x = np.arange(len(d))
        y = d["mean"].to_numpy(float)
        lo = np.maximum(y - d["ci_low"].to_numpy(float), 0)
        hi = np.maximum(d["ci_high"].to_numpy(float) - y, 0)
        colors = ["#1f77b4" if b else "#ff7f0e" for b in d["is_baseline_level"]]
        ax.errorbar(x, y, yerr=[lo, hi], fmt="none", ecolor="#444", capsize=4)
        ax.scatter(x, y, c=colors, zorder=3, s=40)
        ax.set_xticks(x)
        ax.set_xlim(-0.6, len(d) - 0.4)
        ax.set_xticklabels(d["level"].astype(str), rotation=20 if len(d) > 3 else 0, fontsize=8)
        ax.set_title(f"{f} (blue: baseline level)", fontsize=10)
        ax.set_ylabel(f"marginal mean {metric}")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Factor main effects on {metric} (95 % bootstrap CI over queries)", fontsize=11)
    return _save(fig, path)


# --------------------------------------------------------------------------------------------- sections


def _worst(c: Config, k: int, n: int, gen: bool) -> pd.DataFrame:
    t = c.table.copy()
    rel, answerable = relevance_matrix(t, _min_coverage(c))
    first = np.where(rel.any(axis=1), rel.argmax(axis=1) + 1, 0) if rel.size else np.zeros(len(t), int)
    t["_first"] = first
    t["_rel"] = list(rel) if rel.size else [np.zeros(0, bool)] * len(t)
    t["_answerable"] = answerable
    severity = {"error": 0, "retrieval_failure": 1, "generation_failure": 2, "correct_without_evidence": 3}
    t["_sev"] = t.get("failure_label", pd.Series("", index=t.index)).map(lambda x: severity.get(x, 9))
    if not gen:  # retrieval-only: unanswerable items have no retrieval verdict
        t = t[t["_answerable"]]
    keys = ["_sev"]
    for col in (["correctness", "faithfulness"] if gen else []) + [
        "mrr",
        f"evidence_recall_at_{k}",
        f"ndcg_at_{k}",
    ]:
        if col in t.columns:
            keys.append(col)
    t = t.sort_values(keys + ["id"], kind="stable", na_position="last")
    return t.head(n)


def _worst_rows(t: pd.DataFrame, gen: bool) -> list[list[str]]:
    rows = []
    for _, r in t.iterrows():
        ret = sorted(_json(r.get("retrieved"), []), key=lambda x: x["rank"])[:3]
        rel = r["_rel"]
        top = "; ".join(
            f"{x['rank']}. {x['chunk_id']} {'✓' if i < len(rel) and rel[i] else '✗'}"
            for i, x in enumerate(ret)
        )
        gold = "; ".join(f"{d}[{s}:{e}]" for d, s, e in _json(r.get("gold_spans"), [])) or "(unanswerable)"
        tags = ", ".join(_tag_list(r.get("tags")))
        row = [
            str(r["id"]),
            str(r["query"]),
            tags,
            gold,
            str(r.get("failure_label", "")),
            str(int(r["_first"])) if r["_first"] else "none",
            top,
        ]
        if gen:
            ans = str(r.get("answer") or "")
            row += [
                _f(r.get("correctness"), 2),
                _f(r.get("faithfulness"), 2),
                ans[:200] + ("…" if len(ans) > 200 else ""),
            ]
        rows.append(row)
    return rows


def metric_definitions(gen: bool, judge_choice: str | None) -> list[tuple[str, str]]:
    """(name, docstring) of the functions that compute every reported number."""
    from rag_experiments.evaluation import aggregate, labels
    from rag_experiments.evaluation import metrics as M
    from rag_experiments.stages import judging

    fns: list[tuple[str, Callable]] = [
        ("relevance (chunk ↔ gold span)", M.relevance),
        ("hit_at_{k}", M.hit_at_k),
        ("evidence_recall_at_{k}", M.evidence_recall_at_k),
        ("mrr (mean of the per-query reciprocal rank)", M.reciprocal_rank),
        ("context_precision_at_{k}", M.context_precision_at_k),
        ("ndcg_at_{k}", M.ndcg_at_k),
        ("aggregates: mean and 95 % CI", aggregate.mean_ci),
        ("failure_label and rate_{label}", labels.failure_label),
    ]
    if gen:
        fns += [
            ("faithfulness", judging.faithfulness),
            ("claims (answer → atomic claims)", judging.split_claims),
            ("correctness", judging.correctness),
            ("key-fact match", judging.key_fact_recall),
            ("text normalisation for key facts", judging.normalise_text),
        ]
        judge_cls = {
            "heuristic": judging.HeuristicJudge,
            "openai": judging.LLMJudge,
            "local": judging.LocalLLMJudge,
        }.get(judge_choice or "")
        if judge_cls is not None:
            fns.append((f"judge ({judge_choice}): verdicts", judge_cls))
            fns.append((f"judge ({judge_choice}): answer_relevance", judge_cls.answer_relevance))
    fns.append(("attribution: factor effects", factor_effects))
    out = []
    for name, fn in fns:
        doc = inspect.getdoc(fn) or "(no docstring)"
        out.append((name, f"{fn.__module__}.{fn.__qualname__}\n\n{doc}"))
    return out


def _reproduce_command(run: Run) -> str:
    ov = _json(run.data.tags.get("overrides"), [])
    return "python -m rag_experiments.sweep " + " ".join(shlex.quote(o) for o in ov if isinstance(o, str))


def _constant_or_per_config(
    configs: Sequence[Config], get: Callable[[Config], str | None]
) -> tuple[str, bool]:
    vals = [get(c) for c in configs]
    uniq = sorted({v for v in vals if v})
    if len(uniq) <= 1:
        return (uniq[0] if uniq else "–"), True
    return "; ".join(f"{c.label}: {v or '–'}" for c, v in zip(configs, vals, strict=True)), False


# --------------------------------------------------------------------------------------------- report


@dataclass
class Report:
    out_dir: Path
    markdown: Path
    html: Path
    pngs: list[Path]
    baseline: str | None
    primary: str
    notes: list[str]


def in_brief(
    configs: Sequence[Config], base: Config, primary: str, att: SweepAttribution | None
) -> list[str]:
    """The short answer: the best config on the primary metric and what differs from it, with CIs."""
    m = base.metrics
    out = [f"Baseline **{base.label}**: {primary} = {_with_ci(m, primary)}."]
    if att is None or att.effects.empty:
        return out
    eff = att.effects
    for r in eff[eff["metric"] == primary].itertuples():
        verdict = "significant" if r.p_holm < 0.05 else "not significant"
        out.append(
            f"{r.factor}={r.level}: {primary} {_f(r.mean_b)}, delta {_f(r.delta, signed=True)} "
            f"[{_f(r.ci_low, signed=True)}, {_f(r.ci_high, signed=True)}], p_holm {_p(r.p_holm)} ({verdict})"
        )
    sig = eff[eff["p_holm"] < 0.05]
    if sig.empty:
        out.append("No one-factor-at-a-time difference is significant after Holm correction (p_holm < 0.05).")
    else:
        out.append(
            "Significant after Holm (p_holm < 0.05): "
            + "; ".join(
                f"{r.factor}={r.level} on {r.metric} ({_f(r.delta, signed=True)} "
                f"[{_f(r.ci_low, signed=True)}, {_f(r.ci_high, signed=True)}])"
                for r in sig.itertuples()
            )
            + "."
        )
    return out


def choose_baseline(configs: Sequence[Config], primary: str, baseline: str | None) -> Config:
    if baseline:
        for c in configs:
            if baseline in (c.run.info.run_id, c.run.info.run_name, c.label):
                return c
        raise RunInputError(
            f"--baseline {baseline!r} is not a run of this report; runs: "
            + ", ".join(f"{c.label} ({c.run.info.run_id})" for c in configs)
        )
    # best on the primary metric; ties: higher MRR, then the first run
    return max(
        configs, key=lambda c: (c.metrics.get(primary, -1.0), c.metrics.get("mrr", -1.0), -configs.index(c))
    )


def build_report(
    client: MlflowClient,
    target: Target,
    out_dir: Path,
    baseline: str | None = None,
    primary: str | None = None,
    n_worst: int = 5,
    seed: int = 0,
    n_resamples: int = 4999,
) -> Report:
    out_dir.mkdir(parents=True, exist_ok=True)
    configs, factors = load_configs(client, target.runs)
    gen = has_generation(configs)
    k = _context_k(configs)
    primary = primary or f"hit_at_{k}"
    missing = [c.label for c in configs if primary not in c.table.columns]
    if missing:
        raise RunInputError(f"metric {primary!r} is not in the per-query table of: {', '.join(missing)}")
    base = choose_baseline(configs, primary, baseline)
    notes: list[str] = []
    digests = {c.run.data.tags.get("evalset_digest") for c in configs} - {None}
    if len(digests) > 1:
        notes.append(
            "**warning**: the runs were evaluated on different eval sets (evalset_digest differs); "
            "paired comparisons below are not meaningful."
        )

    is_sweep = target.sweep_id is not None
    title = f"RAG sweep report: {target.sweep_id}" if is_sweep else f"RAG run report: {target.label}"
    doc = Doc(title)
    n_q = int(max(c.metrics.get("n_queries", len(c.table)) for c in configs))
    n_unans = int(max(c.metrics.get("n_unanswerable", 0) for c in configs))
    exp = client.get_experiment(configs[0].run.info.experiment_id)

    # -- question
    doc.section("question", "Question")
    levels = {f: sorted({_level(c.data, f) or "–" for c in configs}) for f in factors}
    what = "retrieval and answer quality" if gen else "retrieval quality"
    if factors:
        doc.p(f"How does {what} on the eval set change with " + " × ".join(f"`{f}`" for f in factors) + "?")
        doc.table(["factor", "levels"], [[f, ", ".join(levels[f])] for f in factors])
    else:
        doc.p(f"What is the {what} of this configuration on the eval set? (a single run: no factor varies)")
    common = {}
    for key in sorted(set.intersection(*(set(c.run.data.params) for c in configs))):
        vals = {c.run.data.params[key] for c in configs}
        if (
            len(vals) == 1
            and key not in factors
            and not is_bookkeeping(key)
            and (
                "." not in key
                or key
                in ("retriever.k", "embedding.name", "metrics.ks", "metrics.min_coverage", "evalset.limit")
            )
        ):
            common[key] = vals.pop()
    doc.p("Held fixed: " + ", ".join(f"`{k_}={v}`" for k_, v in common.items()) + ".")
    doc.p(
        f"Experiment `{exp.name if exp else '?'}`, {len(configs)} config(s), {n_q} eval queries "
        f"({n_unans} unanswerable: excluded from retrieval metrics). Context k (`retriever.k`) = {k}; "
        f"primary metric `{primary}`; baseline = **{base.label}** "
        + ("(given with --baseline)." if baseline else f"(the best config on `{primary}`).")
    )
    for n in notes:
        doc.p(n)
    brief_at = len(doc.blocks)  # the short answer is filled in once the attribution is computed

    # -- results
    doc.section("results", "Results per config")
    doc.p(
        "Each cell: mean over the queries it is defined for, with the 95 % bootstrap CI "
        "(query-level resampling, seeded) as logged by the sweep. **Bold**: best config on that metric."
    )
    hit_ks = _logged_ks(configs)
    retrieval_keys = [f"hit_at_{x}" for x in hit_ks] + [
        f"evidence_recall_at_{k}",
        "mrr",
        f"ndcg_at_{k}",
        f"context_precision_at_{k}",
    ]
    gen_keys = [m for m in GENERATION_METRICS if any(m in c.metrics for c in configs)]
    rate_keys = [m for m in RATE_ORDER if any(m in c.metrics for c in configs)]

    def results_table(keys: Sequence[str], higher_better: bool = True, bold: bool = True) -> None:
        keys = [x for x in keys if any(x in c.metrics for c in configs)]
        best = {}
        for key in keys:
            vals = [c.metrics[key] for c in configs if key in c.metrics]
            best[key] = max(vals) if higher_better else min(vals)
        rows = []
        for c in configs:
            cells = [c.label + (" (baseline)" if c is base else "")]
            for key in keys:
                cell = _with_ci(c.metrics, key)
                if bold and len(configs) > 1 and key in c.metrics and c.metrics[key] == best[key]:
                    cell = f"**{cell}**"
                cells.append(cell)
            rows.append(cells)
        doc.table(["config"] + list(keys), rows)

    doc.h3("Retrieval")
    results_table(retrieval_keys)
    if gen_keys:
        doc.h3("Generation")
        results_table(gen_keys)
    if rate_keys:
        doc.h3("Failure-label rates")
        results_table(rate_keys, bold=False)
    doc.h3("Counts")
    doc.table(
        ["config", "run", "n_queries", "n_unanswerable", "n_errors", "n_unparseable_verdicts", "status"],
        [
            [
                c.label,
                c.run.info.run_id,
                _f(c.metrics.get("n_queries"), 0),
                _f(c.metrics.get("n_unanswerable"), 0),
                _f(c.metrics.get("n_errors"), 0),
                _f(c.metrics.get("n_unparseable_verdicts"), 0),
                c.run.info.status,
            ]
            for c in configs
        ],
    )

    # -- attribution
    doc.section("attribution", "Attribution (one factor at a time)")
    att_metrics = [primary] + [m for m in (f"evidence_recall_at_{k}", "mrr", f"ndcg_at_{k}") if m != primary]
    att_metrics += [m for m in (*GENERATION_METRICS, "rate_ok") if all(m in c.table.columns for c in configs)]
    att_metrics = [m for m in att_metrics if all(m in c.table.columns for c in configs)]
    att = None
    if len(configs) > 1 and factors:
        att = factor_effects(
            [c.data for c in configs], base.data, att_metrics, seed=seed, n_resamples=n_resamples
        )
        doc.p(
            f"Each level is compared with the baseline **{base.label}**, every other factor at the "
            "baseline's value. delta = mean(level) − mean(baseline) over the queries defined in both; "
            "95 % CI: paired percentile bootstrap over queries; p: exact McNemar for 0/1 metrics, "
            "paired sign-flip permutation otherwise; p_holm: Holm-adjusted across every comparison "
            "of the attribution (* = p_holm < 0.05)."
        )
        if att.effects.empty:
            doc.p("(no one-factor-at-a-time comparison is possible in this grid)")
        else:
            rows = effect_rows(att.effects, _f, _p)
            doc.table(
                EFFECT_HEADERS,
                rows,
            )
        if att.skipped:
            doc.p("Not in the grid (comparison skipped): " + "; ".join(att.skipped))
        if len(factors) > 1 and not att.marginals.empty:
            doc.h3("Marginal means over the grid")
            rows = [
                [
                    f"{r.factor}={r.level}" + (" (baseline)" if r.is_baseline_level else ""),
                    r.metric,
                    str(r.n_runs),
                    _f(r.mean),
                    f"[{_f(r.ci_low)}, {_f(r.ci_high)}]",
                    _f(r.delta_vs_baseline_level, signed=True),
                    _p(r.p_holm),
                ]
                for r in att.marginals.itertuples()
            ]
            doc.table(["level", "metric", "runs", "mean", "95% CI", "vs baseline level", "p_holm"], rows)
        if not att.noise_floor.empty:
            doc.h3("A/A noise floor")
            doc.table(NOISE_HEADERS, noise_rows(att.noise_floor, _f))
            doc.p(f"Method: {att.noise_floor['detail'].iloc[0]}")
    else:
        doc.p(
            "A single configuration: there is no factor to attribute. Use `python -m rag_experiments.compare "
            "RUN_A RUN_B` to compare two runs."
        )

    doc.blocks[brief_at:brief_at] = [("p", "In brief:"), ("ul", in_brief(configs, base, primary, att))]

    # -- plots
    doc.section("plots", "Plots")
    pngs: list[Path] = []
    curves, curve_notes = hit_curves(configs)
    if curves:
        p = plot_hit_curves(configs, curves, out_dir / "hit_at_k.png")
        pngs.append(p)
        depth = max(len(v) for v in curves.values())
        doc.img(
            p,
            f"hit@k for k = 1…{depth} per config, recomputed from the logged rankings with the "
            "pipeline's relevance function (matches the logged hit_at_k at every logged k)"
            if not curve_notes
            else "hit@k per config (see the mismatch note below)",
        )
        for n in curve_notes:
            doc.p(f"**warning**: {n}")
    p = plot_metric_bars(
        configs, [f"hit_at_{k}", "mrr"], f"Recall vs ranking: hit@{k} and MRR", out_dir / "recall_vs_mrr.png"
    )
    pngs.append(p)
    gaps = ", ".join(
        f"{c.label}: {_f(c.metrics.get(f'hit_at_{k}', float('nan')) - c.metrics.get('mrr', float('nan')))}"
        for c in configs
    )
    doc.img(
        p,
        f"hit@{k} and MRR per config with 95 % CIs. The gap is evidence found in the top {k} but not "
        f"ranked first: hit@{k} − MRR = {gaps}",
    )
    counts = label_counts(configs)
    if not counts.empty:
        p = plot_failure_labels(counts, out_dir / "failure_labels.png")
        pngs.append(p)
        doc.img(
            p,
            "Failure-label breakdown per config (share of all queries"
            + (
                ""
                if gen
                else "; retrieval-only runs label a query `retrieved` or "
                "`retrieval_failure`, unanswerable items count as `retrieved`"
            )
            + ")",
        )
    tags = tag_table(configs, f"hit_at_{k}")
    if not tags.empty:
        p = plot_tags(tags, f"hit_at_{k}", out_dir / "per_tag.png")
        pngs.append(p)
        doc.img(p, f"hit@{k} per eval-set tag and config (by_tag/<tag>/hit_at_{k})")
    if gen_keys:
        p = plot_metric_bars(configs, gen_keys, "Generation metrics (95 % CI)", out_dir / "generation.png")
        pngs.append(p)
        doc.img(p, "Faithfulness, answer relevance and correctness per config with 95 % CIs")
        gtags = tag_table(configs, "correctness")
        if not gtags.empty:
            p = plot_tags(gtags, "correctness", out_dir / "per_tag_correctness.png")
            pngs.append(p)
            doc.img(p, "correctness per eval-set tag and config")
    if att is not None:
        p = plot_main_effects(att, primary, out_dir / "main_effects.png")
        if p is not None:
            pngs.append(p)
            doc.img(
                p,
                f"Factor main effects: marginal mean {primary} per level with 95 % bootstrap CI over "
                "queries (baseline level in blue)",
            )

    # -- worst queries
    doc.section("worst", "Worst queries")
    doc.p(
        f"Per config, the {n_worst} worst queries: by failure label (error, retrieval_failure, "
        "generation_failure, correct_without_evidence first)"
        + (", then correctness and faithfulness" if gen else "")
        + f", then reciprocal rank, evidence_recall@{k} and nDCG@{k} (lowest first). Top 3 retrieved "
        "chunks: ✓ relevant to a gold span, ✗ not. 'first rel.': rank of the first relevant chunk."
    )
    headers = ["id", "query", "tags", "gold span(s)", "failure label", "first rel.", "top 3 retrieved"]
    if gen:
        headers += ["correct.", "faithf.", "answer"]
    for c in configs:
        doc.h3(c.label)
        doc.table(headers, _worst_rows(_worst(c, k, n_worst, gen), gen))

    # -- definitions
    doc.section("definitions", "Metric definitions")
    doc.p("The docstrings of the functions that computed every number above, verbatim.")
    judge_choice = configs[0].run.data.params.get("judge") if gen else None
    for name, text in metric_definitions(gen, judge_choice):
        doc.h3(name)
        doc.pre(text)

    # -- reproducibility
    doc.section("reproducibility", "Reproducibility")
    ptags = target.parent.data.tags if target.parent is not None else configs[0].run.data.tags
    commit, _ = _constant_or_per_config(configs, lambda c: c.run.data.tags.get("git_commit"))
    dirty, _ = _constant_or_per_config(configs, lambda c: c.run.data.tags.get("git_dirty"))
    items = [
        f"git commit: `{ptags.get('git_commit', commit)}` (dirty: {ptags.get('git_dirty', dirty)})",
        f"corpus digest: `{_constant_or_per_config(configs, lambda c: c.run.data.tags.get('corpus_digest'))[0]}`",
        f"eval-set digest: `{_constant_or_per_config(configs, lambda c: c.run.data.tags.get('evalset_digest'))[0]}`",
        f"MLflow experiment: `{exp.name if exp else '?'}` ({configs[0].run.info.experiment_id}); "
        + (f"sweep parent run `{target.log_run_id}`" if is_sweep else f"run `{target.log_run_id}`"),
    ]
    if commit != ptags.get("git_commit", commit):
        items.append(f"children's git commit(s): {commit}")
    doc.ul(items)
    doc.h3("Models")
    model_rows = []
    for c in configs:
        p_ = c.run.data.params
        t_ = c.run.data.tags
        emb = ", ".join(
            f"{kk}={v}"
            for kk, v in sorted(p_.items())
            if kk == "embedding" or (kk.startswith("embedding.") and kk != "embedding._target_")
        )
        if gen:
            jm = t_.get("judge_model")
            jm = jm if jm and jm != "None" else p_.get("judge", "–")
            jparams = ", ".join(
                f"{kk[len('judge.') :]}={v}"
                for kk, v in sorted(p_.items())
                if kk.startswith("judge.") and kk != "judge._target_"
            )
            judge = f"{jm} ({jparams})" if jparams else jm
            if t_.get("judge_is_generator") == "true":
                judge += " (same as generator!)"
            generator = t_.get("generator_model") or p_.get("generator", "–")
        else:
            judge, generator = "– (retrieval only)", p_.get("generator", "none")
        model_rows.append(
            [
                c.label,
                emb or "–",
                f"{p_.get('retriever', '–')} (k={p_.get('retriever.k', '–')})",
                generator,
                judge,
            ]
        )
    doc.table(["config", "embedding", "retriever", "generator", "judge"], model_rows)
    doc.h3("Package versions")
    pkgs = sorted(
        {kk[len("version.") :] for c in configs for kk in c.run.data.tags if kk.startswith("version.")}
    )
    vrows = []
    for pkg in pkgs:
        v, _ = _constant_or_per_config(configs, lambda c, pkg=pkg: c.run.data.tags.get(f"version.{pkg}"))
        vrows.append([pkg, v])
    doc.table(["package", "version"], vrows or [["–", "not logged"]])
    doc.h3("Commands")
    if is_sweep:
        doc.p("The sweep, exactly as launched (parent run tag `command`):")
        doc.pre(ptags.get("command") or "(not logged)")
    doc.p(
        "Each config on its own (its Hydra overrides; add `force=true` to recompute a config that already "
        "FINISHED in this tracking store):"
    )
    doc.pre("\n".join(f"# {c.label}\n{_reproduce_command(c.run)}" for c in configs))
    doc.h3("Cache keys and config hashes")
    ck_names = sorted({kk for c in configs for kk in c.run.data.tags if kk.startswith("cache_key.")})
    doc.table(
        ["config", "config_hash"] + ck_names,
        [
            [c.label, c.run.data.tags.get("config_hash", "–")]
            + [c.run.data.tags.get(kk, "–") for kk in ck_names]
            for c in configs
        ],
    )
    doc.p(f"Report generated by `python -m rag_experiments.report.build {target.label}`.")

    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text(render_markdown(doc), encoding="utf-8")
    html_path.write_text(render_html(doc), encoding="utf-8")
    return Report(out_dir, md_path, html_path, pngs, base.label, primary, notes + curve_notes)


def log_report(client: MlflowClient, run_id: str, report: Report) -> None:
    for path in [report.markdown, report.html, *report.pngs]:
        client.log_artifact(run_id, str(path), artifact_path="report")


# --------------------------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rag_experiments.report.build",
        description="Markdown + self-contained HTML report (plots, attribution, metric definitions, "
        "reproducibility) for a sweep or a run, logged to the sweep's parent run. "
        "Exit 0 ok, 2 bad input.",
    )
    p.add_argument("target", metavar="RUN_OR_SWEEP", help="sweep_id, parent run id/name, or run id/name")
    p.add_argument("--out", type=Path, metavar="DIR", help="default: reports/<sweep_id or run>")
    p.add_argument("--baseline", metavar="RUN", help="baseline for the attribution (default: best config)")
    p.add_argument("--metric", metavar="KEY", help="primary metric (default: hit_at_<retriever.k>)")
    p.add_argument("--worst", type=int, default=5, metavar="N", help="worst queries per config (default 5)")
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--experiment", metavar="NAME", help="look names up in this experiment only")
    p.add_argument("--no-log", action="store_true", help="do not log the report to MLflow")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resamples", type=int, default=4999, help="bootstrap / permutation resamples")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    client = MlflowClient(tracking_uri=tracking_uri(args.tracking_uri))
    try:
        target = resolve_target(client, args.target, args.experiment)
        out = args.out or Path("reports") / _safe(target.label)
        rep = build_report(
            client,
            target,
            out,
            baseline=args.baseline,
            primary=args.metric,
            n_worst=args.worst,
            seed=args.seed,
            n_resamples=args.resamples,
        )
    except RunInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {rep.markdown}, {rep.html} and {len(rep.pngs)} plots in {rep.out_dir}")
    print(f"baseline: {rep.baseline}; primary metric: {rep.primary}")
    for n in rep.notes:
        print(n.replace("**", ""), file=sys.stderr)
    if not args.no_log:
        log_report(client, target.log_run_id, rep)
        print(f"logged report/ on run {target.log_run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
