"""How far a run's generation metrics can be trusted: human labels lead, the synthetic card is a bound.

The judge card a generating run logs by default (``judge_card_source = synthetic``) is measured on
pairs made from the corpus by rule (``datasets/synthetic_pairs.py``): easy, clean perturbations,
so its κ is an **optimistic bound**, never the judge's accuracy on this corpus's answers (on a
real corpus κ 0.47–0.53 on synthetic pairs vs 0.05 against the user's own labels, issue 27).
Human labels decide when they exist, in this order:

1. the spot-check of this run (``spotcheck score``, CSV or review queue): ``spotcheck/kappa``;
2. a card on human-labelled pairs (``judge_card.pairs=FILE``): ``judge_card/kappa`` with
   ``judge_card_source = file:<name>``.

Every consumer (run summary, report, compare, select) calls this one module, so they print the
same words and the same threshold. docs/judges.md, "How far to trust the judge". Key-fact
correctness has its own human check, the correctness card on answer-level labels
(:func:`runs_correctness_notes`: a run whose correctness was never checked says so, with the n).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rag_experiments.evaluation.registry import spec

Z975 = 1.959963984540054
#: Below this human κ the judge's verdicts do not support generation conclusions (Landis & Koch:
#: < 0.4 is at most "fair" agreement).
KAPPA_UNRELIABLE = 0.4
#: The CI half-width the unvalidated note plans for.
DEFAULT_HALF_WIDTH = 0.1
SPOTCHECK_CMD = "python -m rag_experiments.spotcheck sample {run} -n {n}"


#: Metric sides whose values rest on the judge's verdicts (evaluation.registry).
JUDGED_SIDES = ("generation", "diagnostic", "label", "judge")


def is_generation_metric(key: str) -> bool:
    """A metric whose conclusions rest on generation and its judge (registry side in
    :data:`JUDGED_SIDES`); unknown keys are not."""
    try:
        return spec(key).side in JUDGED_SIDES
    except KeyError:
        return False


def labels_needed(half_width: float = DEFAULT_HALF_WIDTH, p: float = 0.5, z: float = Z975) -> int:
    """Labelled claims for a 95 % CI of half-width ``h`` on judge–human agreement (a proportion).

    n = ⌈z² · p(1 − p) / h²⌉ (normal approximation); p = 0.5 is the worst case, so the default
    (h = 0.1) is ⌈1.96² · 0.25 / 0.01⌉ = 97 labels.
    """
    if not 0 < half_width < 1 or not 0 <= p <= 1:
        raise ValueError("half_width must be in (0, 1) and p in [0, 1]")
    return math.ceil(z * z * p * (1 - p) / half_width**2)


def kappa_labels_needed(
    half_width: float = DEFAULT_HALF_WIDTH, p_o: float = 0.75, p_e: float = 0.5, z: float = Z975
) -> int:
    """Labelled claims for a 95 % CI of half-width ``h`` on Cohen's κ.

    Large-sample variance κ̂ ≈ p_o(1 − p_o) / (n (1 − p_e)²) (Cohen 1960), so
    n = ⌈z² · p_o(1 − p_o) / (h² (1 − p_e)²)⌉; with p_o = 0.75, p_e = 0.5 (κ = 0.5) and h = 0.1:
    289 labels. κ needs about three times the labels of agreement for the same width.
    """
    if not 0 < half_width < 1 or not 0 <= p_e < 1:
        raise ValueError("half_width must be in (0, 1) and p_e in [0, 1)")
    return math.ceil(z * z * p_o * (1 - p_o) / (half_width**2 * (1 - p_e) ** 2))


@dataclass(frozen=True)
class HumanKappa:
    kappa: float
    source: str  # "spot-check" | "labelled pairs (file:NAME)"
    n: int | None  # labels it rests on, when logged


def human_kappa(metrics: Mapping[str, float], tags: Mapping[str, str]) -> HumanKappa | None:
    """The judge's κ against human labels of one run (module docstring's order), else None.
    The synthetic card is never returned: it is not a human measurement."""
    k = metrics.get("spotcheck/kappa")
    if k is not None and not math.isnan(k):
        n = metrics.get("spotcheck/n")
        return HumanKappa(float(k), "spot-check", None if n is None else int(n))
    source = str(tags.get("judge_card_source", ""))
    k = metrics.get("judge_card/kappa")
    if source.startswith("file:") and k is not None and not math.isnan(k):
        n = metrics.get("judge_card/n_pairs")
        return HumanKappa(float(k), f"labelled pairs ({source})", None if n is None else int(n))
    return None


def card_title(source: str) -> str:
    """What the card is, by its pairs' source: a synthetic card says it is a bound."""
    if source == "synthetic":
        return "synthetic pairs: an optimistic bound, not this corpus's accuracy"
    if source.startswith("file:"):
        return f"human-labelled pairs, {source.removeprefix('file:')}"
    return source


