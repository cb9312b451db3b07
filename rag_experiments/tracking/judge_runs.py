"""Which judge scored a run, and the check that compared runs were scored by the same one.

A generation metric is the judge's opinion: when two runs differ in their judge, a delta in
faithfulness measures the judge change as much as the pipeline change. ``compare``, ``gate`` and
``select`` call :func:`check_same_judge`, which refuses such runs (exit 2, both judges named)
unless the user passes ``--allow-judge-change``, and then says so in the output.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from mlflow.entities import Run

from rag_experiments.core.run_record import RunData
from rag_experiments.tracking.runs import RunInputError, as_record, run_label

ALLOW_FLAG = "--allow-judge-change"


@dataclass(frozen=True)
class JudgeRef:
    """A run's judge: ``name`` (the ``judge`` group choice, e.g. ``heuristic``, and the judge model
    when there is one) and ``identity`` (the ``judge_identity`` tag, ``identity.judge_fingerprint``)."""

    name: str
    identity: str
    from_tag: bool


def _params_identity(params: dict[str, str]) -> str:
    """Runs logged before the ``judge_identity`` tag: a hash of their judge.* params (the judge's
    settings; model bytes are not in the params, so this is the weaker fallback)."""
    keys = {k: v for k, v in params.items() if k.startswith("judge.") and not k.startswith("judge.pricing")}
    keys["judge"] = params.get("judge", "")
    return "params:" + hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]


def run_judge(run: Run | RunData) -> JudgeRef | None:
    """The judge that scored ``run``; None for a retrieval-only run (no generation, no judge)."""
    rec = as_record(run)
    tags, params = rec.tags, rec.params
    if "judge_identity" not in tags and "judge_model" not in tags:
        return None  # no generator: nothing was judged
    if params.get("judge") == "none" or tags.get("judge_identity") in ("", "None"):
        return None  # judge=none: only judge-free metrics, which no judge change can move
    name = params.get("judge") or "?"
    model = tags.get("judge_model")
    if model and model != "None":
        name = f"{name} ({model})"
    ident = tags.get("judge_identity")
    return JudgeRef(name, ident or _params_identity(dict(params)), bool(ident))


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
        refs = [(r, JudgeRef(j.name, _params_identity(as_record(r).params), False)) for r, j in refs]
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
