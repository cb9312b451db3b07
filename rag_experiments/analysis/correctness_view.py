"""Which correctness a verdict reads: key-fact string match or the judge model's reading (issue 45).

A run with a judge model logs two views of one question, "is the answer correct?":
``correctness`` (the key facts matched as strings) and ``correctness_judged`` (the judge reads each
fact as supported, contradicted or absent). Which to trust is itself a measurement, made on the
same answers: the correctness card (``spotcheck score-answers``) labels answers by hand and gives
each view's Cohen's κ against those labels, and — on the answers **both** views score — the
paired difference Δκ = κ(judged) − κ(string match) with a paired bootstrap 95 % CI
(:data:`PAIRED`, ``spotcheck.answers.paired_views``). Two κ's from different answer sets are not
compared.

The rule (:func:`correctness_choice`), once for ``select``, ``gate`` and the report:

- ``correctness_judged`` when a card's Δκ CI lies wholly above 0, no card's wholly below, and
  every config logged it (and it is comparable across them: one judge);
- otherwise ``correctness`` (the string match needs no model and no judge to stay fixed): with the
  reason — string match better, the cards disagree, no card, too few labels, or a Δκ CI that
  covers 0, with the answers needed to tell a difference of the size seen.

The choice replaces ``correctness`` where it is a default (``analysis.comparability``'s
default metric); a metric named with ``--metric`` is kept and the line names the better view.
Every surface says the line (a ``human`` caveat of the verdict). Pure: no MLflow, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rag_experiments.core.run_record import RunData

STRING, JUDGED = "correctness", "correctness_judged"
VIEWS = (STRING, JUDGED)
#: The card's paired figures on the answers both views score (logged by spotcheck score-answers).
PAIRED = "spotcheck/answers/paired"
#: How every surface starts the line (``analysis.verdict.note_caveats`` files it under "human").
PREFIX = "correctness view: "
#: The command that makes a card (``analysis.judge_trust.ANSWERS_CMD``'s words).
CARD_CMD = "python -m rag_experiments.spotcheck sample-answers {run} -n {n} --out answers.csv"
#: Answers to label when no card exists: agreement within ±0.1 (``judge_trust.labels_needed``).
FIRST_CARD_N = 97


def paired_keys() -> dict[str, str]:
    """Field → metric key of the card's paired figures."""
    f = ("n", "kappa_string", "kappa_string_ci_low", "kappa_string_ci_high", "kappa_judged",
         "kappa_judged_ci_low", "kappa_judged_ci_high", "delta", "delta_ci_low", "delta_ci_high")  # fmt: skip
    return {x: f"{PAIRED}/{x}" for x in f}


@dataclass(frozen=True)
class PairedCard:
    """One run's correctness card, the two views on the same ``n`` answers. NaN κ: too few to say."""

    run: str  # how messages name the run
    run_id: str
    n: int
    kappa_string: tuple[float, float, float]  # κ, CI low, CI high
    kappa_judged: tuple[float, float, float]
    delta: tuple[float, float, float]  # κ(judged) − κ(string), paired bootstrap CI

    @classmethod
    def of(cls, label: str, run_id: str, metrics: Mapping[str, float]) -> PairedCard | None:
        keys = paired_keys()
        if keys["n"] not in metrics:
            return None

        def three(p: str) -> tuple[float, float, float]:
            return tuple(float(metrics.get(keys[p + s], math.nan)) for s in ("", "_ci_low", "_ci_high"))  # type: ignore[return-value]

        return cls(
            label,
            run_id,
            int(metrics[keys["n"]]),
            three("kappa_string"),
            three("kappa_judged"),
            three("delta"),
        )

    @property
    def too_few(self) -> bool:
        return any(math.isnan(x) for x in self.delta)

    @property
    def sign(self) -> int:
        """+1 judged better (Δκ CI above 0), −1 string match better, 0 not distinguishable."""
        if self.too_few:
            return 0
        return 1 if self.delta[1] > 0 else -1 if self.delta[2] < 0 else 0

    def figures(self) -> str:
        def k(t):
            return f"{t[0]:.2f} [{t[1]:.2f}, {t[2]:.2f}]"

        if self.too_few:
            return f"the correctness card of {self.run} has too few labels to say ({self.n} answers both views score)"
        d = self.delta
        return (
            f"on the correctness card of {self.run}, κ against the human labels {k(self.kappa_judged)} "
            f"(correctness_judged) vs {k(self.kappa_string)} (correctness) on the same {self.n} answers, "
            f"Δκ {d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}]"
        )

    def n_to_tell(self) -> int | None:
        """Answers for a Δκ CI narrower than the Δκ seen (n·(half-width/|Δκ|)², the CI shrinking as
        1/√n); None when no difference was seen."""
        d, lo, hi = self.delta
        if self.too_few or abs(d) < 1e-9:
            return None
        return math.ceil(self.n * ((hi - lo) / 2 / abs(d)) ** 2)


