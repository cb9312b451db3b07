"""Human spot-check of the judge.

    python -m rag_experiments.spotcheck sample RUN -n 20 [--stratify] [--seed 0] [--out FILE.csv]
    python -m rag_experiments.spotcheck score RUN labels.csv [--no-log]
    python -m rag_experiments.spotcheck sample RUN ... --to-mlflow [--queue NAME]; score --from-mlflow QUEUE
    python -m rag_experiments.spotcheck sample-answers RUN [-n 30]; score-answers RUN labels.csv

``sample`` writes a CSV of judged claims from the run's per-query table (one row per claim: the
query, the claim, the exact context the judge saw, the answer) with an empty ``human_verdict``
column. It is blind by default: the judge's verdict, score and rationale are not in it (they would
anchor the labeller); ``score`` restores them from the run by ``item_id`` and ``--show-judge``
keeps them in the file. Claims are drawn without replacement, seeded, by
systematic πps with size ``1 + 3·exp(−|score − threshold| / s)`` (``s`` = the median distance of
all claims' scores to the judge's threshold) so that borderline verdicts are over-weighted when the
judge gives scores; ``--stratify`` splits n evenly across the verdict labels first. Each row
records its exact ``inclusion_prob``.

``score`` reads the filled CSV (``human_verdict`` supported / unsupported, any case; blank rows
skipped and counted), takes each claim's judge verdict from the run, and reports agreement,
Cohen's κ (bootstrap 95 % CI), the confusion matrix, leniency P(judge supported | human
unsupported) and strictness. They are weighted by 1 / ``inclusion_prob`` (Horvitz–Thompson), so
they estimate the run's judged claims, with the labelled sample's own figures beside them; without
``inclusion_prob`` they describe the sample only, and the summary says which. Claims the judge left
``unparseable`` are counted apart. ``score`` also prints the judge-corrected faithfulness: the
prediction-powered (PPI) estimate of the share of the run's judged claims a human would call
supported, with its 95 % CI, beside the judge-only share (:mod:`rag_experiments.analysis.ppi`,
``docs/spotcheck.md``). Logged to the run as ``spotcheck/*`` metrics and artifacts; a
bad label file gets ``FILE:LINE: field: what is wrong`` lines on stderr and exit 2.

One module per step: ``claims`` (the run's judged claims and the seeded πps sample: the CSV's
columns), ``labels`` (reading and validating the filled CSV), ``scoring`` (agreement, κ, PPI),
``summary`` (the Markdown summary and the ``spotcheck/*`` MLflow logging), ``answers`` (answer-level
labels and the correctness card: key-fact correctness and the judge against correct / incorrect /
declined), ``review`` (the same sample
as a review queue in MLflow's Review tab, and its HUMAN feedback read back as the same ``Labels``;
``docs/spotcheck.md``), ``cli`` (the command line).
"""

from rag_experiments.judge.agreement import (  # re-exported: the one definition of each
    agreement_figures,
    inclusion_probabilities,
    kappa_ci,
    systematic_pps,
)
from rag_experiments.spotcheck.claims import (
    BLIND_COLUMNS,
    BORDERLINE_BOOST,
    COLUMNS,
    JUDGE_COLUMNS,
    item_id,
    judge_threshold,
    judged_claims,
    sample_claims,
    sample_weights,
    with_judge_columns,
)
from rag_experiments.spotcheck.cli import build_parser, main
from rag_experiments.spotcheck.labels import HUMAN_LABELS, REQUIRED, LabelFileError, Labels, read_labels
from rag_experiments.spotcheck.scoring import (
    Agreement,
    faithfulness_estimates,
    score_labels,
    self_preference_warning,
)
from rag_experiments.spotcheck.summary import log_spotcheck, render_summary

__all__ = [
    "BLIND_COLUMNS",
    "BORDERLINE_BOOST",
    "COLUMNS",
    "JUDGE_COLUMNS",
    "HUMAN_LABELS",
    "REQUIRED",
    "Agreement",
    "LabelFileError",
    "Labels",
    "agreement_figures",
    "build_parser",
    "faithfulness_estimates",
    "inclusion_probabilities",
    "item_id",
    "judge_threshold",
    "judged_claims",
    "kappa_ci",
    "log_spotcheck",
    "main",
    "read_labels",
    "render_summary",
    "sample_claims",
    "sample_weights",
    "with_judge_columns",
    "score_labels",
    "self_preference_warning",
    "systematic_pps",
]
