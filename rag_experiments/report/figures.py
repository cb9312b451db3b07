"""The Plots section: what each figure shows, computed from the runs (drawn by ``report/plots.py``)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pandas as pd

from rag_experiments.analysis.comparability import comparability, logged_budgets
from rag_experiments.evaluation.labels import FAILURE_LABELS
from rag_experiments.evaluation.registry import parse
from rag_experiments.report.load import Config
from rag_experiments.report.model import Analysis, Figure, Paragraph, Section, bold, code, f3, text
from rag_experiments.report.plots import (
    HitCurves,
    LabelShares,
    MainEffects,
    MetricBars,
    TagBars,
    VarianceShares,
)
from rag_experiments.report.queries import min_coverage, relevance_matrix, tag_list


def hit_curves(configs: Sequence[Config]) -> tuple[dict[str, list[float]], list[str]]:
    """hit@k for k = 1 … ranking depth per config, recomputed from the per-query rankings.

    hit@k = share of answerable queries with a relevant chunk in the top k. Checked against the
    logged ``hit_at_{k}`` metrics; a mismatch is reported, never hidden.
    """
    curves: dict[str, list[float]] = {}
    notes: list[str] = []
    for c in configs:
        t = c.table
        if "retrieved" not in t.columns or "gold_spans" not in t.columns:
            continue
        rel, answerable = relevance_matrix(t, min_coverage(c))
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


def _logged_points(c: Config, depth: int) -> list[tuple[int, float, float, float]]:
    m = c.metrics
    out = []
    for k in range(1, depth + 1):
        if (v := m.get(f"hit_at_{k}")) is not None:
            out.append((k, v, m.get(f"hit_at_{k}_ci_low", v), m.get(f"hit_at_{k}_ci_high", v)))
    return out


def _ci_err(c: Config, key: str) -> tuple[float, float, float]:
    v = c.metrics.get(key, float("nan"))
    lo, hi = c.metrics.get(key + "_ci_low", v), c.metrics.get(key + "_ci_high", v)
    return v, max(v - lo, 0.0), max(hi - v, 0.0)


def metric_bars(configs: Sequence[Config], keys: Sequence[str], title: str) -> MetricBars:
    return MetricBars([c.label for c in configs], {k: [_ci_err(c, k) for c in configs] for k in keys}, title)


def label_shares(configs: Sequence[Config]) -> pd.DataFrame:
    """Share of each failure label among a config's queries (rows: configs; missing labels: 0)."""
    rows = {}
    for c in configs:
        if "failure_label" in c.table.columns:
            labels = c.table["failure_label"].fillna("missing").astype(str)
            rows[c.label] = labels.value_counts(normalize=True)
    df = pd.DataFrame(rows).T.fillna(0.0)
    order = [x for x in FAILURE_LABELS if x in df.columns] + sorted(set(df.columns) - set(FAILURE_LABELS))
    return df[order] if len(df) else df


def tag_table(configs: Sequence[Config], key: str) -> pd.DataFrame:
    """by_tag/{tag}/{key} per config (rows: ``tag (n=…)``, columns: config labels)."""
    data: dict[str, dict[str, float]] = {}
    pat = re.compile(r"by_tag/(.+)/" + re.escape(key) + "$")
    for c in configs:
        for mk, v in c.metrics.items():
            if m := pat.fullmatch(mk):
                data.setdefault(c.label, {})[m.group(1)] = v
    df = pd.DataFrame(data).sort_index()
    if df.empty:
        return df
    t = configs[0].table  # the eval set is shared: tag sizes from one table (queries the key is defined on)
    defined = t[key].notna() if key in t.columns else pd.Series(True, index=t.index)
    n = Counter(tag for tags, ok in zip(t["tags"], defined, strict=True) if ok for tag in tag_list(tags))
    df.index = [f"{tag} (n={n.get(tag, 0)})" for tag in df.index]
    return df


def why_shown(an: Analysis, key: str) -> str:
    """ "" when ``key`` is comparable across the configs; else why the figure shows it anyway (its
    shape within a config), what breaks it and the metric the verdict reads (the caption's lead)."""
    c = comparability(key, [x.data for x in an.configs])
    if c.comparable or len(an.configs) < 2:
        return ""
    return (
        f"Not for comparing configs: {c.detail}, so {key} counts different things; shown for each "
        f"config's own ranking. The verdict reads {an.primary} (the equal-budget figure). "
    )


def _budget_figure(an: Analysis) -> Figure | None:
    """Evidence recall at every logged token budget per config: the comparable metric when what is
    retrieved differs (chunkers, an app's contexts); None when no budget is logged by every config."""
    common = set.intersection(*(set(c.metrics) for c in an.configs))
    keys = [f"evidence_recall_at_{b}tok" for b in logged_budgets(common)]
    keys = [k for k in keys if k in common]
    if len(an.configs) < 2 or not keys:
        return None
    v = an.verdict
    caption = (
        "Evidence recall at every logged token budget per config with 95 % CIs: every config fills the "
        "same B-token context, so these compare across chunkers and applications"
        + (f"; {v.budget_text}" if v is not None and v.budget_text else "")
    )
    return Figure(
        "evidence_recall_by_budget.png",
        text(caption),
        metric_bars(an.configs, keys, "Equal-budget evidence recall (95 % CI)"),
    )


