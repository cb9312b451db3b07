"""``python -m rag_experiments.spotcheck sample|score``: parse arguments, call the steps, print, exit 0 / 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from mlflow.tracking import MlflowClient

from rag_experiments.cli.errors import cli_main
from rag_experiments.spotcheck.claims import COLUMNS, judge_threshold, judged_claims, sample_claims
from rag_experiments.spotcheck.labels import LabelFileError, read_labels
from rag_experiments.spotcheck.scoring import faithfulness_estimates, score_labels, self_preference_warning
from rag_experiments.spotcheck.summary import log_spotcheck, render_summary
from rag_experiments.tracking.runs import RunInputError, load_per_query, resolve_run, run_label, tracking_uri


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rag_experiments.spotcheck",
        description="Human spot-check of the judge. Exit 0 ok, 2 bad input.",
    )
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--experiment", metavar="NAME", help="look run names up in this experiment only")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="write a CSV of judged claims with an empty human_verdict column")
    s.add_argument("run", metavar="RUN")
    s.add_argument("-n", type=int, default=20, help="claims to sample (default 20)")
    s.add_argument("--stratify", action="store_true", help="split n evenly across the judge's verdicts")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--threshold", type=float, help="judge score threshold (default: from the run's params)")
    s.add_argument("--out", type=Path, help="default: spotcheck_<run>.csv")
    c = sub.add_parser("score", help="score a filled label CSV against the judge and log the result")
    c.add_argument("run", metavar="RUN")
    c.add_argument("labels", type=Path, metavar="labels.csv")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples for the κ CI")
    c.add_argument("--no-log", action="store_true", help="do not log to the run")
    return p


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    client = MlflowClient(tracking_uri=tracking_uri(args.tracking_uri))
    try:
        run = resolve_run(client, args.run, args.experiment)
        claims = judged_claims(load_per_query(client, run))
        if claims.empty:
            raise RunInputError(f"run {run_label(run)} has no judged claims")
        warn = self_preference_warning(run)
        if args.cmd == "sample":
            if args.n < 1:
                raise RunInputError("-n must be >= 1")
            th = args.threshold if args.threshold is not None else judge_threshold(run)
            out = sample_claims(claims, args.n, stratify=args.stratify, seed=args.seed, threshold=th)
            path = args.out or Path(f"spotcheck_{run.info.run_id[:8]}.csv")
            path.parent.mkdir(parents=True, exist_ok=True)
            out.to_csv(path, index=False, columns=COLUMNS)
            counts = out["judge_verdict"].value_counts().to_dict()
            print(
                f"wrote {len(out)} claims ({', '.join(f'{k}: {v}' for k, v in sorted(counts.items()))}) to {path}"
                + (f"; borderline over-weighted around score threshold {th}" if th is not None else "")
            )
            print(
                "fill human_verdict with supported / unsupported, then: python -m rag_experiments.spotcheck "
                f"score {run.info.run_id} {path}"
            )
            if warn:
                print(warn, file=sys.stderr)
            return 0
        labels = read_labels(args.labels, claims)
        ag = score_labels(labels, seed=args.seed, n_resamples=args.resamples)
        ag.ppi, ag.judge_only = faithfulness_estimates(labels, claims)
        if warn:
            ag.warnings.append(warn)
    except LabelFileError as e:
        for line in e.problems:
            print(line, file=sys.stderr)
        return 2
    except RunInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = render_summary(run, ag, args.labels)
    print(summary)
    if warn:
        print(warn, file=sys.stderr)
    if not args.no_log:
        log_spotcheck(client, run, ag, args.labels, summary)
        print(
            f"logged spotcheck/* metrics and spotcheck/labels.csv, spotcheck/summary.md on run {run.info.run_id}"
        )
    return 0
