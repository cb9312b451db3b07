"""A reproducible research report for a sweep or a run.

    python -m rag_experiments.report RUN_OR_SWEEP [--out DIR] [--baseline RUN] [--no-log]

RUN_OR_SWEEP is a ``sweep_id``, a sweep's parent run (id or name) or a single run (id or name).
Writes ``report.md``, a self-contained ``report.html`` (plots embedded as data URIs, inline CSS, no
external request) and the PNG plots into DIR (default ``reports/<sweep_id or run>``), and logs them
under ``report/`` on the sweep's parent run (the run itself for a single run) unless ``--no-log``.

Sections, in order: the question (factors and levels), results per config (every headline metric
with its 95 % CI), one-factor-at-a-time attribution, plots, worst queries, metric definitions,
reproducibility. Generation parts appear only when the runs have generation metrics.
A --metric not comparable across the configs (hit@k when the chunks differ, a judge metric across
judges: docs/metrics.md, "Comparability") is refused, naming the metric to use, unless
--allow-incomparable; the attribution tests only comparable metrics and names the ones left out.
Exit codes: 0 ok, 2 bad input (unknown run or sweep, missing per-query table, an incomparable
--metric).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from rag_experiments.report.answer_matrix import answer_matrix, render_answer_matrix
from rag_experiments.report.load import load_input, resolve_target
from rag_experiments.report.render import ReportFiles, write_report
from rag_experiments.report.sections import build_report
from rag_experiments.tracking import annotate
from rag_experiments.tracking.errors import cli_main
from rag_experiments.tracking.run_reader import MlflowRunReader
from rag_experiments.tracking.runs import RunInputError, tracking_uri
from rag_experiments.tracking.trace_links import trace_ids_by_item, trace_url


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rag_experiments.report",
        description="Markdown + self-contained HTML report (plots, attribution, metric definitions, "
        "reproducibility) for a sweep or a run, logged to the sweep's parent run. "
        "Exit 0 ok, 2 bad input.",
    )
    p.add_argument("target", metavar="RUN_OR_SWEEP", help="sweep_id, parent run id/name, or run id/name")
    p.add_argument("--out", type=Path, metavar="DIR", help="default: reports/<sweep_id or run>")
    p.add_argument(
        "--baseline",
        metavar="RUN",
        help="baseline for the attribution (default: the default config, else the closest to it; "
        "the rule compare --sweep uses)",
    )
    p.add_argument(
        "--metric",
        metavar="KEY",
        help="primary metric (default: the headline of the swept factors, docs/metrics.md)",
    )
    p.add_argument(
        "--allow-incomparable",
        action="store_true",
        help="a --metric not comparable across the configs (docs/metrics.md, 'Comparability'), noted",
    )
    p.add_argument("--worst", type=int, default=5, metavar="N", help="worst queries per config (default 5)")
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--experiment", metavar="NAME", help="look names up in this experiment only")
    p.add_argument("--no-log", action="store_true", help="do not log the report to MLflow")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resamples", type=int, default=4999, help="bootstrap / permutation resamples")
    return p


def safe_dirname(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", s).strip("_") or "report"


def log_report(uri: str, run_id: str, files: ReportFiles) -> None:
    annotate.log_files(uri, run_id, [files.markdown, files.html, *files.pages, *files.pngs], "report")


def answer_pages(uri: str, loaded, title: str) -> dict[str, str]:
    """``{"answers.html": …}``, the answer matrix of the generating configs (none: {}), each cell
    linked to its item's trace in the MLflow UI."""
    configs = [c for c in loaded.configs if "answer" in c.table.columns]
    if not configs:
        return {}
    traces = {
        c.run.run_id: {
            item: trace_url(uri, c.run.experiment_id, tid)
            for item, tid in trace_ids_by_item(uri, c.run.experiment_id, c.run.run_id).items()
        }
        for c in configs
    }
    k = int(float(configs[0].run.params.get("retriever.k", 5)))
    return {"answers.html": render_answer_matrix(answer_matrix(configs, loaded.factors, k, title, traces))}


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reader = MlflowRunReader(tracking_uri(args.tracking_uri))
    try:
        target = resolve_target(reader, args.target, args.experiment)
        loaded = load_input(reader, target)
        report = build_report(
            loaded,
            baseline=args.baseline,
            primary=args.metric,
            n_worst=args.worst,
            seed=args.seed,
            n_resamples=args.resamples,
            allow_incomparable=args.allow_incomparable,
        )
    except RunInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pages = answer_pages(reader.uri, loaded, target.label)
    files = write_report(report, args.out or Path("reports") / safe_dirname(target.label), pages)
    print(f"wrote {files.markdown}, {files.html} and {len(files.pngs)} plots in {files.out_dir}")
    for page in files.pages:
        print(f"answer matrix (items × configs, filters, trace links): {page}")
    print(f"baseline: {report.baseline} ({report.baseline_why})")  # the line compare --sweep prints
    print(f"primary metric: {report.primary}")
    for n in report.notes:
        print(n, file=sys.stderr)
    if not args.no_log:
        log_report(reader.uri, target.log_run_id, files)
        print(f"logged report/ on run {target.log_run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
