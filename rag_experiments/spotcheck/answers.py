"""Answer-level spot-check and the correctness card (docs/spotcheck.md, "Answer labels").

``sample-answers`` writes a blind CSV of generated answers (the question, the context the model
saw, the answer; no correctness, faithfulness, decline flag or failure label) with an empty
``human_answer`` column: ``correct`` / ``incorrect`` / ``declined``. ``score-answers`` reads it
back and builds the **correctness card**: how far each automatic answer-level view agrees with the
human labels — key-fact ``correctness`` and the judge's ``faithfulness`` — as agreement, Cohen's κ
over the three classes with a bootstrap 95 % CI, and the confusion matrix, as the judge card does
for claims.

A view's label of one answer (:func:`view_labels`): ``declined`` when the run's decline detector
says so (``declined`` column); otherwise ``correct`` when the metric reaches its failure-label
threshold (``attribution.correct`` for correctness, ``attribution.faithful`` for faithfulness,
0.5 by default), else ``incorrect``. An answer whose metric is NaN (correctness of an item with
no strong key fact; faithfulness of an answer without scorable claims) has no label in that view:
it is left out of that view's figures and counted.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from rag_experiments.analysis.correctness_view import JUDGED, STRING, paired_keys
from rag_experiments.core.run_record import RunData
from rag_experiments.evalset.csv_text import LabelFileError, _open_text, _records
from rag_experiments.evaluation.intervals import kappa_too_few
from rag_experiments.judge.agreement import cohen_kappa, kappa_ci, kappa_delta_ci

__all__ = [
    "ANSWER_COLUMNS",
    "ANSWER_LABELS",
    "VIEWS",
    "CardRow",
    "answer_card",
    "card_metrics",
    "generated_answers",
    "paired_views",
    "read_answer_labels",
    "render_card",
    "sample_answers",
    "view_labels",
]

ANSWER_LABELS = ("correct", "incorrect", "declined")
ANSWER_COLUMNS = ["answer_id", "query", "context", "answer", "inclusion_prob", "human_answer"]
#: view name → (per-query metric, the run param holding its threshold)
VIEWS = {
    "correctness": ("correctness", "attribution.correct"),
    # a judge model's reading of the key facts (judge=openai|local|mlflow): validated on the same answers
    "correctness_judged": ("correctness_judged", "attribution.correct"),
    "judge": ("faithfulness", "attribution.faithful"),
}


def generated_answers(table: pd.DataFrame) -> pd.DataFrame:
    """The run's generated answers (no generation error), one row each: ``answer_id`` (the item id,
    ``#r<replicate>`` added in a replicated run), query, context, answer, and the automatic views'
    inputs (``declined``, ``correctness``, ``faithfulness`` where the run has them)."""
    t = table[table["answer"].notna() & (table["error"].isna() if "error" in table else True)].copy()
    t = t[t["answer"].astype(str).str.strip() != ""]
    rep = t["replicate"] if "replicate" in t and t["replicate"].nunique() > 1 else None
    t["answer_id"] = t["id"].astype(str) + (("#r" + rep.astype(int).astype(str)) if rep is not None else "")
    keep = ["answer_id", "query", "context", "answer", "declined", "correctness", "faithfulness"]
    for c in keep:
        if c not in t:
            t[c] = np.nan
    judged = ["correctness_judged"] if "correctness_judged" in t else []  # a judge model read the facts
    return t[keep + judged].reset_index(drop=True)


def sample_answers(answers: pd.DataFrame, n: int, seed: int = 0) -> pd.DataFrame:
    """A seeded simple random sample of ``n`` answers (all of them when fewer), in run order, with
    ``inclusion_prob`` = n / N and an empty ``human_answer``."""
    n = min(n, len(answers))
    idx = np.sort(np.random.default_rng(seed).choice(len(answers), size=n, replace=False))
    out = answers.iloc[idx].copy()
    out["inclusion_prob"] = n / len(answers) if len(answers) else np.nan
    out["human_answer"] = ""
    return out.reset_index(drop=True)


def read_answer_labels(path: Path, answers: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """(labelled rows: answer_id and ``human``, blank rows) of a filled answer CSV. Every bad row is
    a ``FILE:LINE: field: problem`` in one :class:`LabelFileError`: a missing column, a label not in
    :data:`ANSWER_LABELS`, an answer_id that is not a generated answer of the run, an answer text
    that differs from the run's, a duplicate; no labelled row is an error too."""
    name = str(path)
    by_id = answers.set_index("answer_id")
    rows, problems, n_blank, seen = [], [], 0, {}
    with _open_text(path) as f:
        reader = csv.reader(f, strict=True)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in ("answer_id", "answer", "human_answer") if c not in header]
        if missing:
            raise LabelFileError([f"{name}:1: {c}: missing column" for c in missing])
        for line, values in _records(reader, name, problems):
            rec = dict(zip(header, values, strict=False))
            where = f"{name}:{line}"
            aid, human = (rec.get("answer_id") or "").strip(), (rec.get("human_answer") or "").strip().lower()
            if not human:
                n_blank += 1
            elif human not in ANSWER_LABELS:
                problems.append(f"{where}: human_answer: {human!r} is not one of {', '.join(ANSWER_LABELS)}")
            elif aid not in by_id.index:
                problems.append(f"{where}: answer_id: {aid!r} is not a generated answer of the run")
            elif " ".join((rec.get("answer") or "").split()) != " ".join(
                str(by_id.at[aid, "answer"]).split()
            ):
                problems.append(f"{where}: answer: does not match the run's answer {aid}")
            elif aid in seen:
                problems.append(f"{where}: answer_id: {aid!r} already labelled on line {seen[aid]}")
            else:
                seen[aid] = line
                rows.append({"answer_id": aid, "human": human})
    if not problems and not rows:
        problems.append(
            f"{name}: human_answer: no answer labelled ({n_blank} blank rows); fill in correct / incorrect / declined"
        )
    if problems:
        raise LabelFileError(problems)
    return pd.DataFrame(rows, columns=["answer_id", "human"]), n_blank


