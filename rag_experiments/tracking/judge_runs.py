"""Which judge scored a run, and the check that compared runs were scored by the same one.

A generation metric is the judge's opinion: when two runs differ in their judge, a delta in
faithfulness measures the judge change as much as the pipeline change. ``compare``, ``gate`` and
``select`` call :func:`check_same_judge`, which refuses such runs (exit 2, both judges named)
unless the user passes ``--allow-judge-change``, and then says so in the output. The judge is
one of the facts that make a metric incomparable (``analysis.comparability``, the one rule);
:func:`check_comparable` is that rule's refusal for the CLIs (exit 2 unless
``--allow-incomparable``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mlflow.entities import Run

from rag_experiments.analysis import comparability
from rag_experiments.analysis.comparability import ALLOW_INCOMPARABLE, JudgeRef, params_judge_identity
from rag_experiments.core.run_record import RunData
from rag_experiments.tracking.runs import RunInputError, as_record, run_label

ALLOW_FLAG = "--allow-judge-change"
__all__ = ["ALLOW_FLAG", "ALLOW_INCOMPARABLE", "JudgeRef", "check_comparable", "check_same_judge", "run_judge"]


def run_judge(run: Run | RunData) -> JudgeRef | None:
    """The judge that scored ``run`` (``analysis.comparability.run_judge``); None for a
    retrieval-only run or judge=none."""
    return comparability.run_judge(as_record(run))


def check_same_judge(runs: Sequence[Run | RunData], allow: bool = False) -> str | None:
    """None when every judged run has the same judge; otherwise RunInputError naming the first two
    different judges, or with ``allow`` a note saying the comparison crosses judges.

    Runs logged before the ``judge_identity`` tag are compared by their judge params instead, and
    then every run is (one definition for all runs of one comparison)."""
    refs = [(r, run_judge(r)) for r in runs]
    refs = [(r, j) for r, j in refs if j is not None]
    if len(refs) < 2:
        return None
    if not all(j.from_tag for _, j in refs):
        refs = [(r, JudgeRef(j.name, params_judge_identity(as_record(r).params), False)) for r, j in refs]
    (r0, j0), other = refs[0], next(((r, j) for r, j in refs[1:] if j.identity != refs[0][1].identity), None)
    if other is None:
        return None
    r1, j1 = other
    what = (
        f"judge {j0.name} [judge_identity {j0.identity}] on run {run_label(r0)} vs "
        f"judge {j1.name} [judge_identity {j1.identity}] on run {run_label(r1)}"
    )
    if not allow:
        raise RunInputError(
            f"the runs were scored by different judges: {what}. Generation metrics would measure the "
            f"judge change; pass {ALLOW_FLAG} to compare them anyway"
        )
    return f"note: judges differ ({what}); compared anyway ({ALLOW_FLAG}): generation deltas include the judge change"


def check_comparable(
    metrics: Iterable[str], runs: Sequence[Run | RunData], allow: bool = False, available: Iterable[str] | None = None
) -> list[str]:
    """RunInputError naming the metric to use when one of ``metrics`` is not comparable across
    ``runs`` (``analysis.comparability``); with ``allow`` (``--allow-incomparable``) a note per
    such metric instead, to print."""
    bad = comparability.incomparable(metrics, [as_record(r) for r in runs], available)
    if bad and not allow:
        raise RunInputError("; ".join(c.message() for c in bad))
    return [c.note() for c in bad]
