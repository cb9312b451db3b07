"""Best-config selection that knows what is noise (docs/select.md). Pure functions, no MLflow.

The *best* config is the one with the best mean of the metric (direction from the registry).
Every other config is tested against it with ``gate``'s paired non-inferiority test
(``analysis.gate.non_inferiority_family``: the one-sided bound of config − best (the test of the
metric's declared value type, ``stats.KIND_TESTS``: score test on binary and proportion metrics,
paired bootstrap on continuous ones) must
clear the same margin, ``max(0.01, 1/sqrt(n))`` unless given, Holm over the configs). A config is
*tied* with the best only when it is **shown non-inferior** — failing to show a difference is not
evidence of equivalence — so the chosen config passes ``gate`` against the best by construction.
The two-sided paired test (``stats.paired_delta``, Holm) still marks configs shown *worse*; the
rest (neither shown non-inferior nor worse) are *indistinguishable*: the eval set cannot tell.
When the MDE of the test exceeds the margin or most configs are indistinguishable the selection
is *underpowered* and the best mean is chosen instead of the cheapest tied config. Constraints
(serving latency p95, cost) apply either way. Configs with the same per-query values
(``stats.table_key``: duplicates such as ``retriever.k=3,5`` with ``generator=none``) are one config:
counted once in the Holm families and in the tie count. :func:`tie_family` is the one tie count
(select, report and gate's family), with :data:`TIE_RESAMPLES` and the caller's seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import yaml

from rag_experiments.analysis.attribution import noise_floor
from rag_experiments.analysis.gate import GateResult, non_inferiority_family
from rag_experiments.analysis.power import WIDE_DEFAULT_MARGIN, Underpowered, n_for_margin  # noqa: F401  (re-exported)
from rag_experiments.analysis.stats import holm, pair, paired_delta, table_key
from rag_experiments.core.query_table import cell
from rag_experiments.core.run_record import RunData
from rag_experiments.evaluation.aggregate import mean_ci
from rag_experiments.evaluation.cost import serving_latency_ms

#: The order candidates of the tie set are ranked in; the first is chosen.
TIE_BREAK = (
    "cost_usd (lowest), then mean context size (characters of the top-k chunks handed to the "
    "generator), then serving latency p95, then run name"
)
#: Resamples of every tie count (select's default ``--resamples``, report): one count everywhere.
TIE_RESAMPLES = 9999
#: When underpowered: the best mean within the constraints (the cheapest tie is not evidence).
UNDERPOWERED_PICK = "best mean (underpowered: the cheapest tie would not be evidence)"


@dataclass(frozen=True)
class Constraints:
    max_latency_ms: float | None = None  # on the per-query serving latency p95 (retrieval + generation)
    max_cost_usd: float | None = None  # on the run's cost_usd


@dataclass
class Selection:
    """The result: one row per config (``table``), the chosen run id (None: nothing passes).

    ``underpowered`` is None when the eval set separates the candidates; otherwise why not
    (printed first by the CLI, logged as the ``select.underpowered`` tag)."""

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
    margin: float = math.nan  # the non-inferiority margin (median over the comparisons)
    underpowered: Underpowered | None = None
    lead: list[str] = field(default_factory=list)  # printed first: the metric's choice, overrides
    duplicates: list[list[str]] = field(default_factory=list)  # configs with the same per-query values
    default_margin: bool = True  # gate's max(0.01, 1/√n), no --margin

    def tags(self) -> dict[str, str]:
        """What the CLI logs on the sweep's parent run."""
        u = self.underpowered
        return {
            "select.metric": self.metric,
            "select.underpowered": "true" if u else "false",
            "select.chosen": self.chosen or "",
            **({"select.underpowered_reason": u.message()[:5000]} if u else {}),
        }


def context_chars(table: pd.DataFrame, k: int | None) -> float:
    """Mean over queries of the characters of the top-``k`` retrieved chunks (``retrieved``:
    sum of ``end - start``); NaN when the table has no ``retrieved`` column or k is unknown."""
    if "retrieved" not in table.columns or not k:
        return math.nan
    sizes = [sum(r["end"] - r["start"] for r in cell("retrieved", x)[:k]) for x in table["retrieved"] if x is not None]
    return float(np.mean(sizes)) if sizes else math.nan