def unvalidated_note(run: str = "RUN", half_width: float = DEFAULT_HALF_WIDTH) -> str:
    """The one-line note of a generating run without human labels: what is wrong, how to fix it."""
    n = labels_needed(half_width)
    return (
        "generation metrics unvalidated on this corpus: no human labels of this judge (a judge card "
        "on synthetic pairs is only an optimistic bound). Label "
        f"{n} claims for agreement within ±{half_width:g} (n = ⌈1.96²·0.25/h²⌉): "
        f"{SPOTCHECK_CMD.format(run=run, n=n)}, fill human_verdict, then spotcheck score"
    )


def unreliable_marker(hk: HumanKappa | None) -> str | None:
    """``judge κ=0.05 vs your labels: generation conclusions unreliable`` when the human κ is
    below :data:`KAPPA_UNRELIABLE`, else None."""
    if hk is None or hk.kappa >= KAPPA_UNRELIABLE:
        return None
    n = f", n={hk.n}" if hk.n else ""
    return (
        f"judge κ={hk.kappa:.2f} vs your labels ({hk.source}{n}): generation conclusions unreliable "
        f"(κ < {KAPPA_UNRELIABLE:g})"
    )


def _lowest(runs: Iterable[tuple[Mapping[str, float], Mapping[str, str]]]) -> HumanKappa | None:
    found = [hk for m, t in runs if (hk := human_kappa(m, t)) is not None]
    return min(found, key=lambda h: h.kappa) if found else None


def generation_marker(runs: Iterable[tuple[Mapping[str, float], Mapping[str, str]]]) -> str | None:
    """The :func:`unreliable_marker` of the lowest human κ among runs given as ``(metrics, tags)``:
    compare, select and report put it beside generation conclusions."""
    return unreliable_marker(_lowest(runs))


def runs_judge_notes(
    runs: Iterable[tuple[Mapping[str, float], Mapping[str, str]]], run: str = "RUN"
) -> list[str]:
    """The judge notes of a set of runs: the unreliable marker of the lowest human κ among them;
    else, when none has human labels and some had a judge (tag ``judge_card_source``: synthetic,
    disabled or skipped), the unvalidated note once. Retrieval-only runs add nothing."""
    runs = list(runs)
    hk = _lowest(runs)
    if hk is not None:
        marker = unreliable_marker(hk)
        return [marker] if marker else []
    return [unvalidated_note(run)] if any("judge_card_source" in t for _, t in runs) else []


#: The answer-level spot-check (docs/spotcheck.md, "Answer labels and the correctness card").
ANSWERS_CMD = "python -m rag_experiments.spotcheck sample-answers {run} -n {n} --out answers.csv"
#: The correctness card's κ of key-fact correctness against answer-level human labels.
ANSWER_KAPPA = "spotcheck/answers/correctness/kappa"


def answers_checked(metrics: Mapping[str, float]) -> bool:
    """Has this run's correctness been checked against answer-level human labels (the correctness
    card of ``spotcheck score-answers``, :data:`ANSWER_KAPPA`)?"""
    k = metrics.get(ANSWER_KAPPA)
    return k is not None and not math.isnan(k)


def correctness_note(run: str = "RUN", half_width: float = DEFAULT_HALF_WIDTH) -> str:
    """The note of a run whose correctness was never checked against answer-level labels: what is
    wrong, how to fix it, with the n needed (:func:`labels_needed` answers: agreement within ±h)."""
    n = labels_needed(half_width)
    return (
        "correctness unvalidated: key-fact matching was never checked against answer-level human labels. "
        f"Label {n} answers for agreement within ±{half_width:g} (κ within ±{half_width:g} needs "
        f"{kappa_labels_needed(half_width)}): {ANSWERS_CMD.format(run=run, n=n)}, fill human_answer "
        f"(correct / incorrect / declined), then spotcheck score-answers {run} answers.csv (the correctness card)"
    )


