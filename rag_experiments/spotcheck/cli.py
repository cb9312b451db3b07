"""``python -m rag_experiments.spotcheck sample|score|sample-answers|score-answers``: parse arguments,
call the steps, print, exit 0 / 2."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from rag_experiments.spotcheck.answers import (
    ANSWER_COLUMNS,
    ANSWER_LABELS,
    answer_card,
    card_metrics,
    generated_answers,
    paired_views,
    read_answer_labels,
    render_card,
    sample_answers,
)
from rag_experiments.spotcheck.claims import (
    BLIND_COLUMNS,
    COLUMNS,
    judge_threshold,
    judged_claims,
    sample_claims,
    with_judge_columns,
)
from rag_experiments.spotcheck.labels import LabelFileError, read_labels
from rag_experiments.spotcheck.review import (
    SCHEMA,
    manifest_path,
    missing_items,
    publish,
    queue_labels,
    read_queue,
    review_url,
)
from rag_experiments.spotcheck.scoring import faithfulness_estimates, score_labels, self_preference_warning
from rag_experiments.spotcheck.summary import log_spotcheck, render_summary
from rag_experiments.tracking import annotate
from rag_experiments.tracking.errors import cli_main
from rag_experiments.tracking.run_reader import MlflowRunReader, RunReader
from rag_experiments.tracking.runs import RunInputError, tracking_uri


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
    s.add_argument(
        "--to-mlflow", action="store_true", help="also put the sample in a review queue (MLflow's Review tab)"
    )
    s.add_argument(
        "--queue", metavar="NAME", help="the review queue's name (default: spotcheck <run> <digest>)"
    )
    s.add_argument(
        "--show-judge",
        action="store_true",
        help="put the judge's verdict, score and rationale in the CSV and the queue (default: blind, "
        "so the judge does not anchor the labeller; score restores them from the run)",
    )
    c = sub.add_parser("score", help="score a filled label CSV (or a review queue) against the judge and log")
    c.add_argument(
        "run", metavar="RUN", nargs="?", help="with --from-mlflow: optional, the queue names its run"
    )
    c.add_argument("labels", type=Path, metavar="labels.csv", nargs="?")
    c.add_argument(
        "--from-mlflow", metavar="QUEUE", help="read HUMAN labels from this review queue (name or id)"
    )
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples for the κ CI")
    c.add_argument("--no-log", action="store_true", help="do not log to the run")
    sa = sub.add_parser(
        "sample-answers", help="write a blind CSV of generated answers with an empty human_answer column"
    )
    sa.add_argument("run", metavar="RUN")
    sa.add_argument("-n", type=int, default=30, help="answers to sample (default 30)")
    sa.add_argument("--seed", type=int, default=0)
    sa.add_argument("--out", type=Path, help="default: answers_<run>.csv")
    ca = sub.add_parser(
        "score-answers",
        help="the correctness card: key-fact correctness and the judge vs human answer labels",
    )
    ca.add_argument("run", metavar="RUN")
    ca.add_argument("labels", type=Path, metavar="labels.csv")
    ca.add_argument("--seed", type=int, default=0)
    ca.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples for the κ CI")
    ca.add_argument("--no-log", action="store_true", help="do not log to the run")
    return p


def _answers(uri: str, args: argparse.Namespace, run, table) -> int:
    """``sample-answers`` and ``score-answers`` (spotcheck/answers.py)."""
    answers = generated_answers(table)
    if answers.empty:
        raise RunInputError(f"run {run.label} has no generated answers")
    if args.cmd == "sample-answers":
        if args.n < 1:
            raise RunInputError("-n must be >= 1")
        out = sample_answers(answers, args.n, args.seed)
        path = args.out or Path(f"answers_{run.run_id[:8]}.csv")
        path.parent.mkdir(parents=True, exist_ok=True)
        out.to_csv(path, index=False, columns=ANSWER_COLUMNS)
        print(
            f"wrote {len(out)} of {len(answers)} answers to {path} (blind: no metric, decline flag or label in it)"
        )
        print(
            f"fill human_answer with {' / '.join(ANSWER_LABELS)}, then: python -m rag_experiments.spotcheck "
            f"score-answers {run.run_id} {path}"
        )
        return 0
    labels, n_blank = read_answer_labels(args.labels, answers)
    rows = answer_card(run, answers, labels, seed=args.seed, n_resamples=args.resamples)
    pair = paired_views(run, answers, labels, seed=args.seed, n_resamples=args.resamples)
    card = render_card(run, rows, len(labels), n_blank, f"`{args.labels.name}`", pair)
    print(card)
    if not args.no_log:
        annotate.log_metrics(uri, run.run_id, card_metrics(rows, len(labels), pair))
        annotate.log_text(uri, run.run_id, card, "spotcheck/correctness_card.md")
        annotate.log_files(uri, run.run_id, [args.labels], "spotcheck/answers")
        print(f"logged spotcheck/answers/* metrics and spotcheck/correctness_card.md on run {run.run_id}")
    return 0


def _sample(uri: str, args: argparse.Namespace, run, claims, warn: str | None) -> int:
    if args.n < 1:
        raise RunInputError("-n must be >= 1")
    th = args.threshold if args.threshold is not None else judge_threshold(run)
    out = sample_claims(claims, args.n, stratify=args.stratify, seed=args.seed, threshold=th)
    path = args.out or Path(f"spotcheck_{run.run_id[:8]}.csv")
    path.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(path, index=False, columns=COLUMNS if args.show_judge else BLIND_COLUMNS)
    counts = out["judge_verdict"].value_counts().to_dict()
    what = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) if args.show_judge else "blind"
    print(
        f"wrote {len(out)} claims ({what}) to {path}"
        + (f"; borderline over-weighted around score threshold {th}" if th is not None else "")
    )
    if not args.show_judge:
        print(
            "blind: no judge verdict, score or rationale in the file (they would anchor your label); "
            "score restores them from the run by item_id; --show-judge to include them"
        )
    print(
        "fill human_verdict with supported / unsupported, then: python -m rag_experiments.spotcheck "
        f"score {run.run_id} {path}"
    )
    if args.to_mlflow:
        design = f"n={args.n} seed={args.seed} stratify={args.stratify} threshold={th}"
        pub = publish(uri, run, out, design, args.queue, show_judge=args.show_judge)
        q = pub.queue
        print(
            f"review queue {q.name!r} ({q.queue_id}, experiment {q.experiment_id}): {len(out)} claims "
            f"({pub.n_written} new traces, {pub.n_reused} already there); label {SCHEMA!r} in MLflow's "
            f"Review tab ({review_url(uri, q)}), then: python -m "
            f"rag_experiments.spotcheck score --from-mlflow {q.queue_id}"
        )
    if warn:
        print(warn, file=sys.stderr)
    return 0


def _experiment_ids(reader: RunReader, name: str | None) -> list[str]:
    exps = reader.experiments()
    if name:
        ids = [eid for eid, n in exps.items() if n == name]
        if not ids:
            raise RunInputError(f"experiment {name!r} does not exist")
        return ids
    return list(exps)


def _resolve(reader: RunReader, uri: str, args: argparse.Namespace):
    """(run, queue labels or None): the run named on the command line, or the review queue's."""
    if args.cmd == "score" and args.from_mlflow:
        if args.labels is not None:
            raise RunInputError("give labels.csv or --from-mlflow QUEUE, not both")
        ql = read_queue(uri, args.from_mlflow, _experiment_ids(reader, args.experiment))
        run = reader.resolve(ql.run_id, None)
        if args.run and reader.resolve(args.run, args.experiment).run_id != run.run_id:
            raise RunInputError(
                f"review queue {args.from_mlflow!r} holds claims of run {ql.run_id}, not {args.run}"
            )
        try:
            manifest = reader.text(run, manifest_path(ql.queue.queue_id))
        except RunInputError:
            manifest = None
        ql.warnings += missing_items(ql, manifest)  # deleted traces: counted, never silent
        return run, ql
    if args.run is None or (args.cmd == "score" and args.labels is None):
        raise RunInputError("score needs RUN labels.csv, or --from-mlflow QUEUE")
    return reader.resolve(args.run, args.experiment), None


