"""``python -m rag_experiments.plan --pilot RUN``: how large an effect the eval set can detect.

Per headline metric of the pilot run (and each generation metric it has): the minimum detectable
paired effect (MDE) at the pilot's eval-set size n and replicates R, and the queries (at R) or
replicates (at n) needed to detect ``--effect``. Formulas: ``analysis.power`` (docs/metrics.md,
"Replicates, noise and power"). Exit codes: 0 ok, 2 bad input.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
from collections.abc import Sequence

from rag_experiments.analysis.power import (
    WIDE_DEFAULT_MARGIN,
    mde,
    n_for_effect,
    n_for_margin,
    paired_variance,
    replicates_for_effect,
)
from rag_experiments.analysis.variance import pilot_components
from rag_experiments.cli.compare import text_table
from rag_experiments.evalset.load import evalset_digest
from rag_experiments.evaluation.headline import headline_metrics
from rag_experiments.evaluation.intervals import NO_VARIANCE, not_plannable
from rag_experiments.evaluation.registry import GENERATION_METRICS
from rag_experiments.run.pilot import MIN_SCORED
from rag_experiments.tracking.errors import cli_main
from rag_experiments.tracking.run_reader import MlflowRunReader
from rag_experiments.tracking.runs import RunInputError, tracking_uri

log = logging.getLogger(__name__)

HELP = """\
MDE = (z_{1-alpha/2} + z_power) * sqrt(s2_between/n + s2_within/(n*R)): the smallest true mean
difference between two configs that a two-sided paired test at level alpha detects with the given
power on n queries with R replicates each (normal approximation). From one pilot run:
s2_between = 2(1-rho) * s2_query (rho: correlation of per-query scores between the two configs;
default 0.5, i.e. the pilot's own between-query variance) and s2_within = 2 * s2_generation (each
config's replicate noise; 0 for retrieval metrics and for an unreplicated pilot, where it is not
separable from s2_query). Needed n = (z sum)^2 (s2_between + s2_within/R) / effect^2; needed R at n =
s2_within / (n effect^2 / (z sum)^2 - s2_between), impossible when s2_between alone is too large.
n to select: the queries at which select/gate show a config non-inferior within --margin among
--configs K configs, n = (z_{1-alpha/(K-1)} + z_power)^2 (s2_between + s2_within/R) / margin^2
(one-sided, Holm over the K-1 comparisons with the best at its first step), and without --margin at
least 1/0.15^2 = 45 (gate's default margin 1/sqrt(n) reaches 0.15 there): the figure select's
UNDERPOWERED line prints (analysis.power.n_for_margin). A metric with no variance in the pilot
(every query scored the same) is not plannable: its variance is no estimate.
Exit codes: 0 ok, 2 bad input (unknown run, < 10 scored queries, pilot of another eval set)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rag_experiments.plan",
        description="Power planning from a pilot run: minimum detectable effects and sample sizes.",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--pilot", required=True, metavar="RUN", help="run id or run name of the pilot run")
    p.add_argument("--effect", type=float, default=0.03, help="target paired effect (default 0.03)")
    p.add_argument("--alpha", type=float, default=0.05, help="two-sided level (default 0.05)")
    p.add_argument("--power", type=float, default=0.8, help="power (default 0.8)")
    p.add_argument(
        "--rho", type=float, default=0.5, help="per-query correlation of two configs (default 0.5)"
    )
    p.add_argument("--metric", action="append", metavar="KEY", help="metric to plan (repeatable)")
    p.add_argument(
        "--margin",
        type=float,
        help=f"non-inferiority margin of select/gate (default: gate's default margin at ±{WIDE_DEFAULT_MARGIN:g})",
    )
    p.add_argument(
        "--configs",
        type=int,
        default=2,
        metavar="K",
        help="configs select compares (Holm over K-1; default 2)",
    )
    p.add_argument(
        "--evalset", metavar="PATH|DIGEST", help="refuse a pilot run of another eval set (file or digest)"
    )
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--experiment", metavar="NAME", help="look run names up in this experiment only")
    return p


def file_digest(path: str) -> str:
    """``evalset.evalset_digest`` of an eval-set file's items, without a corpus: the digest runs
    carry in their ``evalset_digest`` tag (``evalset.limit`` not applied)."""
    import json
    from pathlib import Path

    text = Path(path).read_text(encoding="utf-8-sig")
    return evalset_digest([json.loads(line) for line in text.splitlines() if line.strip()])


def expected_digest(evalset: str) -> str:
    """The digest of ``--evalset``: a sha256 hex digest as given, or the digest of the file."""

    if re.fullmatch(r"[0-9a-f]{64}", evalset):
        return evalset
    try:
        return file_digest(evalset)
    except (OSError, ValueError) as e:
        raise RunInputError(f"--evalset {evalset}: cannot read the eval set ({e})") from None


def check_pilot_evalset(pilot_digest: str | None, expected: str, pilot_label: str) -> None:
    """RunInputError naming both digests when the pilot ran on another eval set."""

    if pilot_digest != expected:
        raise RunInputError(
            f"pilot run {pilot_label} was evaluated on another eval set: evalset_digest "
            f"{pilot_digest or '(none)'} vs {expected} (the eval set planned for)"
        )


def planned_metrics(df, k: int, asked: Sequence[str] | None) -> list[str]:
    """``--metric`` or the headline metrics (``evaluation.headline``) plus the generation metrics."""

    if asked:
        missing = [m for m in asked if m not in df.columns]
        if missing:
            raise RunInputError(f"metric(s) {', '.join(missing)} not in the pilot's per-query table")
        return list(asked)
    return headline_metrics([], list(df.columns), k=k) + [m for m in GENERATION_METRICS if m in df.columns]


def plan_rows(
    df,
    metrics: Sequence[str],
    effect: float,
    alpha: float,
    power: float,
    rho: float,
    margin: float | None = None,
    configs: int = 2,
):
    """One dict per metric: n, R, σ_query, σ_generation, MDE, queries / replicates for ``effect``,
    queries for select to show non-inferiority within ``margin`` among ``configs`` configs
    (``n_select``: ``analysis.power.n_for_margin``; ``margin`` None: gate's default margin at
    ±0.15). ``no_variance``: every scored query has one value (not plannable)."""

    rows = []
    for m in metrics:
        n, r, vq, vg = pilot_components(df, m)
        pv = paired_variance(vq, vg, rho)
        row = {"metric": m, "n": n, "R": r, "sd_query": math.sqrt(vq) if vq == vq else math.nan}
        row["sd_generation"] = math.sqrt(vg) if vg == vg else math.nan
        row["no_variance"] = not_plannable(vq, vg) is not None  # evaluation.intervals
        if n < MIN_SCORED or row["no_variance"]:
            rows.append({**row, "mde": math.nan, "n_needed": None, "r_needed": None, "n_select": None})
            continue
        row["mde"] = mde(pv.between, n, pv.within, r, alpha, power)
        row["n_needed"] = n_for_effect(effect, pv.between, pv.within, r, alpha, power)
        row["r_needed"] = replicates_for_effect(effect, n, pv.between, pv.within, alpha, power)
        row["r_measured"] = vg == vg
        var_d = pv.between + (pv.within / max(1, r) if pv.within == pv.within else 0.0)
        row["n_select"] = n_for_margin(
            margin or WIDE_DEFAULT_MARGIN,
            var_d,
            alpha,
            max(1, configs - 1),
            power,
            default_rule=margin is None,
        )
        rows.append(row)
    return rows


def _fmt(x: float | None, d: int = 4) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def render(
    rows, effect: float, alpha: float, power: float, rho: float, margin: float | None = None, configs: int = 2
) -> str:
    sel = f"n to select (±{margin or WIDE_DEFAULT_MARGIN:g}, Holm over {max(1, configs - 1)})"
    headers = ["metric", "n", "R", "sd query", "sd gen", "MDE", f"n for {effect:g}", f"R for {effect:g}", sel]
    body = []
    for r in rows:
        if r["n"] < MIN_SCORED:
            body.append(
                [r["metric"], str(r["n"]), str(r["R"]), "", "", f"n < {MIN_SCORED}: not planned", "", "", ""]
            )
            continue
        if r["no_variance"]:
            body.append(
                [r["metric"], str(r["n"]), str(r["R"]), _fmt(r["sd_query"]), _fmt(r["sd_generation"]),
                 NO_VARIANCE, "", "", ""]
            )  # fmt: skip
            continue
        if r["r_needed"] is None:
            r_need = f"– (needs n >= {r['n_needed']})"
        elif not r["r_measured"]:
            r_need = "? (pilot R=1)"
        else:
            r_need = str(r["r_needed"])
        body.append(
            [r["metric"], str(r["n"]), str(r["R"]), _fmt(r["sd_query"]), _fmt(r["sd_generation"]),
             _fmt(r["mde"]), str(r["n_needed"]), r_need, str(r["n_select"])]
        )  # fmt: skip
    head = (
        f"two-sided alpha={alpha:g}, power={power:g}, rho={rho:g} (per-query correlation of the two "
        "configs); MDE at the pilot's n and R; n to select: one-sided, Holm's alpha/(K-1), "
        + ("gate's default margin at ±0.15 (n >= 45)" if margin is None else f"--margin {margin:g}")
    )
    out = head + "\n" + text_table(headers, body)
    flat = [r["metric"] for r in rows if r.get("no_variance")]
    if flat:
        out += (
            f"\n{NO_VARIANCE} for {', '.join(flat)} (every scored query has the same "
            "value, e.g. all 0): a pilot that varies, or more queries, is needed before any n means anything"
        )
    return out


def run_plan(args, reader=None) -> str:
    """The plan's text; ``reader`` (a ``tracking.run_reader.RunReader``) defaults to the MLflow
    store of ``--tracking-uri``."""
    for name, v in (("--alpha", args.alpha), ("--power", args.power)):
        if not 0 < v < 1:
            raise RunInputError(f"{name} {v}: must be in (0, 1)")
    if not args.effect > 0:
        raise RunInputError(f"--effect {args.effect}: must be > 0")
    if not -1 <= args.rho <= 1:
        raise RunInputError(f"--rho {args.rho}: must be in [-1, 1]")
    reader = reader or MlflowRunReader(tracking_uri(args.tracking_uri))
    run = reader.resolve(args.pilot, args.experiment)
    if args.evalset:
        check_pilot_evalset(run.tags.get("evalset_digest"), expected_digest(args.evalset), run.label)
    df = reader.per_query(run, long=True)
    k = int(run.params.get("retriever.k", 5))
    margin, configs = getattr(args, "margin", None), getattr(args, "configs", 2)
    if margin is not None and not 0 < margin < 1:
        raise RunInputError(f"--margin {margin}: must be in (0, 1)")
    if configs < 2:
        raise RunInputError(f"--configs {configs}: select compares at least 2 configs")
    metrics = planned_metrics(df, k, args.metric)
    rows = plan_rows(df, metrics, args.effect, args.alpha, args.power, args.rho, margin, configs)
    best = max((r["n"] for r in rows), default=0)
    if best < MIN_SCORED:
        raise RunInputError(
            f"pilot run {run.label} has {best} scored queries (< {MIN_SCORED}): too few to estimate "
            "a per-query SD; run a pilot on more queries"
        )
    out = f"pilot {run.label}\n" + render(
        rows, args.effect, args.alpha, args.power, args.rho, margin, configs
    )
    if not any(r.get("r_measured") for r in rows):
        out += "\nnote: the pilot has one replicate: generation noise is inside sd query (replicates=R to split it)"
    return out


@cli_main  # bad input and infrastructure errors: a message and exit 2 (tracking/errors.py)
def main(argv: Sequence[str] | None = None) -> int:
    print(run_plan(build_parser().parse_args(argv)))
    return 0