def runs_correctness_notes(
    runs: Iterable[tuple[Mapping[str, float], Mapping[str, str]]], run: str = "RUN"
) -> list[str]:
    """:func:`correctness_note` once when some run logged ``correctness`` and none has the
    correctness card; [] otherwise (a retrieval-only run has no correctness)."""
    runs = list(runs)
    if not any("correctness" in m for m, _ in runs) or any(answers_checked(m) for m, _ in runs):
        return []
    return [correctness_note(run)]


def mlflow_runs(runs) -> list[tuple[Mapping[str, float], Mapping[str, str]]]:
    """``(metrics, tags)`` of MLflow ``Run`` objects."""
    return [(r.data.metrics, r.data.tags) for r in runs]


#: The metrics human labels can correct (``spotcheck/ppi_{metric}``): the claim-level spot-check
#: corrects faithfulness; answer-level labels, when logged as ``spotcheck/ppi_correctness``,
#: correct correctness the same way.
CORRECTABLE = ("faithfulness", "correctness")


def _figure(metrics: Mapping[str, float], key: str) -> str | None:
    v = metrics.get(key)
    if v is None or math.isnan(v):
        return None
    lo, hi = metrics.get(f"{key}_ci_low", math.nan), metrics.get(f"{key}_ci_high", math.nan)
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"


def human_figures(
    metric: str, runs: Iterable[tuple[str, Mapping[str, float], Mapping[str, str]]], judged: bool = True
) -> list[str]:
    """The lines that lead a pick, verdict or comparison on ``metric`` over ``runs`` (``(label,
    metrics, tags)``), so human labels steer the advice:

    - runs with a label-corrected estimate (``spotcheck/ppi_{metric}``, PPI with its 95 % CI,
      docs/spotcheck.md): that figure first, the judge-only figure second with the human κ beside
      it, one line per run;
    - a judged metric (``judged``: the judge's opinion, registry break ``judge``) and no human
      labels on any run: one ``UNVALIDATED`` line;
    - [] otherwise (a judge-free metric, or labels that correct another metric)."""
    runs = list(runs)
    lines = []
    for label, m, t in runs:
        ppi = _figure(m, f"spotcheck/ppi_{metric}")
        if ppi is None:
            continue
        judge = _figure(m, f"spotcheck/judge_{metric}") or "–"
        hk = human_kappa(m, t)
        kappa = f"human κ {hk.kappa:.2f} ({hk.source}" + (f", n={hk.n})" if hk.n else ")") if hk else "no κ"
        lines.append(
            f"human-corrected {metric} (PPI, primary) of {label}: {ppi}; judge-only {judge} ({kappa})"
        )
    if lines:
        missing = [label for label, m, _ in runs if _figure(m, f"spotcheck/ppi_{metric}") is None]
        if missing:
            lines.append(f"no human labels on {', '.join(missing)}: their {metric} is the judge's alone")
        return lines
    if judged and not any(human_kappa(m, t) for _, m, t in runs):
        return [
            f"UNVALIDATED: {metric} is the judge's opinion and no config has human labels; "
            + unvalidated_note(runs[0][0] if len(runs) == 1 else "RUN")
        ]
    return []


def ppi_contradiction(
    metric: str, chosen: str, runs: Iterable[tuple[str, Mapping[str, float]]], higher_is_better: bool = True
) -> str | None:
    """A warning when the human-corrected (PPI) estimates contradict a pick made on the judge's
    figures: another config's 95 % CI lies wholly on the better side of the chosen one's
    (``runs``: ``(label, metrics)``, the chosen one among them). None when they do not, or when
    the chosen config has no label-corrected estimate."""
    key = f"spotcheck/ppi_{metric}"
    cis = {
        label: (m.get(f"{key}_ci_low", math.nan), m.get(f"{key}_ci_high", math.nan))
        for label, m in runs
        if m.get(key) is not None and not math.isnan(m[key])
    }
    if chosen not in cis:
        return None
    lo, hi = cis[chosen]
    better = [
        label
        for label, (l2, h2) in cis.items()
        if label != chosen and ((l2 > hi) if higher_is_better else (h2 < lo))
    ]
    if not better:
        return None
    return (
        f"warning: the human-corrected {metric} contradicts the pick: {', '.join(better)} "
        f"{'above' if higher_is_better else 'below'} {chosen} with non-overlapping 95 % CIs (PPI); "
        "the pick rests on the judge's per-query figures"
    )
