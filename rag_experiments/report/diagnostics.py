"""The report's "Claim-level diagnostics" section (definitions in docs/metrics.md, same heading)."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from rag_experiments.core.query_table import cell
from rag_experiments.evaluation.registry import DIAGNOSTIC_METRICS, higher_is_better
from rag_experiments.report.model import (
    Analysis,
    Bullets,
    Paragraph,
    Section,
    Subsection,
    bold,
    code,
    table,
    with_ci,
)
from rag_experiments.report.model import text as rich

#: One line per diagnostic: what a value says (the formulas are in docs/metrics.md).
EXPLAIN = {
    "claim_recall": "share of the gold answer's claims the retrieved context entails (retrieval "
    "reached the facts)",
    "context_utilization": "of the gold claims the context held, the share the answer states (the "
    "generator used the evidence it had)",
    "noise_sensitivity_relevant": "share of answer claims that are wrong yet come from a relevant chunk",
    "noise_sensitivity_irrelevant": "share of answer claims that are wrong and come only from "
    "irrelevant chunks",
    "hallucination": "share of answer claims in no retrieved chunk and wrong (invented)",
    "self_knowledge": "share of answer claims in no retrieved chunk but right (from the model, not "
    "the context)",
}


def _reasons(tab: pd.DataFrame) -> Counter:
    """How often each metric was undefined, and why (the per-query ``diagnostics_nan_reason``)."""
    out: Counter = Counter()
    if "diagnostics_nan_reason" not in tab:
        return out
    for v in tab["diagnostics_nan_reason"]:
        out.update(set(cell("diagnostics_nan_reason", v).values()))  # a query counts once per reason
    return out


def diagnostics_section(an: Analysis) -> Section | None:
    """Per config, each diagnostic's mean and 95 % CI (as logged), the best per metric in bold by
    its registered direction, a line explaining each, and why queries were left undefined.
    None when no run logged a diagnostic (retrieval-only sweeps, runs before the diagnostics)."""
    keys = [m for m in DIAGNOSTIC_METRICS if any(m in c.metrics for c in an.configs)]
    if not keys:
        return None
    best = {}
    for key in keys:
        vals = [c.metrics[key] for c in an.configs if key in c.metrics and c.metrics[key] == c.metrics[key]]
        if len(set(vals)) > 1:  # a tie shared by every config is no "best"
            best[key] = max(vals) if higher_is_better(key) else min(vals)
    rows = []
    for c in an.configs:
        cells: list = [c.label + (" (baseline)" if c is an.base else "")]
        for key in keys:
            cell = with_ci(c.metrics, key)
            mark = len(an.configs) > 1 and key in best and c.metrics.get(key) == best[key]
            cells.append(bold(cell) if mark else cell)
        rows.append(cells)
    s = Section("diagnostics", "Claim-level diagnostics")
    s.blocks.append(
        Paragraph(
            rich(
                "After RAGChecker (Ru et al. 2024), with the run's own judge: gold claims (from the gold "
                "answer) against the retrieved context and the answer, answer claims against each "
                "retrieved chunk and the gold answer. Mean over the judged answers with the 95 % "
                "bootstrap CI; ",
                bold("bold"),
                ": best config by the metric's direction. Undefined queries are left out, not 0.",
            )
        )
    )
    s.blocks.append(table(["config", *keys], rows))
    s.blocks.append(Bullets([rich(code(k), ": ", EXPLAIN[k]) for k in keys]))
    undefined = [
        [c.label, reason, str(n)] for c in an.configs for reason, n in sorted(_reasons(c.table).items())
    ]
    unp = [[c.label, str(int(c.metrics.get("n_unparseable_diagnostic_verdicts", 0)))] for c in an.configs]
    blocks: list = [table(["config", "reason", "queries"], undefined)] if undefined else []
    blocks.append(table(["config", "unparseable diagnostic verdicts (left out)"], unp))
    s.subsections.append(Subsection("Undefined values", blocks))
    return s