def view_labels(answers: pd.DataFrame, metric: str, threshold: float) -> pd.Series:
    """One view's label per answer: ``declined`` (the run's decline detector), else ``correct``
    when ``metric >= threshold``, else ``incorrect``; None where the metric is NaN (not scored)."""

    def one(row) -> str | None:
        if row["declined"] is True or row["declined"] == 1:
            return "declined"
        v = row[metric]
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        return "correct" if float(v) >= threshold else "incorrect"

    return pd.Series([one(r) for _, r in answers.iterrows()], index=answers.index, dtype=object)


@dataclass
class CardRow:
    """One view of the correctness card: its figures on the labelled answers it scores."""

    view: str
    metric: str
    threshold: float
    n: int
    n_unscored: int
    agreement: float
    kappa: float
    kappa_ci: tuple[float, float]
    confusion: pd.DataFrame = field(repr=False)
    too_few: str | None = None  # κ not said: fewer than 5 human labels in a class (evaluation.intervals)


def _threshold(run: RunData, key: str) -> float:
    try:
        return float(run.params[key])
    except (KeyError, TypeError, ValueError):
        return 0.5


def answer_card(
    run: RunData, answers: pd.DataFrame, labels: pd.DataFrame, seed: int = 0, n_resamples: int = 2000
) -> list[CardRow]:
    """The correctness card: per view (:data:`VIEWS`) whose metric the run has, agreement =
    share of labelled answers where view and human agree, κ (:func:`judge.agreement.cohen_kappa`,
    three classes) with its percentile-bootstrap 95 % CI (:func:`judge.agreement.kappa_ci`), and the
    confusion matrix (rows human, columns view), over the labelled answers the view scores."""
    merged = labels.merge(answers, on="answer_id", how="left")
    rows = []
    for view, (metric, key) in VIEWS.items():
        if metric not in merged:
            continue  # a view of a metric the run never computed (correctness_judged without a judge model)
        if merged[metric].isna().all() and not (merged["declined"] == True).any():  # noqa: E712
            continue  # the run has no such metric (judge=none: no faithfulness)
        th = _threshold(run, key)
        lab = view_labels(merged, metric, th)
        ok = lab.notna().to_numpy()
        h, v = merged["human"].to_numpy()[ok], lab.to_numpy()[ok]
        conf = pd.DataFrame(
            0, index=[f"human {c}" for c in ANSWER_LABELS], columns=[f"{view} {c}" for c in ANSWER_LABELS]
        )
        for a, b in zip(h, v, strict=True):
            conf.at[f"human {a}", f"{view} {b}"] += 1
        few = kappa_too_few(h, sorted(set(map(str, h)) | set(map(str, v))))
        nan2 = (float("nan"), float("nan"))
        rows.append(
            CardRow(
                view, metric, th, int(ok.sum()), int((~ok).sum()),
                float(np.mean(h == v)) if len(h) else float("nan"),
                float("nan") if few else cohen_kappa(h, v),
                nan2 if few else kappa_ci(h, v, seed=seed, n_resamples=n_resamples), conf, few,
            )
        )  # fmt: skip
    return rows


@dataclass
class PairedViews:
    """String-match and judged correctness on the same labelled answers (the ones both score):
    each κ with its CI, and Δκ = κ(judged) − κ(string) with a paired bootstrap CI
    (``analysis.correctness_view`` decides with it)."""

    n: int
    kappa_string: tuple[float, float, float]
    kappa_judged: tuple[float, float, float]
    delta: tuple[float, float, float]
    too_few: str | None = None


