"""Per-turn breakdowns of conversation runs (docs/conversations.md): each metric's mean per turn
index, answerability and standalone-or-not, and the paired difference of each history option
against a baseline with its bootstrap CI, per group (``analysis.stats.paired_deltas``: pairs are
eval ids, ``<conversation_id>#<turn>``, so a pair is one turn of one conversation).

The groups are the breakdown tags the eval set gives its turns (``evalset.conversations``):
``turn:1``, ``turn:2``, ``turn:3plus``, ``answerability:<label>``, ``standalone:yes|no``; ``all`` is
every turn. A metric undefined on a turn (retrieval metrics of a turn without gold) is NaN there
and left out of that turn's means and pairs, never averaged as 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rag_experiments.analysis.stats import PairedResult, paired_deltas

PREFIXES = ("turn:", "answerability:", "standalone:")


@dataclass
class GroupRow:
    """One group of turns: its size, each config's mean per metric, and each non-baseline config's
    paired difference against the baseline per metric."""

    group: str
    n: int
    means: dict[str, dict[str, float]] = field(default_factory=dict)  # config → metric → mean
    deltas: dict[str, dict[str, PairedResult]] = field(default_factory=dict)  # config → metric → Δ


def groups(table: pd.DataFrame) -> list[str]:
    """``all``, then the table's breakdown tags in a fixed order (turn index, answerability,
    standalone)."""
    found = {t for ts in table["tags"] for t in ts if t.startswith(PREFIXES)}
    order = {p: i for i, p in enumerate(PREFIXES)}
    return ["all", *sorted(found, key=lambda t: (order[t.split(":")[0] + ":"], t.replace("3plus", "9")))]


def breakdown(
    tables: dict[str, pd.DataFrame], baseline: str, metrics: list[str], seed: int = 0, n_resamples: int = 2000
) -> list[GroupRow]:
    """Per group of turns (:func:`groups` of the baseline's table): means and paired deltas."""
    base = tables[baseline].drop_duplicates("id").set_index("id")
    rows = []
    for g in groups(base.reset_index()):
        ids = base.index if g == "all" else base.index[base["tags"].map(lambda ts, g=g: g in ts).to_numpy()]
        row = GroupRow(g, len(ids))
        for name, t in tables.items():
            sub = t.drop_duplicates("id").set_index("id").reindex(ids)
            row.means[name] = {m: float(np.nanmean(sub[m].to_numpy(dtype=float))) if sub[m].notna().any()
                               else float("nan") for m in metrics}  # fmt: skip
            if name != baseline:
                res = paired_deltas(
                    base.loc[ids, metrics], sub[metrics], metrics, seed=seed, n_resamples=n_resamples
                )
                row.deltas[name] = {r.metric: r for r in res}
        rows.append(row)
    return rows


def markdown(rows: list[GroupRow], metrics: list[str], baseline: str) -> str:
    """The breakdown as a Markdown table: per group and metric, each config's mean and each
    non-baseline config's Δ [95 % CI] against ``baseline``."""
    configs = list(rows[0].means) if rows else []
    others = [c for c in configs if c != baseline]
    head = ["turns", "n", "metric", *configs, *(f"Δ {c} − {baseline} [95% CI]" for c in others)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    no_gold = [r for r in rows if all(np.isnan(r.means[c][m]) for c in configs for m in metrics)]
    for r in rows:
        if r in no_gold:  # turns without gold evidence: no retrieval metric is defined on them
            continue
        for m in metrics:
            cells = [r.group, str(r.n), m, *(f"{r.means[c][m]:.3f}" for c in configs)]
            for c in others:
                d = r.deltas[c][m]
                cells.append(
                    f"{d.delta:+.3f} [{d.ci_low:+.3f}, {d.ci_high:+.3f}] (n={d.n_pairs})"
                    if d.n_pairs
                    else "–"
                )
            out.append("| " + " | ".join(cells) + " |")
    if no_gold:
        out.append("")
        out.append("No gold evidence, so no retrieval metric (NaN, left out): "
                   + ", ".join(f"{r.group} ({r.n} turns)" for r in no_gold) + ".")  # fmt: skip
    return "\n".join(out)
