"""Measuring a trained judge honestly: folds grouped by claim, figures with cluster-bootstrap CIs.

A judge is only as good as its agreement with labels it was not fitted to, so every figure of a
fitted verifier comes from cross-validation whose folds never split a group (a claim, or a
synthetic source sentence with its perturbations): :func:`grouped_folds`. CIs resample whole
groups (pairs of one claim are not independent): :func:`figures_with_ci`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from rag_experiments.analysis.agreement import cohen_kappa


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


def figures(gold: Sequence[str], pred: Sequence[str], types: Sequence[str] | None = None) -> dict:
    """κ, balanced accuracy (mean recall of both labels), accuracy, precision/recall of
    ``supported`` and the acceptance rate (share judged supported) per pair type.

    A prediction other than supported/unsupported (unparseable) counts as wrong for both classes.
    """
    g, p = np.asarray(gold, dtype=object), np.asarray(pred, dtype=object)
    sup, uns = g == "supported", g == "unsupported"
    rec_s = float(np.mean(p[sup] == "supported")) if sup.any() else math.nan
    rec_u = float(np.mean(p[uns] == "unsupported")) if uns.any() else math.nan
    n_ps = int(np.sum(p == "supported"))
    out = {
        "n": len(g),
        "kappa": cohen_kappa(g, p) if len(set(g)) > 1 else math.nan,
        "balanced_accuracy": (rec_s + rec_u) / 2,
        "accuracy": float(np.mean(g == p)) if len(g) else math.nan,
        "precision_supported": float(np.sum(sup & (p == "supported")) / n_ps) if n_ps else math.nan,
        "recall_supported": rec_s,
    }
    if types is not None:
        t = np.asarray(types, dtype=object)
        out["accept_by_type"] = {str(k): float(np.mean(p[t == k] == "supported")) for k in sorted(set(t))}
    return out


def figures_with_ci(
    gold: Sequence[str],
    pred: Sequence[str],
    groups: Sequence[str],
    types: Sequence[str] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict:
    """:func:`figures` plus ``<name>_ci`` = percentile CI from a bootstrap over whole groups."""
    g, p = np.asarray(gold, dtype=object), np.asarray(pred, dtype=object)
    t = None if types is None else np.asarray(types, dtype=object)
    point = figures(g, p, t)
    uniq, inv = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    members = [np.flatnonzero(inv == i) for i in range(len(uniq))]
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {}
    for _ in range(n_resamples):
        idx = np.concatenate([members[i] for i in rng.integers(0, len(uniq), len(uniq))])
        f = figures(g[idx], p[idx], None if t is None else t[idx])
        for key, v in _flat(f).items():
            if not math.isnan(v):
                draws.setdefault(key, []).append(v)
    a = (1 - confidence) / 2
    cis = {k: tuple(float(x) for x in np.quantile(v, [a, 1 - a])) for k, v in draws.items() if v}
    point["ci"] = cis
    return point


def _flat(f: dict) -> dict[str, float]:
    out = {k: float(v) for k, v in f.items() if isinstance(v, int | float) and k != "n"}
    out.update({f"accept/{k}": v for k, v in f.get("accept_by_type", {}).items()})
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
