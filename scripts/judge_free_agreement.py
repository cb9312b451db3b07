"""How far to trust each judge-free metric (docs/metrics.md, "Judge-free generation metrics"):
per-query Spearman correlation of each judge-free metric with the judge's faithfulness and with
key-fact correctness, with a 95 % percentile bootstrap CI over queries, and the largest
disagreements to read by hand.

    python scripts/judge_free_agreement.py --tracking-uri sqlite:///mlflow.db RUN [RUN ...] \
        [--show 5] [--resamples 2000]

RUN: a run id or run name (``compare``'s resolution). Only generated, non-error rows count.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from mlflow import MlflowClient
from scipy.stats import rankdata, spearmanr

from rag_experiments.tracking.runs import load_per_query, resolve_run

FREE = (
    "answer_token_f1",
    "answer_exact_match",
    "citation_precision",
    "citation_recall",
    "answer_context_overlap",
    "answer_cited_overlap",
)
JUDGED = ("faithfulness", "correctness")


def spearman_ci(x: np.ndarray, y: np.ndarray, n_resamples: int = 2000, seed: int = 0):
    """(rho, ci_low, ci_high, n) over the pairs where both are finite; percentile bootstrap over
    pairs (resamples with a constant side are skipped). Fewer than 5 pairs: NaNs."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    n = int(ok.sum())
    if n < 5 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan"), float("nan"), float("nan"), n
    rho = float(spearmanr(x, y).statistic)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_resamples):
        i = rng.integers(0, n, n)
        a, b = x[i], y[i]
        if np.ptp(a) == 0 or np.ptp(b) == 0:
            continue
        boots.append(np.corrcoef(rankdata(a), rankdata(b))[0, 1])
    lo, hi = np.quantile(boots, [0.025, 0.975]) if boots else (np.nan, np.nan)
    return rho, float(lo), float(hi), n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--tracking-uri", required=True)
    ap.add_argument("--experiment", default=None)
    ap.add_argument("--show", type=int, default=5)
    ap.add_argument("--resamples", type=int, default=2000)
    a = ap.parse_args(argv)
    client = MlflowClient(a.tracking_uri)
    for name in a.runs:
        run = resolve_run(client, name, a.experiment)
        df = load_per_query(client, run)
        df = df[df["answer"].map(lambda v: isinstance(v, str)) & df["error"].isna()]
        print(f"\n== {run.info.run_name} ({len(df)} generated answers)")
        print(f"{'metric':<24} {'vs':<13} {'rho':>6}  95% CI            n")
        for m in FREE:
            if m not in df:
                continue
            for j in JUDGED:
                if j not in df:
                    continue
                rho, lo, hi, n = spearman_ci(df[m].to_numpy(float), df[j].to_numpy(float), a.resamples)
                print(f"{m:<24} {j:<13} {rho:6.2f}  [{lo:5.2f}, {hi:5.2f}]  {n}")
        for m, j in (("answer_token_f1", "correctness"), ("answer_context_overlap", "faithfulness")):
            if m not in df or j not in df:
                continue
            d = df[[m, j, "id", "query", "answer"]].dropna(subset=[m, j])
            d = d.assign(gap=(d[m] - d[j]).abs()).sort_values("gap", ascending=False).head(a.show)
            print(f"\n-- largest |{m} - {j}|")
            with pd.option_context("display.max_colwidth", 140, "display.width", 250):
                for r in d.itertuples():
                    print(f"{r.id}: {m}={getattr(r, m):.2f} {j}={getattr(r, j):.2f} q={r.query!r}")
                    print(f"    answer={r.answer[:220]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
