"""Report sections for sweeps that need more than one-factor-at-a-time: the interactions of a
full-factorial grid (``analysis.interactions``), the configs a racing sweep stopped early
(``analysis.racing``; docs/racing.md), conversations per turn, and the per-item checks each config
newly fails against the baseline (``analysis.checks``)."""

from __future__ import annotations

import numpy as np

from rag_experiments.analysis.interactions import interaction_headers, interaction_rows
from rag_experiments.analysis.racing import STOPPED_HEADERS, STOPPED_NOTE, stopped_rows
from rag_experiments.report.load import ReportInput
from rag_experiments.report.model import Analysis, Paragraph, Section, Subsection, code, table, text


def interactions_subsection(an: Analysis) -> Subsection | None:
    """Main effects and two-way interactions with their plain-language lines (factorial sweeps)."""
    res = an.interactions
    if res is None or res.terms.empty:
        if len(an.factors) > 1:
            note = "Not a full-factorial grid: interactions are not estimated (one factor at a time only)."
            return Subsection("Interactions", [Paragraph(text(note))])
        return None
    blocks = [table(interaction_headers(res), interaction_rows(res))]
    blocks += [Paragraph(text(line)) for line in res.lines]
    blocks.append(Paragraph(text(f"Method: {res.method}.")))
    return Subsection("Main effects and two-way interactions", blocks)


def stopped_section(inp: ReportInput) -> Section | None:
    """The configs racing stopped: n, leader, partial mean (labelled), upper bound."""
    if not inp.stopped:
        return None
    s = Section("stopped", f"Stopped by racing ({len(inp.stopped)})")
    s.blocks.append(table(STOPPED_HEADERS, stopped_rows([c.data for c in inp.stopped])))
    s.blocks.append(Paragraph(text(STOPPED_NOTE)))
    return s


def checks_section(an: Analysis) -> Section | None:
    """Per config, the checks of the items' ``assert`` lists (docs/metrics.md, "Per-item
    assertions") it fails where the baseline passes, critical ones first, as ``compare`` lists
    them (``analysis.checks.newly_failing``). None when no config has checks."""
    from rag_experiments.analysis.checks import check_results, newly_failing

    base = an.base.table
    if not any(check_results(c.table) for c in an.configs):
        return None
    rows = []
    for c in an.configs:
        if c is an.base:
            continue
        broken = sorted(newly_failing(base, c.table), key=lambda f: (not f.critical, f.item_id, f.index))
        rows += [[c.label, f.item_id, f.query, f"assert[{f.index}] {f.check}", "yes" if f.critical else "", f.detail]
                 for f in broken]  # fmt: skip
    n_checks = len(check_results(base))
    s = Section("checks", f"Checks newly failing against {an.base.label} ({len(rows)})")
    if not rows:
        s.blocks.append(Paragraph(text(
            f"No config fails a check that {an.base.label} passes ({n_checks} checks on its items)."
        )))  # fmt: skip
        return s
    s.blocks.append(Paragraph(text(
        f"A check fails for a config when any of its answers to the item fails it; listed where "
        f"{an.base.label} passes it. A critical one fails ", code("gate"), " whatever the aggregates."
    )))  # fmt: skip
    s.blocks.append(table(["config", "id", "question", "check", "critical", "why"], rows))
    return s


#: What the per-turn section shows: the retrieval metrics the conversation docs lead with.
TURN_METRICS = ("hit_at_5", "evidence_recall_at_512tok")


def turn_section(an: Analysis, seed: int = 0, n_resamples: int = 2000) -> Section | None:
    """Conversations (docs/conversations.md): per turn index, answerability and standalone-or-not,
    each config's mean and each other config's paired Δ against the baseline with its 95 % CI
    (``analysis.conversations.breakdown``, pairs are (conversation, turn)), then the worst
    conversations of the baseline with their turns side by side. None when no turn is tagged."""
    from rag_experiments.analysis.conversations import breakdown, groups

    base = an.base.table
    if "tags" not in base or groups(base) == ["all"]:
        return None
    metrics = [m for m in TURN_METRICS if all(m in c.table for c in an.configs)]
    if not metrics:
        return None
    tables = {an.base.label: base} | {c.label: c.table for c in an.configs if c is not an.base}
    rows = breakdown(tables, an.base.label, metrics, seed=seed, n_resamples=n_resamples)
    others = [c for c in tables if c != an.base.label]
    head = ["turns", "n", "metric", *tables, *(f"Δ {c} − {an.base.label} [95% CI]" for c in others)]
    body = []
    for r in rows:
        for m in metrics:
            if all(np.isnan(r.means[c][m]) for c in tables):
                continue  # no gold on these turns: no retrieval metric is defined (NaN, left out)
            cells = [r.group, str(r.n), m, *(f"{r.means[c][m]:.3f}" for c in tables)]
            for c in others:
                d = r.deltas[c][m]
                cells.append(f"{d.delta:+.3f} [{d.ci_low:+.3f}, {d.ci_high:+.3f}] (n={d.n_pairs})" if d.n_pairs else "–")
            body.append(cells)
    s = Section("turns", "Per turn")
    s.blocks.append(Paragraph(text(
        "Each turn of a conversation is one eval item; groups are its turn index, answerability and "
        "whether it stands alone. Δ is paired by (conversation, turn) against the baseline, with a 95 % "
        "bootstrap CI; turns without gold evidence have no retrieval metric and are left out."
    )))  # fmt: skip
    s.blocks.append(table(head, body))
    worst = worst_conversations(base, metrics[0])
    if worst:
        s.subsections.append(Subsection(f"Worst conversations of {an.base.label} on {metrics[0]}", [
            table(["conversation", "turn", "question", metrics[0], "label"], worst)]))  # fmt: skip
    return s


def worst_conversations(table, metric: str, n: int = 3) -> list[list[str]]:
    """The ``n`` conversations with the lowest mean ``metric`` over their turns (ids
    ``<conversation>#<turn>``), every turn of each in order: the turns side by side."""
    t = table.drop_duplicates("id")
    conv = t["id"].astype(str).str.rpartition("#")[0]
    if (conv == "").all() or metric not in t:
        return []
    means = t.groupby(conv)[metric].mean().dropna().sort_values()
    rows = []
    for c in means.index[:n]:
        for _, r in t[conv == c].iterrows():
            v = r[metric]
            rows.append([c, str(r["id"]).rpartition("#")[2], str(r.get("query", "")),
                         "–" if v != v else f"{float(v):.2f}", str(r.get("failure_label", ""))])  # fmt: skip
    return rows
