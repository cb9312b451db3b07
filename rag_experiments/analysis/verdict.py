"""The verdict of a comparison, computed once; every surface renders it (docs/select.md, docs/ci.md).

``gate`` (console and ``--summary-md``), ``select`` and ``report`` used to work out their
conclusion each on its own, and where the inputs were a little unusual they disagreed (the PR
summary said "every MDE is within its margin" under a console UNDERPOWERED; select and report
counted ties with different resamples). Here a comparison becomes one frozen object:

- the question, the runs and their pairing;
- the metric and why it was chosen (:class:`MetricChoice`), its comparability and the substitute
  (``analysis.comparability.Comparability``);
- the test and why (:class:`TestChoice`), the estimate and its one-sided bound (:class:`Estimate`);
- margin, MDE, n and UNDERPOWERED (:class:`Power`);
- for a pick, the tie set with its Holm family (:class:`TieSet`) and the pick at every logged
  token budget (:class:`BudgetPick`);
- the caveats (:class:`Caveat`), in one order (:data:`CAVEAT_ORDER`): a comparison the user
  forced across what is not comparable first, UNDERPOWERED next, then the budget sensitivity,
  human labels, the judges, the eval set and the rest.

Renderers read these fields and decide nothing; ``tests/test_verdict_surfaces.py`` checks that
every surface shows the same metric, verdict and caveats. Pure: no MLflow, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from rag_experiments.analysis.checks import CheckFailure
from rag_experiments.analysis.comparability import Comparability, comparability, logged_budgets
from rag_experiments.analysis.correctness_view import PREFIX as CORRECTNESS_PREFIX
from rag_experiments.analysis.correctness_view import VIEWS, CorrectnessChoice, correctness_choice
from rag_experiments.analysis.gate import GateResult, gate_passed, gate_power
from rag_experiments.analysis.power import Underpowered
from rag_experiments.analysis.select import Constraints, Selection, select_config
from rag_experiments.core.run_record import RunData

#: The kinds of caveat, in the order every surface says them.
CAVEAT_ORDER = ("override", "underpowered", "budget", "human", "judge", "evalset", "metric", "note")

#: Why each test: the name every surface prints, and the reason.
TESTS = {
    "score": (
        "score test (Tango's, binary / proportion metrics)",
        "the metric is declared binary or proportion (the registry's value_type, never the values "
        "seen): a score test holds the level there (analysis.stats.KIND_TESTS)",
    ),
    "bootstrap": (
        "paired percentile bootstrap",
        "the metric is declared continuous: a seeded paired bootstrap (analysis.stats.KIND_TESTS)",
    ),
}


@dataclass(frozen=True)
class Caveat:
    """One thing every surface says before the figures: ``kind`` (one of :data:`CAVEAT_ORDER`)
    decides where, ``text`` is what (plain text; each surface escapes it for its format)."""

    kind: str
    text: str


def ordered(caveats: Iterable[Caveat]) -> tuple[Caveat, ...]:
    """``caveats`` once each (by text), in :data:`CAVEAT_ORDER` (stable within a kind)."""
    rank = {k: i for i, k in enumerate(CAVEAT_ORDER)}
    seen: dict[str, Caveat] = {}
    for c in caveats:
        seen.setdefault(c.text, c)
    return tuple(sorted(seen.values(), key=lambda c: rank.get(c.kind, len(rank))))


def note_caveats(notes: Iterable[str]) -> list[Caveat]:
    """The notes the checks return (``tracking.judge_runs``, ``tracking.runs``,
    ``analysis.comparability``) as caveats, by what they say: the ``--allow-incomparable`` and
    corpus overrides, the judges, the eval set, a replaced default metric, the rest."""
    out = []
    for n in notes:
        if n.startswith("note: --allow-incomparable"):
            kind = "override"
        elif n.startswith("UNDERPOWERED"):
            kind = "underpowered"
        elif n.startswith("note: judges differ"):
            kind = "judge"
        elif "evalset_digest" in n or "eval set" in n:
            kind = "evalset"
        elif n.startswith("default metric "):
            kind = "metric"
        elif n.startswith(("UNVALIDATED", "human-corrected", "no human labels", CORRECTNESS_PREFIX)):
            kind = "human"
        else:
            kind = "note"
        out.append(Caveat(kind, n))
    return out


@dataclass(frozen=True)
class MetricChoice:
    metric: str
    why: str
    higher_is_better: bool


@dataclass(frozen=True)
class TestChoice:
    name: str  # "score" or "bootstrap" (analysis.gate)
    label: str
    why: str

    @classmethod
    def of(cls, test: str) -> TestChoice:
        label, why = TESTS.get(test, (test, "the test analysis.gate chose for the metric"))
        return cls(test, label, why)


@dataclass(frozen=True)
class Estimate:
    """Candidate − baseline, and its one-sided (1 − alpha) bound on the metric's worse side."""

    baseline: float
    candidate: float
    delta: float
    bound: float
    higher_is_better: bool
    alpha: float


