"""The order run metrics are logged in, which is the order MLflow's run page lists them.

MLflow 3.17's run page (``RunViewMetricsTable``) shows the run's latest metrics in the order the
store returns them, with no sorting of its own (only a search box and a split of ``system/``
metrics); the SQL store returns them in insertion order. So logging in a reading order is what
puts the headline metrics first. Names are unchanged; see ``docs/tracing.md``.
"""

from __future__ import annotations

from collections.abc import Iterable

from rag_experiments.evaluation.labels import FAILURE_LABELS

# Forms of a key, in the order their groups are listed after the headline block.
_FORM_RANK = {"mean": 1, "ci_low": 2, "ci_high": 2, "n_scored": 3, "by_tag": 4}


def _sort_key(key: str) -> tuple:
    """(group, tag, headline rank, registry position, k/B/label, is ci_high, key) of a logged metric key.

    Group 0 is the mean of a headline metric (``registry.MetricSpec.headline``), 1 other means
    and counts, 2 the CI bounds, 3 ``n_scored/``, 4 ``by_tag/``, 5 keys the registry does not know.
    """
    from rag_experiments.evaluation import registry

    got = registry.parse(key)
    if got is None:
        return (5, "", 0, 0, (), False, key)
    spec, params = got
    form = params.get("form", "mean")
    group = _FORM_RANK.get(form, 5)
    if group == 1 and spec.headline is not None:
        group = 0
    head = spec.headline if spec.headline is not None else 999
    position = registry.REGISTRY.index(spec)
    nums = tuple(int(params[p]) for p in ("k", "B") if p in params)
    if "label" in params:  # rates in the summary's label order
        nums += (FAILURE_LABELS.index(params["label"]),)
    # by_tag: one block per tag, each in headline order; CI bounds: low before high
    tag = params.get("tag", "") if group == 4 else ""
    return (group, tag, head, position, nums, form == "ci_high", key)


def metric_order(keys: Iterable[str]) -> list[str]:
    """Keys in reading order: headline means (hit@k at every k, evidence recall, MRR, context
    precision, nDCG, faithfulness, answer relevance, correctness, label rates), then the other
    means and counts, the CI bounds, ``n_scored/`` and ``by_tag/``."""
    return sorted(keys, key=_sort_key)
