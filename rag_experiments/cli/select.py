"""Choose the cheapest config of a sweep shown non-inferior to the best (docs/select.md).

    python -m rag_experiments.select SWEEP_ID [--metric KEY] [--max-latency-ms X]
        [--max-cost-usd Y] [--margin M] [--out DIR]

``--metric`` defaults to the swept factors' primary metric that is comparable across the configs
(``analysis.comparability.default_metric``: ``evidence_recall_at_{B}tok`` when the chunking varies).
A metric that is not comparable across the configs (hit@k when the chunks differ, a judge metric
across judges: docs/metrics.md, "Comparability") is refused, exit 2, naming the metric to use;
``--allow-incomparable`` picks on it anyway and says so first.

A config ties with the best only when ``gate``'s non-inferiority test (same margin, Holm over the
configs) shows it no worse, so ``gate --baseline BEST --candidate CHOSEN`` passes. When the eval
set cannot separate the configs the output says so first (``UNDERPOWERED: ...``) and the best
mean is chosen; the verdict is also set as the ``select.underpowered`` tag of the sweep's parent
run. Prints one row per config (mean [CI], delta vs the best, the two-sided Holm p, gate's bound,
the non-inferiority Holm p, tie?, constraints ok?, cost) and, with ``--out``, writes the chosen
run's resolved config as ``DIR/NAME.yaml`` that
``python -m rag_experiments.sweep --config-dir DIR --config-name NAME`` runs unchanged.
Exit 0 a config was chosen, 1 none passes the constraints, 2 bad input (an incomparable metric
without --allow-incomparable, configs scored by different judges without --allow-judge-change:
docs/judges.md).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path

from rag_experiments.analysis.comparability import default_metric_choice, human_lines, label_evidence_notes
from rag_experiments.analysis.judge_trust import generation_marker, is_generation_metric, ppi_contradiction
from rag_experiments.analysis.racing import STOPPED_HEADERS, STOPPED_NOTE, split_stopped, stopped_rows
from rag_experiments.analysis.select import Constraints, runnable_config
from rag_experiments.analysis.verdict import Caveat, SelectVerdict, pick_verdict, with_caveats
from rag_experiments.core.run_record import RunData
from rag_experiments.evaluation.registry import higher_is_better
from rag_experiments.report.tables import fmt_num, fmt_p, text_table
from rag_experiments.tracking import annotate
from rag_experiments.tracking.errors import cli_main
from rag_experiments.tracking.judge_runs import (
    ALLOW_FLAG,
    ALLOW_INCOMPARABLE,
    check_comparable,
    check_same_judge,
)
from rag_experiments.tracking.run_reader import MlflowRunReader, RunReader
from rag_experiments.tracking.runs import RunInputError, tracking_uri


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rag_experiments.select", description=__doc__.split("\n")[0])
    p.add_argument("sweep", metavar="SWEEP_ID", help="the sweep_id tag of the sweep's runs")
    p.add_argument(
        "--metric",
        help="a registered per-query metric, e.g. evidence_recall_at_512tok (default: the swept factors' "
        "primary metric comparable across the configs)",
    )
    p.add_argument(
        "--max-latency-ms", type=float, help="limit on the serving latency p95 (retrieval + generation)"
    )
    p.add_argument("--max-cost-usd", type=float, help="limit on the run's cost_usd")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level after Holm (default 0.05)")
    p.add_argument(
        "--margin",
        type=float,
        help="non-inferiority margin, as gate's --margin (default gate's max(0.01, 1/sqrt(n)))",
    )
    p.add_argument("--resamples", type=int, default=9999, help="bootstrap resamples (gate's default 9999)")
    p.add_argument("--out", metavar="DIR", help="write the chosen config as DIR/<config_hash>.yaml")
    p.add_argument("--name", help="config name (file stem) for --out; default selected_<config_hash>")
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--experiment", metavar="NAME", help="look the sweep up in this experiment only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(ALLOW_FLAG, action="store_true", help="select among configs scored by different judges")
    p.add_argument(
        ALLOW_INCOMPARABLE,
        action="store_true",
        help="pick on a metric that is not comparable across the configs (said first in the output)",
    )
    return p


def _direction(metric: str) -> bool:
    try:
        hib = higher_is_better(metric)
    except KeyError as e:
        raise RunInputError(str(e).strip('"')) from None
    if hib is None:
        raise RunInputError(
            f"metric {metric!r} has no better side (a descriptive count): cannot select on it"
        )
    return hib


def render(v: SelectVerdict) -> str:
    """The verdict: the metric's choice, the caveats in the verdict's order (UNDERPOWERED first
    after a forced comparison), the pick at every budget, the rule, the tie set, the table, notes."""
    sel = v.selection
    family = max(0, len(sel.table) - 1)
    headers = [
        "config",
        "mean [95% CI]",
        "delta vs best",
        f"p_holm (Holm over {family})",
        "gate bound",
        f"NI p_holm (Holm over {family})",
        "tie?",
        "constraints ok?",
        "cost_usd",
        "chosen",
    ]
    rows = []
    for r in sel.table.itertuples():
        ci = f"{fmt_num(r.mean)} [{fmt_num(r.ci_low)}, {fmt_num(r.ci_high)}]"
        best = r.run_id == sel.best
        rows.append(
            [
                r.config + (" (best)" if best else ""),
                ci,
                "–" if best else fmt_num(r.delta, signed=True),
                "–" if best else fmt_p(r.p_holm) + (" worse" if r.worse else ""),
                "–" if best else fmt_num(r.ni_bound, signed=True),
                "–" if best else fmt_p(r.ni_p_holm),
                "yes" if r.tie else "no",
                "yes" if r.ok else f"no (p95 {fmt_num(r.latency_p95_ms, 1)} ms)",
                fmt_num(r.cost_usd, 6),
                "*" if r.chosen else "",
            ]
        )
    better = "higher" if sel.higher_is_better else "lower"
    side = "lower" if sel.higher_is_better else "upper"
    tests = "; ".join(f"{t.label} ({t.why})" for t in v.tests) or "none (one config)"
    lines = [*sel.lead, *v.caveat_lines()]
    if v.budget_text and not v.budget_text.startswith("budget-sensitive"):
        lines.append(v.budget_text)
    lines += [
        f"metric {sel.metric} ({better} is better); tie = shown non-inferior to the best: gate's one-sided "
        f"{100 * (1 - sel.alpha):g}% {side} bound of config − best within the margin "
        f"{fmt_num(sel.margin)} (Holm over the configs: NI p_holm <= {sel.alpha:g}); test: {tests}. "
        f"p_holm: two-sided paired test (exact McNemar for binary metrics, sign-flip otherwise, Holm), "
        "'worse' when significant",
        f"ties: {v.tie.text()}",
        f"noise (reported, not deciding): {sel.noise}",
        f"choice among tied configs within the constraints: {sel.tie_break}",
        text_table(headers, rows),
        *sel.notes,
    ]
    return "\n".join(lines)


def log_tags(uri: str, children: Sequence[RunData], v: SelectVerdict) -> str | None:
    """Set the verdict's tags (``select.underpowered`` …) on the sweep's parent run, for the report;
    a note when the sweep has no parent run or the store refuses."""
    parents = {r.parent_id for r in children} - {None}
    if len(parents) != 1:
        return "note: no single sweep parent run: select.underpowered not logged"
    (parent,) = parents
    try:
        annotate.set_tags(uri, parent, v.tags())
    except annotate.AnnotateError as e:
        return f"note: could not tag the sweep's parent run: {e}"
    return None


def run_select(reader: RunReader, args: argparse.Namespace) -> tuple[SelectVerdict, dict[str, RunData]]:
    """The verdict over the sweep's configs (``analysis.select.select_config`` into
    ``analysis.verdict.select_verdict``) and the configs by run id."""
    children = reader.sweep_children(args.sweep, args.experiment)
    if not children:
        raise RunInputError(f"unknown sweep {args.sweep!r}: no finished child run has that sweep_id")
    judge_note = check_same_judge(children, args.allow_judge_change)
    runs, stopped = split_stopped([reader.with_table(r) for r in children])  # racing: docs/racing.md
    if not runs:
        raise RunInputError(f"every config of sweep {args.sweep!r} was stopped by racing: nothing covers the eval set")
    available = sorted(set().union(*(r.table.columns for r in runs)))
    lead, why = [], "given with --metric"
    if args.metric is None:
        args.metric, why = default_metric_choice(runs, available)
        lead.append(f"metric {args.metric}: {why}")
    hib = _direction(args.metric)
    overrides = check_comparable([args.metric], runs, getattr(args, "allow_incomparable", False), available)
    human = human_lines(args.metric, runs)  # labels lead; else UNVALIDATED (judge metrics)
    missing = [r.name for r in runs if args.metric not in r.table.columns]
    if missing:
        raise RunInputError(
            f"metric {args.metric!r} is not in the per-query table of run(s) {', '.join(missing)}"
        )
    all_runs = reader.sweep_finished_runs(args.sweep, args.experiment)
    replicates = [reader.with_table(r) for r in all_runs] if len(all_runs) > len(children) else []
    by_id = {r.run_id: r for r in children}
    costs = [float(by_id[r.run_id].metrics.get("cost_usd", math.nan)) for r in runs]

    try:
        verdict = pick_verdict(
            runs, args.metric, why, _direction, costs, Constraints(args.max_latency_ms, args.max_cost_usd),
            alpha=args.alpha, seed=args.seed, margin=args.margin, n_resamples=args.resamples,
            replicates=replicates, notes=overrides, human=human,
        )  # fmt: skip
    except ValueError as e:  # e.g. no config has a value of the metric
        raise RunInputError(str(e)) from None
    sel = verdict.selection
    sel.lead = lead
    if judge_note:
        sel.notes.append(judge_note)
    if sel.underpowered and sel.chosen is None:
        sel.notes.append("underpowered and the best config fails the constraints: no config within them is shown non-inferior")
    if is_generation_metric(args.metric) and (m := generation_marker([(r.metrics, r.tags) for r in children])):
        sel.notes.append(f"warning: {m}")  # human κ < 0.4 (analysis.judge_trust)
    if sel.chosen and (c := ppi_contradiction(args.metric, by_id[sel.chosen].label, [(r.label, r.metrics) for r in runs], hib)):
        verdict = with_caveats(
            verdict, [Caveat("human", c)]
        )  # human labels disagree with the judge-based pick
    if args.metric.startswith("rate_"):  # judge=none runs: labels from correctness only
        sel.notes += label_evidence_notes(runs)
    if stopped:
        sel.notes += [
            f"stopped by racing ({len(stopped)}): not candidates for best, tie set or choice",
            text_table(STOPPED_HEADERS, stopped_rows(stopped, args.metric)),
            STOPPED_NOTE,
        ]
    return verdict, by_id


_CONFIG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


def _check_name(name: str | None) -> None:
    """``--name`` is a file stem inside ``--out`` (and a Hydra config name), never a path."""
    if name is not None and (not _CONFIG_NAME.fullmatch(name) or ".." in name):
        raise RunInputError(
            f"--name {name!r}: must be a plain config name (letters, digits, '_', '-', '.'; "
            "no '/' or '..'): the file is written inside --out"
        )


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reader = MlflowRunReader(tracking_uri(args.tracking_uri))
    try:
        _check_name(args.name)
        verdict, by_id = run_select(reader, args)
        sel = verdict.selection
        tag_note = log_tags(reader.uri, list(by_id.values()), verdict)
        if tag_note:
            sel.notes.append(tag_note)
        print(render(verdict))
        if sel.chosen is None:
            return 1
        run = by_id[sel.chosen]
        print(
            f"chosen: {run.run_name} (run {run.run_id}, config_hash {run.tags.get('config_hash')})"
        )
        if args.out:
            primary = files("rag_experiments").joinpath("conf/config.yaml").read_text(encoding="utf-8")
            text = runnable_config(reader.text(run, "config.yaml"), primary)
            name = args.name or f"selected_{run.tags.get('config_hash', run.run_id)}"
            out = Path(args.out) / f"{name}.yaml"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
            print(
                f"wrote {out}; run it with: python -m rag_experiments.sweep --config-dir {out.parent} --config-name {name}"
            )
    except RunInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
