"""Measuring a trained judge honestly: folds grouped by claim, figures with cluster-bootstrap CIs.

A judge is only as good as its agreement with labels it was not fitted to, so every figure of a
fitted verifier comes from cross-validation whose folds never split a group (a claim, or a
synthetic source sentence with its perturbations): :func:`grouped_folds`. CIs resample whole
groups (pairs of one claim are not independent): :func:`figures_with_ci`, the validity card's
figures (``judge.card``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from rag_experiments.judge.card import judge_card

POINT_FIGURES = (
    "kappa", "balanced_accuracy", "accuracy", "precision_supported", "recall_supported", "unparseable_rate"
)


def grouped_folds(groups: Sequence[str], k: int = 5, seed: int = 0) -> np.ndarray:
    """Fold index (0..k-1) per item; every group in exactly one fold, fold sizes balanced.

    Groups are shuffled with ``seed``, then, largest first, each goes to the currently smallest
    fold (scikit-learn's ``GroupKFold`` balancing, with a seeded order).
    """
    uniq, inv, counts = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True, return_counts=True)
    if len(uniq) < k:
        raise ValueError(f"{len(uniq)} groups cannot make {k} grouped folds")
    order = np.random.default_rng(seed).permutation(len(uniq))
    order = order[np.argsort(-counts[order], kind="stable")]
    fold_of_group = np.zeros(len(uniq), int)
    sizes = np.zeros(k, int)
    for g in order:
        f = int(np.argmin(sizes))
        fold_of_group[g] = f
        sizes[f] += counts[g]
    return fold_of_group[inv]


def figures_with_ci(
    gold: Sequence[str],
    pred: Sequence[str],
    groups: Sequence[str],
    types: Sequence[str] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict:
    """The validity card's figures (:func:`judge.card.judge_card`, their one definition:
    unparseable a third class, CIs from a bootstrap over whole groups) in a flat form: the point
    values, ``accept_by_type`` and ``ci`` = {figure or ``accept/<type>``: (lo, hi)}."""
    kinds = list(types) if types is not None else ["all"] * len(gold)
    card = judge_card(
        gold, pred, kinds, groups, [math.nan] * len(gold),
        n_resamples=n_resamples, seed=seed, confidence=confidence,
    )
    out: dict = {"n": card["n"]}
    cis: dict[str, tuple[float, float]] = {}
    for key in POINT_FIGURES:
        out[key] = card[key]["value"]
        cis[key] = tuple(card[key]["ci"])
    out["accept_by_type"] = {t: v["value"] for t, v in card["accept_by_type"].items()}
    cis.update({f"accept/{t}": tuple(v["ci"]) for t, v in card["accept_by_type"].items()})
    out["ci"] = cis
    return out


def cross_validated(
    fit: Callable[[np.ndarray], Callable[[np.ndarray], np.ndarray]],
    n: int,
    groups: Sequence[str],
    k: int = 5,
    seed: int = 0,
) -> np.ndarray:
    """Out-of-fold scores: ``fit(train_idx)`` returns ``predict(test_idx) -> scores``; every item
    is scored by a model that never saw its group."""
    folds = grouped_folds(groups, k, seed)
    out = np.full(n, np.nan)
    for f in range(k):
        test = np.flatnonzero(folds == f)
        predict = fit(np.flatnonzero(folds != f))
        out[test] = predict(test)
    return out
