"""Report sections for sweeps that need more than one-factor-at-a-time: the interactions of a
full-factorial grid (``analysis.interactions``) and the configs a racing sweep stopped early
(``analysis.racing``; docs/racing.md)."""

from __future__ import annotations

from rag_experiments.analysis.interactions import interaction_headers, interaction_rows
from rag_experiments.analysis.racing import STOPPED_HEADERS, STOPPED_NOTE, stopped_rows
from rag_experiments.report.load import ReportInput
from rag_experiments.report.model import Analysis, Paragraph, Section, Subsection, table, text


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
