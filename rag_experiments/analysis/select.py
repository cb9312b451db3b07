"""Best-config selection that knows what is noise (docs/select.md). Pure functions, no MLflow.

The *best* config is the one with the best mean of the metric (direction from the registry).
Every other config is paired with it query by query (``stats.paired_delta``: exact McNemar for
binary metrics, sign-flip otherwise), the p-values are Holm-adjusted over the comparisons, and a
config is *tied* with the best unless it is significantly worse (``p_holm < alpha`` and worse on
the metric's direction) by more than the A/A noise floor when one is known. Constraints (serving
latency p95, cost) are applied to the tie set, and the cheapest config that passes is chosen.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import yaml

from rag_experiments.analysis.attribution import noise_floor
from rag_experiments.analysis.stats import holm, paired_delta
from rag_experiments.core.run_record import RunData
from rag_experiments.evaluation.aggregate import mean_ci
from rag_experiments.evaluation.cost import serving_latency_ms

#: The order candidates of the tie set are ranked in; the first is chosen.
TIE_BREAK = (
    "cost_usd (lowest), then mean context size (characters of the top-k chunks handed to the "
    "generator), then serving latency p95, then run name"
)


@dataclass(frozen=True)
class Constraints:
    max_latency_ms: float | None = None  # on the per-query serving latency p95 (retrieval + generation)
    max_cost_usd: float | None = None  # on the run's cost_usd


@dataclass
class Selection:
    """The result: one row per config (``table``), the chosen run id (None: nothing passes)."""

    metric: str
    higher_is_better: bool
    alpha: float
    best: str
    chosen: str | None
    table: pd.DataFrame
    noise: str  # how the noise floor was obtained, or that none was available
    noise_margin: float | None
    tie_break: str = TIE_BREAK
    notes: list[str] = field(default_factory=list)


def context_chars(table: pd.DataFrame, k: int | None) -> float:
    """Mean over queries of the characters of the top-``k`` retrieved chunks (``retrieved`` JSON:
    sum of ``end - start``); NaN when the table has no ``retrieved`` column or k is unknown."""
    if "retrieved" not in table.columns or not k:
        return math.nan
    sizes = [sum(r["end"] - r["start"] for r in json.loads(x)[:k]) for x in table["retrieved"] if x]
    return float(np.mean(sizes)) if sizes else math.nan


def noise_margin(runs: Sequence[RunData], metric: str, seed: int = 0) -> tuple[float | None, str]:
    """``(margin, description)`` of the A/A noise floor from replicated configs (two FINISHED runs
    with the same config_hash): margin = max(|low|, |high|) of the replicate pair's paired-delta
    CI (``attribution.noise_floor``). ``(None, "...none available")`` without replicates."""
    hashes = [r.tags.get("config_hash") for r in runs if r.tags.get("config_hash")]
    if len(hashes) == len(set(hashes)):
        return None, "no A/A noise floor available (no config of the sweep was run twice)"
    nf = noise_floor(runs, runs[0], [metric], seed=seed).iloc[0]
    margin = float(max(abs(nf["low"]), abs(nf["high"])))
    return margin, f"A/A noise floor ±{margin:.4g} ({nf['method']}: {nf['detail']})"


def _compare_to_best(runs: Sequence[RunData], metric: str, hib: bool, best: int, seed: int) -> pd.DataFrame:
    rows = []
    for i, r in enumerate(runs):
        if i == best:
            rows.append(
                {"delta": 0.0, "p": math.nan, "test": "-", "n_pairs": int(r.series(metric).notna().sum())}
            )
            continue
        res = paired_delta(runs[best].series(metric), r.series(metric), metric, seed=seed)
        rows.append({"delta": res.delta, "p": res.p_value, "test": res.test, "n_pairs": res.n_pairs})
    out = pd.DataFrame(rows)
    out["p_holm"] = holm(out["p"].to_numpy())
    # positive = worse than the best, whatever the metric's direction
    out["worse_by"] = -out["delta"] if hib else out["delta"]
    return out


def select_config(
    runs: Sequence[RunData],
    metric: str,
    higher_is_better: bool,
    costs: Sequence[float],
    constraints: Constraints = Constraints(),
    alpha: float = 0.05,
    seed: int = 0,
    replicates: Sequence[RunData] = (),
) -> Selection:
    """Rank ``runs`` (one per config, each with its per-query table) on ``metric`` and choose one.

    mean/CI: ``mean_ci`` of the per-query column; best = argmax (argmin when lower is better);
    delta = mean(config − best) over the paired ids; tie = not (p_holm < alpha and worse_by >
    noise margin (0 when none)); ok = latency p95 ≤ max_latency_ms and cost_usd ≤ max_cost_usd
    (a NaN cost fails a cost limit); chosen = first of tie ∧ ok in :data:`TIE_BREAK` order.
    ``costs``: each run's logged cost_usd (NaN when not logged). ``replicates``: every FINISHED
    run of the sweep, for the A/A noise floor.
    """
    stats = [mean_ci(r.series(metric).to_numpy(), seed=seed) for r in runs]
    means = np.array([s[0] for s in stats])
    if np.all(np.isnan(means)):
        raise ValueError(f"metric {metric}: no config has a value on any query")
    best = int(np.nanargmax(means) if higher_is_better else np.nanargmin(means))
    cmp = _compare_to_best(runs, metric, higher_is_better, best, seed)
    margin, noise = noise_margin(list(replicates) or list(runs), metric, seed)
    significant_worse = (cmp["p_holm"] < alpha) & (cmp["worse_by"] > (margin or 0.0))
    lat = [float(np.percentile(serving_latency_ms(r.table), 95)) if len(r.table) else math.nan for r in runs]
    ctx = [
        context_chars(r.table, int(float(r.params["retriever.k"])) if r.params.get("retriever.k") else None)
        for r in runs
    ]
    c = constraints
    lat_ok = [c.max_latency_ms is None or (x <= c.max_latency_ms) for x in lat]
    cost_ok = [c.max_cost_usd is None or (not math.isnan(x) and x <= c.max_cost_usd) for x in costs]
    table = pd.DataFrame(
        {
            "config": [r.name for r in runs],
            "run_id": [r.run_id for r in runs],
            "mean": means,
            "ci_low": [s[1] for s in stats],
            "ci_high": [s[2] for s in stats],
            "n": [s[3] for s in stats],
            "delta": cmp["delta"],
            "p_holm": cmp["p_holm"],
            "test": cmp["test"],
            "tie": ~significant_worse,
            "latency_p95_ms": lat,
            "cost_usd": list(costs),
            "context_chars": ctx,
            "ok": [a and b for a, b in zip(lat_ok, cost_ok, strict=True)],
        }
    )
    key = table.assign(
        _c=table["cost_usd"].fillna(np.inf),
        _x=table["context_chars"].fillna(np.inf),
        _l=table["latency_p95_ms"],
    )
    pool = key[key["tie"] & key["ok"]].sort_values(["_c", "_x", "_l", "config"], kind="stable")
    chosen = None if pool.empty else str(pool["run_id"].iloc[0])
    table["chosen"] = table["run_id"] == chosen
    notes = []
    if chosen is None:
        notes.append("no config is both tied with the best and within the constraints")
    return Selection(
        metric, higher_is_better, alpha, runs[best].run_id, chosen, table, noise, margin, notes=notes
    )


def _literal(node):
    """Every string in ``node`` escaped for OmegaConf (``sanitize.omegaconf_literal``)."""
    from rag_experiments.core.sanitize import omegaconf_literal

    if isinstance(node, dict):
        return {k: _literal(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_literal(v) for v in node]
    return omegaconf_literal(node) if isinstance(node, str) else node


def runnable_config(config_yaml: str, primary_yaml: str) -> str:
    """A primary config that ``python -m rag_experiments.sweep --config-dir DIR --config-name NAME``
    runs unchanged: the run's resolved ``config.yaml`` without ``hydra``, a ``defaults`` list with
    only the primary config's ``override hydra/...`` entries and ``_self_`` (so no group default
    is composed on top of the resolved groups), and the primary config's ``hydra`` section."""
    cfg = _literal(yaml.safe_load(config_yaml) or {})  # a resolved value's "${" is text, not a reference
    cfg.pop("hydra", None)
    cfg.pop("defaults", None)
    primary = yaml.safe_load(primary_yaml) or {}
    defaults = [
        d
        for d in primary.get("defaults", [])
        if isinstance(d, dict) and str(next(iter(d))).startswith("override hydra/")
    ]
    out = {"defaults": [*defaults, "_self_"], **cfg}
    if "hydra" in primary:
        out["hydra"] = primary["hydra"]
    return yaml.safe_dump(out, sort_keys=False, allow_unicode=True)
