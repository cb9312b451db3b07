"""What a finished run prints: its metrics table (retrieval and generation side by side, never
blended, with CIs and counts), with a reranker or transform what the first stage did, and its
closing notes: how far its generation metrics are validated by human labels (the judge's claims,
``spotcheck sample``; correctness's answers, ``spotcheck sample-answers``), each with the n needed."""

from __future__ import annotations

import pandas as pd

from rag_experiments.analysis.judge_trust import answers_checked, runs_correctness_notes, runs_judge_notes
from rag_experiments.analysis.stats import first_stage_deltas
from rag_experiments.core.formatting import fmt_num
from rag_experiments.core.slots import steps
from rag_experiments.evaluation.registry import metric_keys, spec, wrap


def _fmt(v: float) -> str:
    return fmt_num(v, 3, missing="n/a", width=6)


def summary_table(agg: dict[str, float], k: int, ks: list[int]) -> str:
    """Retrieval and generation metrics side by side, never blended, with 95 % CIs and counts.

    Which keys, in which order and under which heading: ``evaluation.registry.metric_keys``."""
    titles = {"retrieval": "retrieval", "generation": "generation", "label": "failure labels"}
    keys = [key for key in metric_keys(ks, k, generation=True) if key in agg]
    lines = [f"{'metric':<31} {'mean':>6}  95% CI            n"]
    side = None
    for key in keys:
        s = spec(key)
        if s.side != side:
            side = s.side
            lines.append(f"-- {titles.get(side, side)}")
        n = agg.get(wrap(key, "n_scored"), float("nan"))
        lo, hi = agg.get(wrap(key, "ci_low")), agg.get(wrap(key, "ci_high"))
        line = f"{key:<31} {_fmt(agg[key])}  [{_fmt(lo)}, {_fmt(hi)}]  {int(n) if n == n else ''}"
        if key == "correctness" and not answers_checked(agg):  # as the judge's metrics: said beside it
            line += "  (unvalidated: no answer labels, see note)"
        lines.append(line)
    lines.append(
        f"queries {int(agg['n_queries'])} (unanswerable {int(agg.get('n_unanswerable', 0))}), "
        f"errors {int(agg['n_errors'])}, unparseable verdicts {int(agg['n_unparseable_verdicts'])}"
        + (f", judge transport errors {int(agg['n_judge_errors'])}" if agg.get("n_judge_errors") else "")
        + "".join(  # the other steps that count their failures (query transform, reranker)
            f", {s.step} errors {int(agg[s.errors])}" for s in steps()
            if s.errors and s.errors not in ("n_errors", "n_judge_errors") and s.errors in agg
        )
    )
    return "\n".join(lines)


def first_stage_lines(per_query: pd.DataFrame, agg: dict[str, float], k: int, ks: list[int]) -> list[str]:
    """What the reranker added, one line per headline retrieval metric: the first stage's mean →
    the final list's, with the paired difference (``analysis.stats.first_stage_deltas``: bootstrap
    CI; exact McNemar on 0/1 metrics, else sign-flip p; Holm over the metrics shown)."""
    keys = [key for key in metric_keys(ks, k, generation=False) if spec(key).side == "retrieval"]
    out = []
    for r in first_stage_deltas(per_query, keys, n_resamples=2000):
        out.append(
            f"first stage → final  {r.metric:<28} {_fmt(r.mean_a)} → {_fmt(r.mean_b)}  "
            f"{r.delta:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}], p={r.p_value:.3g} ({r.test}), "
            f"p_holm={r.p_holm:.3g} (Holm over {len(keys)}), n={r.n_pairs}"
        )
    return out


def closing_notes(agg: dict[str, float], tags: dict[str, str], run_id: str) -> list[str]:
    """A generating run's closing notes: the judge's (``analysis.judge_trust.runs_judge_notes``:
    the claims to label, ``spotcheck sample``) and correctness's (``runs_correctness_notes``: the
    answers to label, ``spotcheck sample-answers``), each naming the n needed."""
    runs = [(agg, tags)]
    return runs_judge_notes(runs, run_id) + runs_correctness_notes(runs, run_id)