@dataclass(frozen=True)
class Power:
    margin: float
    default_margin: bool  # gate's max(0.01, 1/√n), not given by the user
    mde: float
    n: int
    underpowered: Underpowered | None


@dataclass(frozen=True)
class MetricVerdict:
    """One gated metric: everything ``gate`` decided about it."""

    choice: MetricChoice
    comparability: Comparability
    test: TestChoice
    estimate: Estimate
    power: Power
    passed: bool
    result: GateResult  # the figures as computed (p-values, variance) for tables that show them

    @property
    def metric(self) -> str:
        return self.choice.metric

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"


@dataclass(frozen=True)
class GateVerdict:
    """``gate --baseline A --candidate B``: one :class:`MetricVerdict` per gated metric."""

    question: str
    baseline: str  # how the runs are named (RunData.label)
    candidate: str
    pairing: str
    metrics: tuple[MetricVerdict, ...]
    caveats: tuple[Caveat, ...]
    alpha: float
    # the eval items' critical checks the candidate fails (analysis.checks): each fails the gate
    # whatever the metrics, and every surface lists them first
    critical: tuple[CheckFailure, ...] = ()
    # which correctness view is better validated, when a correctness view is gated (its line is a caveat)
    correctness: CorrectnessChoice | None = None

    @property
    def verdict(self) -> str:
        return "PASS" if gate_passed([m.result for m in self.metrics], self.critical) else "FAIL"

    @property
    def underpowered(self) -> bool:
        return any(c.kind == "underpowered" for c in self.caveats)

    def caveat_lines(self) -> list[str]:
        return [c.text for c in self.caveats]


def _views(metrics: Sequence[str], runs: Sequence[RunData]) -> tuple[CorrectnessChoice | None, list[Caveat]]:
    """The correctness views' choice (``analysis.correctness_view``) when a correctness view is
    among ``metrics``, and its line as a caveat per view used."""
    used = [m for m in dict.fromkeys(metrics) if m in VIEWS]
    c = correctness_choice(runs) if used else None
    return c, [Caveat("human", c.line(m)) for m in used] if c else []


def gate_verdict(
    baseline: RunData,
    candidate: RunData,
    results: Sequence[GateResult],
    notes: Iterable[str],
    default_margin: Mapping[str, bool],
    whys: Mapping[str, str],
    human: Iterable[str] = (),
    alpha: float = 0.05,
    critical: Sequence[CheckFailure] = (),
) -> GateVerdict:
    """The gate's verdict from what ``analysis.gate.non_inferiority`` computed per metric
    (``results``), the checks' ``notes`` and the label lines (``human``); ``default_margin``: per
    metric, whether gate's default margin was used; ``whys``: why each metric is gated.
    UNDERPOWERED per metric is ``analysis.gate.gate_power`` (the rule select and plan print)."""
    mvs, caveats = [], [*note_caveats(notes), *note_caveats(human)]
    views = _views([r.metric for r in results], [baseline, candidate])
    caveats += views[1]
    for r in results:
        under = gate_power(r, default_margin.get(r.metric, False))
        if under:
            caveats.append(Caveat("underpowered", under.gate_message(r.metric)))
        mvs.append(
            MetricVerdict(
                MetricChoice(r.metric, whys.get(r.metric, "named with --metric"), r.higher_is_better),
                comparability(r.metric, [baseline, candidate]),
                TestChoice.of(r.test),
                Estimate(r.baseline, r.candidate, r.delta, r.bound, r.higher_is_better, r.alpha),
                Power(r.margin, default_margin.get(r.metric, False), r.mde, r.n_pairs, under),
                r.passed,
                r,
            )
        )
    n = max((r.n_pairs for r in results), default=0)
    return GateVerdict(
        question=f"is candidate {candidate.label} no worse than baseline {baseline.label}?",
        baseline=baseline.label,
        candidate=candidate.label,
        pairing=f"paired by eval item id: {n} ids with a value in both runs",
        metrics=tuple(mvs),
        caveats=ordered(caveats),
        alpha=alpha,
        critical=tuple(critical),
        correctness=views[0],
    )


