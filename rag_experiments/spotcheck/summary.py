"""The spot-check's Markdown summary and its ``spotcheck/*`` metrics and artifacts on the run."""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path

from mlflow.entities import Metric, Run
from mlflow.tracking import MlflowClient

from rag_experiments.core.formatting import fmt_num
from rag_experiments.spotcheck.labels import HUMAN_LABELS
from rag_experiments.spotcheck.scoring import Agreement
from rag_experiments.tracking.runs import run_label


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


def render_summary(run: Run, ag: Agreement, labels_path: Path, source: str | None = None) -> str:
    """``source``: where the labels came from when not the file itself (a review queue)."""
    lo, hi = ag.kappa_ci
    lines = [
        f"# Judge spot-check: {run_label(run)}",
        "",
        f"Labels: {source or f'`{labels_path.name}`'}; judge `{run.data.tags.get('judge_model', '?')}` "
        f"({run.data.params.get('judge', '?')}), generator `{run.data.tags.get('generator_model', '?')}`.",
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
        f"| Cohen's κ (95 % bootstrap CI) | {_f(ag.kappa)} [{_f(lo)}, {_f(hi)}] | {_f(sa['kappa'])} |",
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


def log_spotcheck(client: MlflowClient, run: Run, ag: Agreement, labels_path: Path, summary: str) -> None:
    rid = run.info.run_id
    now = int(time.time() * 1000)
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
    metrics = [Metric(k, float(v), now, 0) for k, v in vals.items() if not math.isnan(float(v))]
    client.log_batch(rid, metrics=metrics)
    with tempfile.TemporaryDirectory() as tmp:  # stored under a fixed name, whatever the file was called
        copy = Path(tmp) / "labels.csv"
        shutil.copyfile(labels_path, copy)
        client.log_artifact(rid, str(copy), artifact_path="spotcheck")
    client.log_text(rid, summary, "spotcheck/summary.md")