def paired_views(
    run: RunData, answers: pd.DataFrame, labels: pd.DataFrame, seed: int = 0, n_resamples: int = 2000
) -> PairedViews | None:
    """The two correctness views compared like with like: on the labelled answers both score;
    None when the run has no ``correctness_judged`` (no judge model read the facts)."""
    merged = labels.merge(answers, on="answer_id", how="left")
    if JUDGED not in merged or merged[JUDGED].isna().all():
        return None
    th = _threshold(run, VIEWS[STRING][1])
    s, j = view_labels(merged, STRING, th), view_labels(merged, JUDGED, th)
    ok = (s.notna() & j.notna()).to_numpy()
    h, s, j = merged["human"].to_numpy()[ok], s.to_numpy()[ok], j.to_numpy()[ok]
    few = kappa_too_few(h, sorted(set(map(str, h)) | set(map(str, s)) | set(map(str, j))))
    nan3 = (math.nan, math.nan, math.nan)
    if few:
        return PairedViews(int(ok.sum()), nan3, nan3, nan3, few)
    ks = (cohen_kappa(h, s), *kappa_ci(h, s, seed=seed, n_resamples=n_resamples))
    kj = (cohen_kappa(h, j), *kappa_ci(h, j, seed=seed, n_resamples=n_resamples))
    return PairedViews(int(ok.sum()), ks, kj, kappa_delta_ci(h, s, j, seed=seed, n_resamples=n_resamples))


def _f(x: float) -> str:
    return (
        "n/a"
        if x is None or (isinstance(x, float) and math.isnan(x))
        else f"{x:+.2f}"
        if x < 0
        else f"{x:.2f}"
    )


def render_card(
    run: RunData,
    rows: list[CardRow],
    n_labelled: int,
    n_blank: int,
    source: str,
    pair: PairedViews | None = None,
) -> str:
    """The card as Markdown: one line per view, the two correctness views on the same answers
    (``pair``), then each confusion matrix."""
    lines = [
        f"# Correctness card: run {run.label}",
        "",
        f"{n_labelled} answers labelled by hand in {source} ({n_blank} blank rows skipped); labels "
        f"{' / '.join(ANSWER_LABELS)}, blind (no metric in the file).",
        "",
        "| view | metric ≥ threshold → correct | n | not scored | agreement | κ [95 % CI] |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.view} | `{r.metric}` ≥ {r.threshold:g} | {r.n} | {r.n_unscored} | {_f(r.agreement)} | "
            f"{r.too_few or f'{_f(r.kappa)} [{_f(r.kappa_ci[0])}, {_f(r.kappa_ci[1])}]'} |"
        )
    if any(r.too_few for r in rows):
        lines += [
            "",
            "κ is not said where a class has fewer than 5 human labels (too few to say): read the "
            "agreement and the confusion matrices, and label more answers of the rare kind.",
        ]
    if pair is not None:
        k = "κ {} [{}, {}]".format
        lines += [
            "",
            f"String match against the judge's reading, on the {pair.n} labelled answers both score: "
            + (
                pair.too_few
                if pair.too_few
                else f"correctness {k(*map(_f, pair.kappa_string))}, correctness_judged "
                f"{k(*map(_f, pair.kappa_judged))}, Δκ (judged − string) {pair.delta[0]:+.2f} "
                f"[{pair.delta[1]:+.2f}, {pair.delta[2]:+.2f}] (paired bootstrap). select, gate and the report "
                "read correctness_judged when this interval lies above 0 (docs/spotcheck.md)."
            ),
        ]
    for r in rows:
        lines += [
            "",
            f"{r.view} (rows: human, columns: {r.view}):",
            "",
            "```",
            r.confusion.to_string(),
            "```",
        ]
    lines += [
        "",
        "Both views label a decline `declined` (the run's decline detector). κ below 0.4 (or a CI "
        "reaching 0): the view does not track what a reader calls correct on this run; read its "
        "figures as a string match (correctness) or a support check (judge), not as correctness.",
    ]
    return "\n".join(lines) + "\n"


def card_metrics(rows: list[CardRow], n_labelled: int, pair: PairedViews | None = None) -> dict[str, float]:
    """``spotcheck/answers/*`` metrics of the card (NaN ones left out), the paired views' under
    ``analysis.correctness_view.PAIRED``."""
    out: dict[str, float] = {"spotcheck/answers/n": float(n_labelled)}
    if pair is not None:
        keys = paired_keys()
        out[keys["n"]] = pair.n
        for name, t in (
            ("kappa_string", pair.kappa_string),
            ("kappa_judged", pair.kappa_judged),
            ("delta", pair.delta),
        ):
            out |= dict(zip((keys[name], keys[f"{name}_ci_low"], keys[f"{name}_ci_high"]), t, strict=True))
    for r in rows:
        p = f"spotcheck/answers/{r.view}"
        out |= {f"{p}/n": r.n, f"{p}/n_unscored": r.n_unscored, f"{p}/agreement": r.agreement}
        out |= {
            f"{p}/kappa": r.kappa,
            f"{p}/kappa_ci_low": r.kappa_ci[0],
            f"{p}/kappa_ci_high": r.kappa_ci[1],
        }
    return {k: float(v) for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}
