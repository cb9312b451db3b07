"""A judge's validity card: its agreement with labelled (claim, evidence) pairs, with bootstrap CIs.

Pure functions over aligned arrays: ``gold`` (``supported`` | ``unsupported``), ``pred`` (the
judge's label: ``supported`` | ``unsupported`` | ``unparseable``), the pair ``types``, the
cross-validation ``groups`` (``JudgePair.group_key``: the normalised claim by default), seconds
per verdict, and optionally the labels of every repeat (``judge.repeats``). An unparseable
verdict is a third predicted class: it counts as a disagreement everywhere (never as "no"), so a
judge cannot look better by refusing to answer. docs/judges.md describes the card.

CIs: percentile bootstrap, seeded, resampling *groups* of pairs (clusters) with replacement:
pairs that share a claim are not independent, so resampling single pairs would make the
intervals too narrow. Every figure of one resample uses the same draw.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rag_experiments.evaluation.intervals import KAPPA_MIN_PER_CLASS, kappa_too_few
from rag_experiments.judge.agreement import cohen_kappa, kappa_of_confusion

SUPPORTED, UNSUPPORTED, UNPARSEABLE = "supported", "unsupported", "unparseable"
#: The card's figures with one value each (``accept_by_type`` is per pair type).
SCALARS = (
    "kappa",
    "balanced_accuracy",
    "accuracy",
    "precision_supported",
    "recall_supported",
    "unparseable_rate",
    "seconds_per_verdict",
    "flip_rate",
)


def _share(num: np.ndarray, den: np.ndarray) -> float:
    d = float(den.sum())
    return float((num & den).sum()) / d if d > 0 else math.nan


def point_figures(gold: Sequence[str], pred: Sequence[str]) -> dict[str, float]:
    """The agreement figures of one set of verdicts (NaN where a denominator is empty).

    - ``kappa``: Cohen's κ of gold vs pred with ``unparseable`` as a third predicted class
      (``judge.agreement.cohen_kappa``); NaN with fewer than 5 gold labels in a class
      (``evaluation.intervals.kappa_too_few``: too few to say);
    - ``accuracy`` = P(pred = gold);
    - ``balanced_accuracy`` = ½ · (P(pred = supported | gold supported) + P(pred = unsupported |
      gold unsupported)), the mean recall of the two gold classes (robust to label imbalance);
    - ``precision_supported`` = P(gold supported | pred supported);
    - ``recall_supported`` = P(pred supported | gold supported);
    - ``unparseable_rate`` = P(pred = unparseable).
    """
    g, p = np.asarray(gold, dtype=object), np.asarray(pred, dtype=object)
    if len(g) == 0:
        return dict.fromkeys(SCALARS[:6], math.nan)
    gs, gu, ps, pu = g == SUPPORTED, g == UNSUPPORTED, p == SUPPORTED, p == UNSUPPORTED
    rec_s, rec_u = _share(ps, gs), _share(pu, gu)
    return {
        "kappa": math.nan if kappa_too_few(g, (SUPPORTED, UNSUPPORTED)) else cohen_kappa(g, p),
        "balanced_accuracy": (rec_s + rec_u) / 2,
        "accuracy": float((g == p).mean()),
        "precision_supported": _share(gs, ps),
        "recall_supported": rec_s,
        "unparseable_rate": float((p == UNPARSEABLE).mean()),
    }


def accept_by_type(pred: Sequence[str], types: Sequence[str]) -> dict[str, float]:
    """Per pair type t: acceptance = P(pred = supported | type = t). For a type with a single gold
    label (``contradict_evidence``: all unsupported) κ is undefined and this is the figure to read."""
    p, t = np.asarray(pred, dtype=object), np.asarray(types, dtype=object)
    return {str(k): float((p[t == k] == SUPPORTED).mean()) for k in sorted(set(t.tolist()))}


def flip_rate(repeat_preds: Sequence[Sequence[str]] | None) -> float:
    """Share of items whose verdicts are not all equal across the judge's repeats.

    ``repeat_preds[r][i]``: the label of item i in repeat r. flip = 1 when the R ≥ 2 labels of an
    item are not all the same (an unparseable repeat counts as a label), else 0; NaN with < 2
    repeats (nothing to compare) or no items.
    """
    if repeat_preds is None or len(repeat_preds) < 2 or len(repeat_preds[0]) == 0:
        return math.nan
    r = np.asarray(repeat_preds, dtype=object)
    return float((r != r[0]).any(axis=0).mean())


def _figures(gold, pred, types, seconds, repeats, type_names) -> dict[str, Any]:
    out: dict[str, Any] = point_figures(gold, pred)
    out["seconds_per_verdict"] = float(np.nanmean(seconds)) if np.isfinite(seconds).any() else math.nan
    out["flip_rate"] = flip_rate(repeats)
    acc = accept_by_type(pred, types)
    out["accept_by_type"] = {t: acc.get(t, math.nan) for t in type_names}
    return out


def _ci(values: list[float], confidence: float) -> list[float]:
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return [math.nan, math.nan]
    a = (1 - confidence) / 2
    lo, hi = np.quantile(v, [a, 1 - a])
    return [float(lo), float(hi)]


def judge_card(
    gold: Sequence[str],
    pred: Sequence[str],
    types: Sequence[str],
    groups: Sequence[str],
    seconds: Sequence[float],
    repeat_preds: Sequence[Sequence[str]] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """The card: every figure of :func:`point_figures`, ``seconds_per_verdict`` (mean wall time of
    one verdict; NaN entries, e.g. cached verdicts, left out), ``flip_rate`` (:func:`flip_rate`)
    and ``accept_by_type`` (:func:`accept_by_type`), each as ``{"value": x, "ci": [lo, hi]}``,
    plus ``n`` (pairs), ``n_groups`` and ``ci_method``.

    CI: percentile bootstrap at ``confidence`` over ``n_resamples`` resamples drawn with
    ``numpy.random.default_rng(seed)``; each resample draws the distinct ``groups`` with
    replacement and takes all pairs of each drawn group (a cluster bootstrap). A resample in which
    a figure is undefined (NaN, e.g. κ with one gold class) is left out of that figure's interval.
    """
    g, p = np.asarray(gold, dtype=object), np.asarray(pred, dtype=object)
    t, s = np.asarray(types, dtype=object), np.asarray(seconds, float)
    rep = None if repeat_preds is None or len(repeat_preds) < 2 else np.asarray(repeat_preds, dtype=object)
    if not (len(g) == len(p) == len(t) == len(s) == len(groups)):
        raise ValueError("judge_card: gold, pred, types, groups and seconds must have one entry per pair")
    type_names = sorted(set(t.tolist()))
    point = _figures(g, p, t, s, rep, type_names)
    codes = _group_codes(groups)
    members = [np.flatnonzero(codes == c) for c in range(codes.max() + 1)] if len(codes) else []
    draws: dict[str, list[float]] = {k: [] for k in SCALARS}
    draws.update({f"accept/{ty}": [] for ty in type_names})
    for row in cluster_draws(len(members), n_resamples, seed):
        idx = np.concatenate([members[c] for c in row])
        f = _figures(g[idx], p[idx], t[idx], s[idx], None if rep is None else rep[:, idx], type_names)
        for k in SCALARS:
            draws[k].append(f[k])
        for ty, v in f["accept_by_type"].items():
            draws[f"accept/{ty}"].append(v)
    card: dict[str, Any] = {"n": int(len(g)), "n_groups": len(members), "confidence": confidence}
    card["kappa_too_few"] = kappa_too_few(g, (SUPPORTED, UNSUPPORTED))  # None, or the counts
    for k in SCALARS:
        card[k] = {"value": point[k], "ci": _ci(draws[k], confidence)}
    card["accept_by_type"] = {
        ty: {"value": point["accept_by_type"][ty], "ci": _ci(draws[f"accept/{ty}"], confidence)}
        for ty in type_names
    }
    card["ci_method"] = (
        f"percentile bootstrap, {n_resamples} resamples of claim groups (cluster bootstrap), "
        f"seed {seed}, {100 * confidence:g} %"
    )
    return card


def _group_codes(groups: Sequence[str]) -> np.ndarray:
    return np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)[1].reshape(-1)


def cluster_draws(n_groups: int, n_resamples: int, seed: int) -> np.ndarray:
    """The cluster bootstrap's draws: row r holds the ``n_groups`` group indices (with replacement)
    of resample r, from ``numpy.random.default_rng(seed)``; no rows with fewer than 2 groups."""
    if n_groups < 2:
        return np.zeros((0, n_groups), int)
    return np.random.default_rng(seed).integers(0, n_groups, (n_resamples, n_groups))


def kappa_interval(
    gold: Sequence[str],
    pred: Sequence[str],
    groups: Sequence[str],
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> list[float]:
    """The κ interval of :func:`judge_card` (same draws, same rule for a resample with too few
    labels in a class), alone and vectorised: every resample's confusion matrix is the draw's group
    counts times the groups' confusion matrices, so a sequential card can look after each batch."""
    g, p = np.asarray(gold, dtype=object), np.asarray(pred, dtype=object)
    codes = _group_codes(groups)
    n_groups = int(codes.max()) + 1 if len(codes) else 0
    draws = cluster_draws(n_groups, n_resamples, seed)
    if not len(draws):
        return [math.nan, math.nan]
    cats = (SUPPORTED, UNSUPPORTED, UNPARSEABLE)  # any other prediction: a third class, as unparseable
    gi = np.array([cats.index(x) if x in cats else 2 for x in g])
    pi = np.array([cats.index(x) if x in cats else 2 for x in p])
    per_group = np.zeros((n_groups, 3, 3))
    np.add.at(per_group, (codes, gi, pi), 1)
    rows = np.arange(len(draws))[:, None] * n_groups
    counts = np.bincount((rows + draws).ravel(), minlength=draws.size).reshape(draws.shape)
    conf = (counts @ per_group.reshape(n_groups, 9)).reshape(-1, 3, 3)
    kappas = kappa_of_confusion(conf)
    kappas[conf.sum(axis=2)[:, :2].min(axis=1) < KAPPA_MIN_PER_CLASS] = np.nan  # kappa_too_few's rule
    return _ci(list(kappas), confidence)


