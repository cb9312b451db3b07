"""Scoring the labels: agreement, Cohen's κ, leniency / strictness and the PPI faithfulness."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from rag_experiments.analysis.ppi import Estimate, judge_only, ppi_mean
from rag_experiments.core.run_record import RunData
from rag_experiments.evaluation.intervals import kappa_too_few
from rag_experiments.judge.agreement import agreement_figures, kappa_ci
from rag_experiments.spotcheck.labels import HUMAN_LABELS, Labels


@dataclass
class Agreement:
    """Headline figures estimate the run's claims when ``weighted``, else describe the sample."""

    n: int  # labelled claims with a parseable judge verdict (the ones agreement and κ are on)
    n_blank: int
    n_judge_unparseable: int
    agreement: float
    kappa: float
    kappa_ci: tuple[float, float]
    confusion: pd.DataFrame  # rows human, columns judge (sample counts)
    leniency: float  # P(judge supported | human unsupported)
    strictness: float  # P(judge unsupported | human supported)
    weighted: bool = False  # headline figures weighted by 1/inclusion_prob
    n_population: int = 0  # the run's judged claims with a parseable verdict
    sample: dict[str, float] = field(default_factory=dict)  # unweighted figures of the labelled claims
    unparseable_by_human: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    ppi: Estimate | None = None  # judge-corrected claim-level supported rate of the run
    kappa_too_few: str | None = None  # κ not said: < 5 human labels in a class (evaluation.intervals)
    judge_only: Estimate | None = None  # the judge's own supported rate over the same claims


def faithfulness_estimates(labels: Labels, claims: pd.DataFrame) -> tuple[Estimate, Estimate]:
    """(PPI, judge-only) share of the run's parseable judged claims that are supported.

    f = judge says supported over all those claims; Y − f on the labelled ones, weighted by
    1 / inclusion_prob when the file has it, else taken as a simple random sample.
    """
    pop = claims[claims["judge_verdict"].isin(HUMAN_LABELS)]
    f_all = (pop["judge_verdict"] == "supported").to_numpy(float)
    ok = labels.rows[labels.rows["judge"].isin(HUMAN_LABELS)]
    y, f = (ok["human"] == "supported").to_numpy(float), (ok["judge"] == "supported").to_numpy(float)
    pi = ok["pi"].to_numpy(float) if labels.weighted else None
    return ppi_mean(f_all, y, f, pi), judge_only(f_all)


def score_labels(labels: Labels, seed: int = 0, n_resamples: int = 2000) -> Agreement:
    df = labels.rows
    unp = df[~df["judge"].isin(HUMAN_LABELS)]
    ok = df[df["judge"].isin(HUMAN_LABELS)]
    h, j = ok["human"].to_numpy(), ok["judge"].to_numpy()
    w = 1.0 / ok["pi"].to_numpy(float) if labels.weighted else None  # Horvitz–Thompson weights
    conf = pd.crosstab(pd.Categorical(h, HUMAN_LABELS), pd.Categorical(j, HUMAN_LABELS), dropna=False)
    conf.index = [f"human {x}" for x in HUMAN_LABELS]
    conf.columns = [f"judge {x}" for x in HUMAN_LABELS]
    head = agreement_figures(h, j, w)
    few = kappa_too_few(h, HUMAN_LABELS)
    if few:
        head["kappa"] = float("nan")
    return Agreement(
        n=len(ok),
        n_blank=labels.n_blank,
        n_judge_unparseable=len(unp),
        kappa_ci=(float("nan"),) * 2 if few else kappa_ci(h, j, w, seed=seed, n_resamples=n_resamples),
        kappa_too_few=few,
        confusion=conf.astype(int),
        weighted=labels.weighted,
        n_population=labels.n_population,
        sample=agreement_figures(h, j, None) | ({"kappa": float("nan")} if few else {}),
        unparseable_by_human=unp["human"].value_counts().to_dict(),
        **head,
    )


def self_preference_warning(run: RunData) -> str | None:
    tags = run.tags
    gen, judge = tags.get("generator_model"), tags.get("judge_model")
    same = tags.get("judge_is_generator") == "true" or (
        gen and judge and gen not in ("None", "") and gen == judge
    )
    if same:
        return (
            f"warning: the judge model equals the generator model ({judge or gen}): the judge grades its own "
            "answers (self-preference bias); read its faithfulness with care"
        )
    return None
