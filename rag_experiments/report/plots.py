"""The report's plots: plain data in (:data:`PlotData`), a PNG out (matplotlib, Agg backend).

:func:`draw` is the only entry point; the data is computed by ``report/figures.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import singledispatch
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

LABEL_COLORS = {
    "ok": "#2ca02c",
    "retrieved": "#98df8a",
    "retrieval_failure": "#d62728",
    "generation_failure": "#ff7f0e",
    "correct_without_evidence": "#9467bd",
    "error": "#7f7f7f",
}


@dataclass
class HitCurves:
    """hit@k for k = 1 … depth per config, with the logged values and CIs at the logged ks."""

    labels: list[str]  # every config in order: colours follow it, configs without a curve are skipped
    curves: dict[str, list[float]]
    logged: dict[str, list[tuple[int, float, float, float]]]  # label -> (k, value, ci_low, ci_high)


@dataclass
class MetricBars:
    """Grouped bars: per metric, per config, (mean, error below, error above)."""

    groups: list[str]
    series: dict[str, list[tuple[float, float, float]]]
    title: str


@dataclass
class LabelShares:
    """Share of queries per failure label (columns) per config (rows)."""

    shares: pd.DataFrame


@dataclass
class TagBars:
    """A metric per eval-set tag (rows) and config (columns)."""

    values: pd.DataFrame
    key: str


@dataclass
class MainEffects:
    """Marginal means of one metric per factor level (rows of ``SweepAttribution.marginals``)."""

    marginals: pd.DataFrame
    factors: list[str]
    metric: str


@dataclass
class VarianceShares:
    """Variance shares (columns: query, generation, judge) per bar (rows: ``config · metric``)."""

    shares: pd.DataFrame


PlotData = HitCurves | MetricBars | LabelShares | TagBars | MainEffects | VarianceShares


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(n: int) -> list:
    cmap = _plt().get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _save(fig, path: Path, tight: bool = True) -> Path:
    if tight:  # facets lay themselves out (subplots_adjust): tight_layout over 30 axes costs seconds
        fig.tight_layout()
    fig.savefig(path, dpi=100)
    _plt().close(fig)
    return path


def _xticklabels(ax, labels: list[str]) -> None:
    many = len(labels) > 3
    ax.set_xticks(np.arange(len(labels)))
    ax.set_xticklabels(labels, rotation=20 if many else 0, ha="right" if many else "center", fontsize=8)


@singledispatch
def draw(plot: Any, path: Path) -> Path:
    """Draw ``plot`` into the PNG ``path`` and return the path."""
    raise TypeError(f"no plot for {type(plot).__name__}")


#: More configs than this: one panel per config (facets), since a legend of that many colours
#: covers the plot and repeats colours (tab20 has 20).
FACET_ABOVE = 10


def _hit_curve(ax, plot: HitCurves, label: str, color) -> None:
    y = plot.curves[label]
    ax.plot(np.arange(1, len(y) + 1), y, marker="o", ms=3, color=color, label=label)
    pts = plot.logged.get(label, [])
    if pts:
        x, v, lo, hi = (list(col) for col in zip(*pts, strict=True))
        err = [np.subtract(v, lo), np.subtract(hi, v)]
        ax.errorbar(x, v, yerr=err, fmt="none", ecolor=color, alpha=0.6, capsize=3)


@draw.register
def _(plot: HitCurves, path: Path) -> Path:
    labels = [x for x in plot.labels if x in plot.curves]
    if len(labels) > FACET_ABOVE:  # small multiples: each config in its panel, the others in grey
        cols = 5
        rows = -(-len(labels) // cols)
        fig, axes = _plt().subplots(
            rows, cols, figsize=(2.6 * cols, 2.1 * rows), sharex=True, sharey=True, squeeze=False
        )
        for ax, label in zip(axes.flat, labels, strict=False):
            for other in labels:
                y = plot.curves[other]
                ax.plot(np.arange(1, len(y) + 1), y, color="#cccccc", lw=0.8)
            _hit_curve(ax, plot, label, "#1f77b4")
            ax.set_title(label, fontsize=7)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(labels) :]:
            ax.axis("off")
        fig.suptitle(
            "hit@k by k, one panel per config (grey: the other configs; bars: 95 % CI at the logged ks)"
        )
        fig.supxlabel("k (chunks retrieved)")
        fig.supylabel("hit@k (answerable queries)", x=0.005)
        fig.subplots_adjust(left=0.07, right=0.99, bottom=0.06, top=0.93, wspace=0.08, hspace=0.35)
        return _save(fig, path, tight=False)
    fig, ax = _plt().subplots(figsize=(8, 4.4))
    for label, color in zip(plot.labels, _colors(len(plot.labels)), strict=True):
        if label in plot.curves:
            _hit_curve(ax, plot, label, color)
    ax.set_xlabel("k (chunks retrieved)")
    ax.set_ylabel("hit@k (answerable queries)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title("hit@k by k (error bars: 95 % CI at the logged ks)")
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")  # beside the plot, never over it
    return _save(fig, path)


def _grouped_bars(ax, groups: list[str], series: dict[str, list[float]], errs: dict[str, Any] | None) -> None:
    n = max(len(series), 1)
    width = 0.8 / n
    x = np.arange(len(groups))
    for i, ((name, vals), color) in enumerate(zip(series.items(), _colors(len(series)), strict=False)):
        yerr = None if not errs or name not in errs else errs[name]
        offset = (i - (n - 1) / 2) * width
        ax.bar(
            x + offset,
            vals,
            width,
            label=name,
            color=color,
            yerr=yerr,
            capsize=3,
            error_kw={"elinewidth": 1, "alpha": 0.8},
        )
    _xticklabels(ax, groups)


@draw.register
def _(plot: MetricBars, path: Path) -> Path:
    fig, ax = _plt().subplots(figsize=(max(6.0, 1.3 * len(plot.groups) + 3), 4.2))
    series = {key: [v for v, _, _ in vals] for key, vals in plot.series.items()}
    errs = {key: [[lo for _, lo, _ in vals], [hi for _, _, hi in vals]] for key, vals in plot.series.items()}
    _grouped_bars(ax, plot.groups, series, errs)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("mean over queries (95 % CI)")
    ax.set_title(plot.title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


@draw.register
def _(plot: LabelShares, path: Path) -> Path:
    shares = plot.shares
    fig, ax = _plt().subplots(figsize=(max(6.0, 1.2 * len(shares) + 3), 4.2))
    bottom = np.zeros(len(shares))
    x = np.arange(len(shares))
    for lab in shares.columns:
        vals = shares[lab].to_numpy()
        ax.bar(x, vals, 0.6, bottom=bottom, label=lab, color=LABEL_COLORS.get(lab, "#bcbd22"))
        for xi, (b, v) in enumerate(zip(bottom, vals, strict=True)):
            if v >= 0.06:
                ax.text(xi, b + v / 2, f"{v:.0%}", ha="center", va="center", fontsize=7)
        bottom += vals
    _xticklabels(ax, list(shares.index))
    ax.set_ylabel("share of queries")
    ax.set_ylim(0, 1.0)
    ax.set_title("Failure labels per config")
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    return _save(fig, path)


@draw.register
def _(plot: TagBars, path: Path) -> Path:
    tags = plot.values
    fig, ax = _plt().subplots(figsize=(max(7.0, 0.9 * len(tags) * max(1, len(tags.columns)) / 2 + 3), 4.4))
    _grouped_bars(ax, list(tags.index), {col: tags[col].tolist() for col in tags.columns}, None)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(f"{plot.key} (mean over the tag's queries)")
    ax.set_title(f"{plot.key} per eval-set tag")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    return _save(fig, path)


@draw.register
def _(plot: MainEffects, path: Path) -> Path:
    mar, metric = plot.marginals, plot.metric
    n = len(plot.factors)
    fig, axes = _plt().subplots(1, n, figsize=(max(5.0, 4.2 * n), 4.0), squeeze=False)
    for ax, f in zip(axes[0], plot.factors, strict=True):
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


VARIANCE_COLORS = {"query": "#1f77b4", "generation": "#ff7f0e", "judge": "#9467bd"}


@draw.register
def _(plot: VarianceShares, path: Path) -> Path:
    shares = plot.shares
    fig, ax = _plt().subplots(figsize=(7.5, 0.45 * len(shares) + 1.6))
    y = np.arange(len(shares))
    left = np.zeros(len(shares))
    for comp in shares.columns:
        vals = shares[comp].fillna(0.0).to_numpy()
        ax.barh(y, vals, 0.6, left=left, label=comp, color=VARIANCE_COLORS.get(comp, "#bcbd22"))
        for yi, (lft, v) in enumerate(zip(left, vals, strict=True)):
            if v >= 0.08:
                ax.text(lft + v / 2, yi, f"{v:.0%}", ha="center", va="center", fontsize=7)
        left += vals
    ax.set_yticks(y)
    ax.set_yticklabels(list(shares.index), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.0)
    ax.set_xlabel("share of the metric's variance")
    ax.set_title("Where the variance comes from")
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    return _save(fig, path)