# --------------------------------------------------------------------------------------------- a pick


@dataclass(frozen=True)
class TieSet:
    """The configs shown non-inferior to the best (the best included), out of the Holm family of
    comparisons with the best; the rest are shown worse or indistinguishable."""

    members: tuple[str, ...]
    family: int  # comparisons with the best: the Holm family
    worse: int
    indistinguishable: int

    def text(self) -> str:
        return (
            f"{len(self.members) - 1} of {self.family} configs tied with the best (shown non-inferior, "
            f"Holm over {self.family}); {self.worse} shown worse; {self.indistinguishable} indistinguishable"
        )


@dataclass(frozen=True)
class BudgetPick:
    budget: int
    metric: str
    pick: str  # the config chosen at this budget (the best when none is chosen)


def budget_line(picks: Sequence[BudgetPick]) -> tuple[bool, str]:
    """(sensitive, the line): ``budget-sensitive: at 256 tokens X, at 512 and 1024 Y`` when the pick
    changes with the budget, else the one pick at every budget."""
    groups: list[tuple[list[int], str]] = []
    for p in picks:
        if groups and groups[-1][1] == p.pick:
            groups[-1][0].append(p.budget)
        else:
            groups.append(([p.budget], p.pick))

    def budgets(bs: list[int]) -> str:
        return str(bs[0]) if len(bs) == 1 else ", ".join(map(str, bs[:-1])) + f" and {bs[-1]}"

    if len({g[1] for g in groups}) > 1:
        return True, "budget-sensitive: " + ", ".join(
            f"at {budgets(bs)} tokens {pick}" for bs, pick in groups
        )
    bs = [p.budget for p in picks]
    return False, f"the pick is the same at every logged budget ({budgets(bs)} tokens): {picks[0].pick}"


@dataclass(frozen=True)
class SelectVerdict:
    """``select`` over a sweep's configs (and what ``report`` says about the same configs)."""

    question: str
    runs: tuple[str, ...]
    pairing: str
    choice: MetricChoice
    comparability: Comparability
    tests: tuple[TestChoice, ...]  # the tests of the comparisons with the best, once each
    best: str
    chosen: str | None
    tie: TieSet
    power: Power
    budgets: tuple[BudgetPick, ...]
    budget_text: str  # "" without budgets
    caveats: tuple[Caveat, ...]
    selection: Selection
    correctness: CorrectnessChoice | None = None  # the better-validated correctness view (a caveat)

    @property
    def underpowered(self) -> bool:
        return self.power.underpowered is not None

    def caveat_lines(self) -> list[str]:
        return [c.text for c in self.caveats]

    def tags(self) -> dict[str, str]:
        """What ``select`` logs on the sweep's parent run: the selection's tags, the caveats'
        kinds in order and the pick at every budget."""
        return {
            **self.selection.tags(),
            "select.caveats": ",".join(c.kind for c in self.caveats),
            **({"select.budgets": self.budget_text[:5000]} if self.budget_text else {}),
            **(
                {
                    "select.correctness_view": self.correctness.metric,
                    "select.correctness_why": self.correctness.line(self.choice.metric)[:5000],
                }
                if self.correctness
                else {}
            ),  # fmt: skip
        }


def with_caveats(v: SelectVerdict, more: Iterable[Caveat]) -> SelectVerdict:
    """``v`` with ``more`` caveats, in :data:`CAVEAT_ORDER` (a human-label contradiction of the pick
    is known only once the pick is)."""
    return replace(v, caveats=ordered([*v.caveats, *more]))


def _name(runs: Sequence[RunData], run_id: str | None) -> str | None:
    return next((r.name for r in runs if r.run_id == run_id), run_id)


