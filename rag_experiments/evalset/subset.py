"""The generation subset: a fixed, tag-stratified choice of eval items (``generation_subset``).

Retrieval is scored on every item; generation and judging on this subset, so the default run
fits in minutes. The same eval file always gives the same subset (no randomness).
"""

from __future__ import annotations

from collections import Counter

from rag_experiments.core.types import EvalItem


def stratified_subset(items: list[EvalItem], n: int | None) -> list[int]:
    """Indices of a fixed, tag-stratified subset of ``n`` items (all items when ``n`` is None).

    Each item's stratum is its rarest tag (ties by name; untagged items form their own stratum).
    Strata get ``n * size / total`` items by largest remainder, at least one each while ``n``
    allows; inside a stratum the picks are evenly spaced in file order
    (``floor((j + 0.5) * size / n_s)``). No randomness: the same file gives the same subset.
    """
    if n is None or n >= len(items):
        return list(range(len(items)))
    if n <= 0:
        raise ValueError(f"generation_subset: must be a positive number of items or null, got {n}")
    counts = Counter(t for it in items for t in it.tags)
    strata: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        tag = min(it.tags, key=lambda t: (counts[t], t)) if it.tags else ""
        strata.setdefault(tag, []).append(i)
    names = sorted(strata, key=lambda s: (len(strata[s]), s))
    quota = dict.fromkeys(names, 0)
    for s in names[:n]:  # rarest strata first get their one item
        quota[s] = 1
    left = n - sum(quota.values())
    exact = {s: left * len(strata[s]) / len(items) for s in names}
    for s in names:
        quota[s] += int(exact[s])
    by_rest = sorted(names, key=lambda s: (-(exact[s] - int(exact[s])), s))
    for s in by_rest[: n - sum(quota.values())]:
        quota[s] += 1
    picked = []
    for s in names:
        members, q = strata[s], min(quota[s], len(strata[s]))
        picked += [members[int((j + 0.5) * len(members) / q)] for j in range(q)]
    return sorted(picked)