@dataclass(frozen=True)
class CorrectnessChoice:
    """The better-validated correctness view over a set of configs, and why (:func:`correctness_choice`)."""

    metric: str  # correctness or correctness_judged
    reason: str
    cards: tuple[PairedCard, ...]

    def line(self, used: str) -> str:
        """What every surface says of a verdict on ``used`` (a correctness view)."""
        if used == self.metric:
            return f"{PREFIX}{used}, the better-validated view: {self.reason}"
        other = "--metric " + self.metric
        return f"{PREFIX}{used} as named; {self.metric} is the better-validated view: {self.reason} ({other} to use it)"


def correctness_choice(runs: Sequence[RunData]) -> CorrectnessChoice | None:
    """The view a verdict over ``runs`` should read (module docstring's rule); None when no run
    logged ``correctness_judged`` (nothing to choose)."""
    if not any(JUDGED in r.metrics for r in runs):
        return None
    cards = tuple(c for r in runs if (c := PairedCard.of(r.name, r.run_id, r.metrics)) is not None)
    first = runs[0].run_id if len(runs) == 1 else "RUN"
    missing = [r.name for r in runs if JUDGED not in r.metrics]
    if not cards:
        return CorrectnessChoice(
            STRING,
            "string match kept: no correctness card compares correctness_judged with it on the same answers. "
            f"Label {FIRST_CARD_N} answers ({CARD_CMD.format(run=first, n=FIRST_CARD_N)}, fill human_answer), "
            f"then spotcheck score-answers {first} answers.csv: the card gives both κ on those answers",
            cards,
        )
    signs = {c.sign for c in cards}
    figures = "; ".join(c.figures() for c in cards[:3]) + (
        f"; {len(cards) - 3} more cards" if len(cards) > 3 else ""
    )
    if 1 in signs and -1 in signs:
        return CorrectnessChoice(STRING, f"string match kept: the cards disagree: {figures}", cards)
    if -1 in signs:
        return CorrectnessChoice(STRING, f"string match, closer to the human labels: {figures}", cards)
    if 1 in signs:
        if missing:
            return CorrectnessChoice(
                STRING, f"string match kept: correctness_judged is better validated ({figures}) but "
                f"{', '.join(missing[:5])} did not log it (no judge model)", cards,
            )  # fmt: skip
        return CorrectnessChoice(JUDGED, figures, cards)
    if all(c.too_few for c in cards):
        return CorrectnessChoice(STRING, f"string match kept: {figures}", cards)
    need = [n for c in cards if (n := c.n_to_tell()) is not None]
    tell = (
        f"; about {max(need)} labelled answers would tell a difference of the size seen "
        f"({CARD_CMD.format(run=cards[0].run_id, n=max(need))})"
        if need
        else ""
    )
    return CorrectnessChoice(STRING, f"string match kept: not distinguishable: {figures}{tell}", cards)