def _hit_figure(an: Analysis, s: Section) -> list[str]:
    curves, notes = hit_curves(an.configs)
    if not curves:
        return notes
    depth = max(len(v) for v in curves.values())
    logged = {c.label: _logged_points(c, len(curves[c.label])) for c in an.configs if c.label in curves}
    caption = why_shown(an, "hit_at_1") + (
        f"hit@k for k = 1…{depth} per config, recomputed from the logged rankings with the pipeline's "
        "relevance function (matches the logged hit_at_k at every logged k)"
        if not notes
        else "hit@k per config (see the mismatch note below)"
    )
    plot = HitCurves([c.label for c in an.configs], curves, logged)
    s.blocks.append(Figure("hit_at_k.png", text(caption), plot))
    s.blocks += [Paragraph(text(bold("warning"), f": {n}")) for n in notes]
    return notes


def _recall_vs_mrr(an: Analysis) -> Figure:
    k = an.k
    plot = metric_bars(an.configs, [f"hit_at_{k}", "mrr"], f"Recall vs ranking: hit@{k} and MRR")
    nan = float("nan")
    gaps = ", ".join(
        f"{c.label}: {f3(c.metrics.get(f'hit_at_{k}', nan) - c.metrics.get('mrr', nan))}" for c in an.configs
    )
    caption = why_shown(an, f"hit_at_{k}") + (
        f"hit@{k} and MRR per config with 95 % CIs. The gap is evidence found in the top {k} but not "
        f"ranked first: hit@{k} − MRR = {gaps}"
    )
    return Figure("recall_vs_mrr.png", text(caption), plot)


def _label_figure(an: Analysis) -> Figure | None:
    shares = label_shares(an.configs)
    if shares.empty:
        return None
    caption = text("Failure-label breakdown per config (share of all queries")
    if not an.gen:
        caption = text(
            caption,
            "; retrieval-only runs label a query ",
            code("retrieved"),
            " or ",
            code("retrieval_failure"),
            ", unanswerable items count as ",
            code("retrieved"),
        )
    return Figure("failure_labels.png", text(caption, ")"), LabelShares(shares))


def _tag_figures(an: Analysis) -> list[Figure]:
    out = []
    key = f"hit_at_{an.k}"
    if not (tags := tag_table(an.configs, key)).empty:
        caption = f"hit@{an.k} per eval-set tag and config (by_tag/<tag>/{key})"
        out.append(Figure("per_tag.png", text(caption), TagBars(tags, key)))
    if an.gen_keys:
        caption = "Faithfulness, answer relevance and correctness per config with 95 % CIs"
        plot = metric_bars(an.configs, an.gen_keys, "Generation metrics (95 % CI)")
        out.append(Figure("generation.png", text(caption), plot))
        if not (gtags := tag_table(an.configs, "correctness")).empty:
            caption = "correctness per eval-set tag and config"
            out.append(Figure("per_tag_correctness.png", text(caption), TagBars(gtags, "correctness")))
    return out


def _main_effects(an: Analysis) -> Figure | None:
    att = an.att
    if att is None or att.marginals.empty or an.primary not in set(att.marginals["metric"]):
        return None
    caption = (
        f"Factor main effects: marginal mean {an.primary} per level with 95 % bootstrap CI over "
        "queries (baseline level in blue)"
    )
    return Figure(
        "main_effects.png", text(caption), MainEffects(att.marginals, list(att.factors), an.primary)
    )


def variance_shares(configs: Sequence[Config]) -> pd.DataFrame:
    """``var_share/{metric}/{component}`` per config and metric (rows ``config · metric``)."""

    rows: dict[str, dict[str, float]] = {}
    for c in configs:
        for key, v in c.metrics.items():
            got = parse(key)
            if got and got[0].pattern == "var_share/{metric}/{component}" and got[1]["form"] == "mean":
                label = f"{c.label} · {got[1]['metric']}" if len(configs) > 1 else got[1]["metric"]
                rows.setdefault(label, {})[got[1]["component"]] = v
    df = pd.DataFrame(rows).T
    return df[[x for x in ("query", "generation", "judge") if x in df.columns]] if len(df) else df


def _variance_figure(an: Analysis) -> Figure | None:
    shares = variance_shares(an.configs)
    if shares.empty:
        return None
    names = {"query": "queries", "generation": "generation samples (replicates)", "judge": "judge repeats"}
    caption = (
        "Variance of each generation metric split into " + ", ".join(names[c] for c in shares.columns)
        + ("" if "judge" in shares.columns else "; no judge repeats, so judge noise on "
           "different answers is inside the generation share")
        + " (nested random-effects ANOVA estimates, docs/metrics.md, docs/noise.md)"
    )  # fmt: skip
    return Figure("variance_shares.png", text(caption), VarianceShares(shares))


def plots_section(an: Analysis) -> tuple[Section, list[str]]:
    """The Plots section, and the hit@k mismatch notes (also printed by the CLI)."""
    s = Section("plots", "Plots")
    budget = _budget_figure(an)
    if budget is not None and why_shown(an, "hit_at_1"):  # the comparable view leads
        s.blocks.append(budget)
        budget = None
    notes = _hit_figure(an, s)
    s.blocks.append(_recall_vs_mrr(an))
    figs = (budget, _label_figure(an), *_tag_figures(an), _main_effects(an), _variance_figure(an))
    s.blocks += [f for f in figs if f is not None]
    return s, notes