def restore_judge(labels_path: Path, claims, out: Path) -> Path:
    """The label file with the judge's columns restored from the run by item_id
    (``claims.with_judge_columns``), written to ``out``: what ``score`` logs as
    ``spotcheck/labels.csv``, judge and human side by side; it re-scores identically."""
    import pandas as pd

    rows = pd.read_csv(labels_path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    rows.columns = [c.strip() for c in rows.columns]
    with_judge_columns(rows, claims).to_csv(out, index=False)
    return out


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    uri = tracking_uri(args.tracking_uri)
    reader = MlflowRunReader(uri)
    tmp = tempfile.TemporaryDirectory()
    try:
        if args.cmd in ("sample-answers", "score-answers"):
            run = reader.resolve(args.run, args.experiment)
            return _answers(uri, args, run, reader.per_query(run))
        run, ql = _resolve(reader, uri, args)
        claims = judged_claims(reader.per_query(run))
        if claims.empty:
            raise RunInputError(f"run {run.label} has no judged claims")
        warn = self_preference_warning(run)
        if args.cmd == "sample":
            return _sample(uri, args, run, claims, warn)
        if ql is None:
            source = f"`{args.labels.name}`"  # the summary names the user's file, not the restored copy
            labels = read_labels(args.labels, claims)
            labels_path = restore_judge(args.labels, claims, Path(tmp.name) / "labels.csv")
        else:
            labels_path = Path(tmp.name) / "labels.csv"
            labels = queue_labels(ql, claims, labels_path)
            source = (
                f"review queue `{ql.queue.name}` ({ql.queue.queue_id}, experiment {ql.queue.experiment_id})"
            )
        ag = score_labels(labels, seed=args.seed, n_resamples=args.resamples)
        ag.ppi, ag.judge_only = faithfulness_estimates(labels, claims)
        ag.warnings += ql.warnings if ql else []
        if warn:
            ag.warnings.append(warn)
        summary = render_summary(run, ag, labels_path, source)
        print(summary)
        if warn:
            print(warn, file=sys.stderr)
        if not args.no_log:
            log_spotcheck(uri, run, ag, labels_path, summary)
            if ql is not None:  # where the labels live: re-scoring reads the queue again
                annotate.set_tags(uri, run.run_id, {"spotcheck.queue": ql.queue.queue_id})
            print(
                f"logged spotcheck/* metrics and spotcheck/labels.csv, spotcheck/summary.md on run {run.run_id}"
            )
        return 0
    except LabelFileError as e:
        for line in e.problems:
            print(line, file=sys.stderr)
        return 2
    except RunInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        tmp.cleanup()
