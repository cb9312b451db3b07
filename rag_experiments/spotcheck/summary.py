"""The spot-check's Markdown summary and its ``spotcheck/*`` metrics and artifacts on the run."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from rag_experiments.core.formatting import fmt_num
from rag_experiments.core.run_record import RunData
from rag_experiments.spotcheck.labels import HUMAN_LABELS
from rag_experiments.spotcheck.scoring import Agreement
from rag_experiments.tracking import annotate
from rag_experiments.tracking.judge_runs import run_judge


def _f(x: float, nd: int = 3) -> str:
    return fmt_num(x, nd)


def _ppi_lines(ag: Agreement) -> list[str]:
    if ag.ppi is None or ag.judge_only is None:
        return []
    p, j = ag.ppi, ag.judge_only
    design = "1 / inclusion_prob weights" if ag.weighted else "labelled rows taken as a simple random sample"
    return [
        f"Faithfulness = share of the run's {j.n} judged claims (parseable verdicts) a human would call "
        "supported (claim-level, pooled over queries):",
        "",
        "| estimate | value | 95 % CI |",
        "|---|---|---|",
        f"| judge-corrected (PPI, {p.n} labels, {design}) | {_f(p.value)} | [{_f(p.ci_low)}, {_f(p.ci_high)}] |",
        f"| judge only (binomial CI, ignores judge error) | {_f(j.value)} | [{_f(j.ci_low)}, {_f(j.ci_high)}] |",
        "",
    ]


def judge_name(run: RunData) -> str:
    """``heuristic``, or ``openai (gpt-4o-mini)`` for a judge with a model: ``judge_runs.run_judge``'s
    name (a model-free judge's ``judge_model`` tag is "None")."""
    ref = run_judge(run)
    return ref.name if ref else run.params.get("judge", "?")


def render_summary(run: RunData, ag: Agreement, labels_path: Path, source: str | None = None) -> str:
    """``source``: where the labels came from when not the file itself (a review queue)."""
    lo, hi = ag.kappa_ci
    lines = [
        f"# Judge spot-check: {run.label}",
        "",
        f"Labels: {source or f'`{labels_path.name}`'}; judge `{judge_name(run)}`, "
        f"generator `{run.tags.get('generator_model', '?')}`.",
        "",
    ]
    if ag.warnings:
        lines += [*(f"**{w}**" for w in ag.warnings), ""]
    if ag.weighted:
        lines.append(
            f"**Population: the run's {ag.n_population} judged claims (parseable verdicts), estimated** "
            f"from {ag.n} labelled claims, each weighted by 1 / its inclusion probability (the sample "
            "over-weights borderline claims and strata). The last column describes the labelled sample only."
        )
    else:
        lines.append(
            f"**Population: the {ag.n} labelled claims only.** The label file has no inclusion_prob column, "
            "so the figures are not weighted back to the run's claims and a borderline-boosted or "
            "stratified sample over-represents hard claims."
        )
    sa = ag.sample
    head = "run's claims (estimated)" if ag.weighted else "labelled sample"
    lines += [
        "",
        f"| statistic | {head} | labelled sample |",
        "|---|---|---|",
        f"| labelled claims scored (n) | | {ag.n} |",
        f"| blank human_verdict rows (skipped) | | {ag.n_blank} |",
        f"| judge verdict unparseable (not scored) | | {ag.n_judge_unparseable} |",
        f"| agreement | {_f(ag.agreement)} | {_f(sa['agreement'])} |",
        f"| Cohen's κ (95 % bootstrap CI) | {ag.kappa_too_few or f'{_f(ag.kappa)} [{_f(lo)}, {_f(hi)}]'} | "
        f"{'too few to say' if ag.kappa_too_few else _f(sa['kappa'])} |",
        f"| leniency P(judge supported \\| human unsupported) | {_f(ag.leniency)} | {_f(sa['leniency'])} |",
        f"| strictness P(judge unsupported \\| human supported) | {_f(ag.strictness)} | {_f(sa['strictness'])} |",
        "",
        *_ppi_lines(ag),
        "Confusion matrix of the labelled sample (rows: human, columns: judge):",
        "",
        "| | " + " | ".join(ag.confusion.columns) + " |",
        "|---|" + "---|" * len(ag.confusion.columns),
    ]
    for idx, row in ag.confusion.iterrows():
        lines.append(f"| {idx} | " + " | ".join(str(int(v)) for v in row) + " |")
    if ag.n_judge_unparseable:
        lines += [
            "",
            "Human labels of the claims the judge left unparseable: "
            + ", ".join(f"{k}: {v}" for k, v in sorted(ag.unparseable_by_human.items())),
        ]
    lines += [
        "",
        "κ = (p_o − p_e) / (1 − p_e) over claims with a human label and a parseable judge verdict, "
        "p_o and p_e from counts weighted by 1 / inclusion probability when the file has them; "
        "CI: percentile bootstrap over those claims with their weights (seeded). Blank rows are assumed "
        "missing at random.",
    ]
    return "\n".join(lines) + "\n"


def spotcheck_metrics(ag: Agreement) -> dict[str, float]:
    """The ``spotcheck/*`` metrics of an agreement (NaN ones are left out when logged)."""
    vals = {
        "spotcheck/n": ag.n,
        "spotcheck/n_blank": ag.n_blank,
        "spotcheck/n_judge_unparseable": ag.n_judge_unparseable,
        "spotcheck/agreement": ag.agreement,
        "spotcheck/kappa": ag.kappa,
        "spotcheck/kappa_ci_low": ag.kappa_ci[0],
        "spotcheck/kappa_ci_high": ag.kappa_ci[1],
        "spotcheck/leniency": ag.leniency,
        "spotcheck/strictness": ag.strictness,
        "spotcheck/weighted": float(ag.weighted),  # 1: figures estimate the run's claims
        **{f"spotcheck/sample_{k}": v for k, v in ag.sample.items()},
    }
    for name, est in (("ppi_faithfulness", ag.ppi), ("judge_faithfulness", ag.judge_only)):
        if est is not None:
            vals |= {f"spotcheck/{name}": est.value, f"spotcheck/{name}_ci_low": est.ci_low}
            vals[f"spotcheck/{name}_ci_high"] = est.ci_high
    for hl in HUMAN_LABELS:
        for jl in HUMAN_LABELS:
            vals[f"spotcheck/confusion/human_{hl}/judge_{jl}"] = int(
                ag.confusion.at[f"human {hl}", f"judge {jl}"]
            )
    return {k: float(v) for k, v in vals.items()}


def log_spotcheck(uri: str, run: RunData, ag: Agreement, labels_path: Path, summary: str) -> None:
    """The metrics, ``spotcheck/labels.csv`` and ``spotcheck/summary.md`` on the run."""
    annotate.log_metrics(uri, run.run_id, spotcheck_metrics(ag))
    with tempfile.TemporaryDirectory() as tmp:  # stored under a fixed name, whatever the file was called
        copy = Path(tmp) / "labels.csv"
        shutil.copyfile(labels_path, copy)
        annotate.log_files(uri, run.run_id, [copy], "spotcheck")
    annotate.log_text(uri, run.run_id, summary, "spotcheck/summary.md")