def card_metrics(card: Mapping[str, Any], prefix: str = "judge_card/") -> dict[str, float]:
    """The card as MLflow metrics: ``judge_card/{figure}`` with ``/ci_low`` and ``/ci_high``,
    ``judge_card/accept/{type}`` likewise, and ``judge_card/n_pairs``. NaN figures are left out
    (a NaN metric would plot as a value)."""
    out: dict[str, float] = {f"{prefix}n_pairs": float(card["n"])}

    def put(name: str, cell: Mapping[str, Any]) -> None:
        for suffix, v in (("", cell["value"]), ("/ci_low", cell["ci"][0]), ("/ci_high", cell["ci"][1])):
            if v is not None and not math.isnan(v):
                out[f"{prefix}{name}{suffix}"] = float(v)

    for k in SCALARS:
        put(k, card[k])
    for ty, cell in card["accept_by_type"].items():
        put(f"accept/{ty}", cell)
    return out


def card_line(card: Mapping[str, Any], source: str = "") -> str:
    """One line for a run's summary: n, κ, balanced accuracy and unparseable share; a ``synthetic``
    card is labelled as an optimistic bound (``analysis.judge_trust``), an unsound one
    (``judge.validity.unsound``: measured while the judge failed) says why."""

    def f(key: str) -> str:
        c = card[key]
        v, (lo, hi) = c["value"], c["ci"]
        return "n/a" if v is None or math.isnan(v) else f"{v:.3f} [{lo:.3f}, {hi:.3f}]"

    flip = "" if math.isnan(card["flip_rate"]["value"]) else f", flip rate {f('flip_rate')}"
    kappa = card.get("kappa_too_few") or f("kappa")
    # a synthetic card's κ is a bound on easy rule-made pairs, never the judge's accuracy here
    what = (
        f"{card['n']} synthetic pairs: an optimistic bound, not accuracy on this corpus"
        if source == "synthetic"
        else f"{card['n']} {source} pairs"
    )
    unsound = f"; NOT A SOUND CARD (not cached): {card['unsound']}" if card.get("unsound") else ""
    stop = f"; stopped: {card['stop']['why']}" if card.get("stop") else ""
    return (
        f"judge card ({what}; {100 * card.get('confidence', 0.95):g}% CI): kappa {kappa}, balanced accuracy "
        f"{f('balanced_accuracy')}, unparseable {f('unparseable_rate')}{flip}{stop}{unsound}"
    )