def budget_picks(
    runs: Sequence[RunData], metric: str, pick: Callable[[str], Selection]
) -> tuple[BudgetPick, ...]:
    """The pick (``pick(metric_at_B)``: select's rule, same margin, seed and resamples) at every
    ``evidence_recall_at_{B}tok`` every run logged, when ``metric`` is an equal-budget metric."""
    if not (metric.startswith("evidence_recall_at_") and metric.endswith("tok")):
        return ()
    common = set.intersection(*(set(r.table.columns) for r in runs)) if runs else set()
    out = []
    for b in logged_budgets(common):
        key = f"evidence_recall_at_{b}tok"
        if key not in common:
            continue
        sel = pick(key)
        out.append(BudgetPick(b, key, _name(runs, sel.chosen or sel.best) or "?"))
    return tuple(out) if len(out) > 1 else ()


def select_verdict(
    runs: Sequence[RunData],
    sel: Selection,
    why: str,
    notes: Iterable[str] = (),
    human: Iterable[str] = (),
    budgets: Sequence[BudgetPick] = (),
) -> SelectVerdict:
    """The pick's verdict from ``analysis.select.select_config``'s ``sel`` over ``runs``, the
    checks' ``notes``, the label lines (``human``) and the pick at every budget
    (:func:`budget_picks`)."""
    t = sel.table
    others = t[t["run_id"] != sel.best]
    tie = TieSet(
        tuple(t.loc[t["tie"], "config"]),
        len(others),
        int(others["worse"].sum()),
        int((~others["tie"] & ~others["worse"]).sum()),
    )
    caveats = [*note_caveats(notes), *note_caveats(human)]
    views = _views([sel.metric], runs)
    caveats += views[1]
    if sel.underpowered:
        caveats.append(Caveat("underpowered", sel.underpowered.message()))
    sensitive, text = budget_line(budgets) if budgets else (False, "")
    if sensitive:
        caveats.append(Caveat("budget", text))
    mdes = others["ni_mde"].dropna()
    power = Power(
        sel.margin,
        sel.default_margin,
        float(mdes.median()) if len(mdes) else math.nan,
        int(t["n"].median()) if len(t) else 0,
        sel.underpowered,
    )
    tests = tuple(TestChoice.of(x) for x in dict.fromkeys(others["ni_test"]))
    return SelectVerdict(
        question=f"which of {len(runs)} configs to keep, on {sel.metric}?",
        runs=tuple(r.name for r in runs),
        pairing="every config paired with the best by eval item id",
        choice=MetricChoice(sel.metric, why, sel.higher_is_better),
        comparability=comparability(sel.metric, runs),
        tests=tests,
        best=_name(runs, sel.best) or sel.best,
        chosen=_name(runs, sel.chosen),
        tie=tie,
        power=power,
        budgets=tuple(budgets),
        budget_text=text,
        caveats=ordered(caveats),
        selection=sel,
        correctness=views[0],
    )


def pick_verdict(
    runs: Sequence[RunData],
    metric: str,
    why: str,
    higher_is_better: Callable[[str], bool],
    costs: Sequence[float] | None = None,
    constraints: Constraints | None = None,
    alpha: float = 0.05,
    seed: int = 0,
    margin: float | None = None,
    n_resamples: int = 9999,
    replicates: Sequence[RunData] = (),
    notes: Iterable[str] = (),
    human: Iterable[str] = (),
) -> SelectVerdict:
    """``select``'s verdict over ``runs`` on ``metric`` (``analysis.select.select_config`` with its
    defaults: margin, seed, 9999 resamples), with the pick at every logged budget: what ``select``
    prints and ``report`` shows, so both count the same ties. ``costs``: each run's ``cost_usd``
    (default: its logged metric, NaN when none)."""
    costs = list(costs) if costs is not None else [float(r.metrics.get("cost_usd", math.nan)) for r in runs]

    def pick(m: str) -> Selection:
        return select_config(
            runs, m, higher_is_better(m), costs, constraints or Constraints(), alpha=alpha, seed=seed,
            replicates=replicates, margin=margin, n_resamples=n_resamples,
        )  # fmt: skip

    sel = pick(metric)
    return select_verdict(runs, sel, why, notes, human, budget_picks(runs, metric, pick))