def noise_margin(runs: Sequence[RunData], metric: str, seed: int = 0) -> tuple[float | None, str]:
    """``(margin, description)`` of the A/A noise floor from replicated configs (two FINISHED runs
    with the same config_hash): margin = max(|low|, |high|) of the replicate pair's paired-delta
    CI (``attribution.noise_floor``). ``(None, "...none available")`` without replicates."""
    hashes = [r.tags.get("config_hash") for r in runs if r.tags.get("config_hash")]
    if len(hashes) == len(set(hashes)):
        return None, (
            "no A/A noise floor available (no config of the sweep was run twice; the split-half range "
            "compare --sweep shows instead is the unpaired noise of half the eval set, not a re-run)"
        )
    nf = noise_floor(runs, runs[0], [metric], seed=seed).iloc[0]
    margin = float(max(abs(nf["low"]), abs(nf["high"])))
    return margin, f"A/A noise floor ±{margin:.4g} ({nf['method']}: {nf['detail']})"


def _compare_to_best(
    runs: Sequence[RunData],
    metric: str,
    hib: bool,
    best: int,
    seed: int,
    kind: str | None,
    keys: list[bytes],
    n_resamples: int,
) -> pd.DataFrame:
    """Two-sided paired test of every config against the best (``paired_delta``), Holm over them
    (duplicates once; a duplicate of the best is the best)."""
    rows = []
    for i, r in enumerate(runs):
        if i == best or keys[i] == keys[best]:
            rows.append(
                {"delta": 0.0, "p": math.nan, "test": "-", "n_pairs": int(r.series(metric).notna().sum())}
            )
            continue
        res = paired_delta(
            runs[best].series(metric), r.series(metric), metric, seed=seed, n_resamples=n_resamples, kind=kind
        )
        rows.append({"delta": res.delta, "p": res.p_value, "test": res.test, "n_pairs": res.n_pairs})
    out = pd.DataFrame(rows)
    out["p_holm"] = holm(out["p"].to_numpy(), keys)
    # positive = worse than the best, whatever the metric's direction
    out["worse_by"] = -out["delta"] if hib else out["delta"]
    return out


def _paired_var(a: pd.Series, b: pd.Series) -> float:
    xa, xb, _ = pair(a, b)
    return float(np.var(xb - xa, ddof=1)) if xa.size > 1 else math.nan


def underpowered(
    ni: Sequence[GateResult],
    worse: Sequence[bool],
    paired_vars: Sequence[float],
    alpha: float,
    default_margin: bool = False,
    keys: Sequence[bytes] | None = None,
    compared: int | None = None,
) -> Underpowered | None:
    """Whether the eval set separates the candidates from the best; None when it does.

    indistinguishable = not shown non-inferior (``ni[i].passed``) and not shown worse
    (``worse[i]``); MDE, margin, n = medians over the comparisons. Underpowered iff
    MDE > margin or indistinguishable > half the comparisons. n_needed = ``n_for_margin(margin,
    median paired variance, alpha, family = the comparisons)``: the queries at which the one-sided
    test at Holm's α/m reaches the margin with 80 % power. With gate's default margin
    (``default_margin``) wider than :data:`WIDE_DEFAULT_MARGIN` the sweep is underpowered too (a
    tie within ±0.35 at n = 8 is no evidence of equivalence), and n_needed is for
    :data:`WIDE_DEFAULT_MARGIN`, at least ⌈1/0.15²⌉ = 45 (where the default margin gets there).
    ``keys`` (``stats.table_key`` per comparison): duplicate configs count once, and the text says
    so against ``compared`` (every config compared with the best, as the tie set counts them).
    """
    if keys is not None:  # one comparison per distinct config
        first = sorted({k: i for i, k in reversed(list(enumerate(keys)))}.values())
        ni, worse, paired_vars = (
            [ni[i] for i in first],
            [worse[i] for i in first],
            [paired_vars[i] for i in first],
        )
    if not ni:
        return None
    k = int(sum(not r.passed and not w for r, w in zip(ni, worse, strict=True)))
    mdes = np.array([r.mde for r in ni], float)
    mde = float(np.nanmedian(mdes)) if np.isfinite(mdes).any() else math.nan
    margin = float(np.median([r.margin for r in ni]))
    n = int(np.median([r.n_pairs for r in ni]))
    reasons = []
    if mde > margin:
        reasons.append(f"MDE {mde:.3g} > margin {margin:.3g}")
    if k > len(ni) / 2:
        reasons.append(f"{k} of {len(ni)} {{configs}} indistinguishable from the best")
    wide = default_margin and margin > WIDE_DEFAULT_MARGIN
    if wide:
        reasons.append(
            f"the default margin 1/√n = {margin:.3g} is wider than {WIDE_DEFAULT_MARGIN:g}: a tie says little"
        )
    if not reasons:
        return None
    v = np.array(paired_vars, float)
    var = float(np.nanmedian(v)) if np.isfinite(v).any() else math.nan
    target = WIDE_DEFAULT_MARGIN if wide else margin
    needed = n_for_margin(target, var, alpha, family=len(ni), default_rule=wide)
    u = Underpowered(
        k, len(ni), mde, margin, n, needed, (), WIDE_DEFAULT_MARGIN if wide else None,
        family=len(ni), no_variance=var == 0, compared=compared,
    )  # fmt: skip
    return replace(u, reasons=tuple(r.replace("{configs}", u.configs()) for r in reasons))


def select_config(
    runs: Sequence[RunData],
    metric: str,
    higher_is_better: bool,
    costs: Sequence[float],
    constraints: Constraints = Constraints(),
    alpha: float = 0.05,
    seed: int = 0,
    replicates: Sequence[RunData] = (),
    margin: float | None = None,
    n_resamples: int = TIE_RESAMPLES,
    kind: str | None = None,
) -> Selection:
    """Rank ``runs`` (one per config, each with its per-query table) on ``metric`` and choose one.

    mean/CI: ``mean_ci`` of the per-query column; best = argmax (argmin when lower is better);
    delta = mean(config − best) over the paired ids; tie = best, or shown non-inferior to the best
    (``gate.non_inferiority_family``: one-sided (1 − alpha) bound of config − best past
    −margin on the metric's worse side, Holm over the m − 1 configs; ``margin`` None: gate's
    default ``max(0.01, 1/sqrt(n_pairs))``); worse = two-sided paired p_holm < alpha and worse on
    the metric's direction; ok = latency p95 ≤ max_latency_ms and cost_usd ≤ max_cost_usd (a NaN
    cost fails a cost limit). chosen = first of tie ∧ ok in :data:`TIE_BREAK` order, or, when
    :func:`underpowered`, the best mean of tie ∧ ok. ``costs``: each run's logged cost_usd (NaN
    when not logged). ``replicates``: every FINISHED run of the sweep, for the A/A noise floor
    (reported, not deciding). ``seed``, ``n_resamples``, ``alpha`` and ``margin`` are gate's, so
    ``gate --baseline BEST --candidate CHOSEN --metric METRIC`` passes; ``kind``: stats.value_kind.
    """
    stats = [mean_ci(r.series(metric).to_numpy(), seed=seed) for r in runs]
    means = np.array([s[0] for s in stats])
    if np.all(np.isnan(means)):
        raise ValueError(f"metric {metric}: no config has a value on any query")
    best = int(np.nanargmax(means) if higher_is_better else np.nanargmin(means))
    cmp, by_run, power = tie_family(
        runs, metric, higher_is_better, best, margin, alpha, seed, n_resamples, kind
    )
    dups = duplicate_groups(runs, metric)
    ni = list(by_run.values())
    nf_margin, noise = noise_margin(list(replicates) or list(runs), metric, seed)

    table = _selection_table(runs, means, stats, cmp, by_run, best, _serving(runs, costs, constraints))
    chosen = _choose(table, higher_is_better, power is not None)
    table["chosen"] = table["run_id"] == chosen
    notes = [] if chosen else ["no config is both tied with the best and within the constraints"]
    notes += [duplicates_note(dups, metric)] if dups else []
    return Selection(
        metric,
        higher_is_better,
        alpha,
        runs[best].run_id,
        chosen,
        table,
        noise,
        nf_margin,
        tie_break=UNDERPOWERED_PICK if power else TIE_BREAK,
        notes=notes,
        margin=float(np.median([r.margin for r in ni])) if ni else math.nan,
        underpowered=power,
        duplicates=dups,
        default_margin=margin is None,
    )


def _selection_table(runs, means, stats, cmp, by_run: dict, best: int, serving: dict) -> pd.DataFrame:
    """select's table: per config its mean and CI, the paired test against the best, gate's
    non-inferiority figures against the best (``by_run``), tie, and the serving columns."""

    def ni_col(attr: str) -> list[float]:  # gate's figures of each config against the best
        return [getattr(by_run[i], attr) if i in by_run else math.nan for i in range(len(runs))]

    return pd.DataFrame(
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
            "ni_bound": ni_col("bound"),  # config − best on the worse side
            "ni_margin": ni_col("margin"),
            "ni_p_holm": ni_col("p_holm"),
            "ni_test": [by_run[i].test if i in by_run else "-" for i in range(len(runs))],
            "ni_mde": ni_col("mde"),
            "worse": cmp["worse"],
            "tie": [i == best or by_run[i].passed for i in range(len(runs))],
            **serving,
        }
    )


def duplicate_groups(runs: Sequence[RunData], metric: str) -> list[list[str]]:
    """The names of configs with the same per-query ``metric`` (``stats.table_key``), groups of 2+."""
    groups: dict[bytes, list[str]] = {}
    for r in runs:
        groups.setdefault(table_key(r.series(metric)), []).append(r.name)
    return [g for g in groups.values() if len(g) > 1]


def duplicates_note(dups: list[list[str]], metric: str) -> str:
    return (
        f"{sum(len(g) - 1 for g in dups)} config(s) have the same per-query {metric} as another "
        f"({'; '.join(' = '.join(g) for g in dups)}): each group counts once in the Holm families "
        "and the tie count"
    )


def tie_family(
    runs: Sequence[RunData],
    metric: str,
    hib: bool,
    best: int,
    margin: float | None,
    alpha: float,
    seed: int,
    n_resamples: int = TIE_RESAMPLES,
    kind: str | None = None,
) -> tuple[pd.DataFrame, dict[int, GateResult], Underpowered | None]:
    """(two-sided tests with a ``worse`` column, {config index: gate's non-inferiority result},
    underpowered verdict) of every other config against the best (index ``best``): the one tie
    count of select, report and gate, duplicates once (``stats.table_key``). The tie set is the
    best and every config whose result passed."""
    keys = [table_key(r.series(metric)) for r in runs]
    cmp = _compare_to_best(runs, metric, hib, best, seed, kind, keys, n_resamples)
    others = [i for i in range(len(runs)) if i != best]
    ni = non_inferiority_family(
        runs[best].series(metric),
        [runs[i].series(metric) for i in others],
        margin=margin,
        alpha=alpha,
        seed=seed,
        n_resamples=n_resamples,
        metric=metric,
        higher_is_better=hib,
        kind=kind,
    )
    cmp["worse"] = (cmp["p_holm"] < alpha) & (cmp["worse_by"] > 0)
    worse = cmp["worse"].to_numpy()
    distinct = [
        j for j, i in enumerate(others) if keys[i] != keys[best]
    ]  # a duplicate of the best is the best
    power = underpowered(
        [ni[j] for j in distinct],
        [bool(worse[others[j]]) for j in distinct],
        [_paired_var(runs[best].series(metric), runs[others[j]].series(metric)) for j in distinct],
        alpha,
        default_margin=margin is None,
        keys=[keys[others[j]] for j in distinct],
        compared=len(others),
    )
    return cmp, dict(zip(others, ni, strict=True)), power


def _serving(runs: Sequence[RunData], costs: Sequence[float], c: Constraints) -> dict[str, list]:
    """Columns latency_p95_ms, cost_usd, context_chars and ok (within both limits; a NaN cost fails
    a cost limit)."""
    lat = [float(np.percentile(serving_latency_ms(r.table), 95)) if len(r.table) else math.nan for r in runs]
    ctx = [
        context_chars(r.table, int(float(r.params["retriever.k"])) if r.params.get("retriever.k") else None)
        for r in runs
    ]
    lat_ok = [c.max_latency_ms is None or (x <= c.max_latency_ms) for x in lat]
    cost_ok = [c.max_cost_usd is None or (not math.isnan(x) and x <= c.max_cost_usd) for x in costs]
    return {
        "latency_p95_ms": lat,
        "cost_usd": list(costs),
        "context_chars": ctx,
        "ok": [a and b for a, b in zip(lat_ok, cost_ok, strict=True)],
    }


def _choose(table: pd.DataFrame, higher_is_better: bool, underpowered: bool) -> str | None:
    """The run id of the first tied config within the constraints: in :data:`TIE_BREAK` order, or
    by best mean when underpowered; None when there is none."""
    key = table.assign(
        _c=table["cost_usd"].fillna(np.inf),
        _x=table["context_chars"].fillna(np.inf),
        _l=table["latency_p95_ms"],
        _m=-table["mean"] if higher_is_better else table["mean"],
    )
    order = ["_m", "config"] if underpowered else ["_c", "_x", "_l", "config"]
    pool = key[key["tie"] & key["ok"]].sort_values(order, kind="stable")
    return None if pool.empty else str(pool["run_id"].iloc[0])


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
