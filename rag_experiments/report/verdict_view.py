"""The report's view of the verdict (``analysis.verdict``) and of the effective pipeline.

The verdict paragraph says what ``select`` says about the same configs (the metric and why, the
pick, the tie set with its Holm family, the tests, the pick at every budget); the caveats lead the
report as warnings (``report.model.analyse``). "Held fixed" leaves out what an application
replaces, said in its own paragraph. Builds report blocks only; decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rag_experiments.analysis.comparability import app_choice
from rag_experiments.core.conf_groups import generation_only
from rag_experiments.core.slots import SLOTS, slot
from rag_experiments.report.model import Paragraph, bold, code, join, text


def replaced_groups(configs: Sequence) -> set[str]:
    """The config groups an application replaces when some config runs one (``app=python|http``):
    the slots it names (``core/slots.py``: ``replaces``, and ``stands_in``, whose step runs on its
    output instead of a model), and the groups without a step of their own that only generation
    reads (the prompt, read inside the generator's step). In those configs they do not run, so
    their keys are never "held fixed": the effective pipeline differs."""
    if not any(app_choice(c) for c in configs):
        return set()
    app = slot("app")
    named = {slot(n).group for n in (*app.replaces, *getattr(app, "stands_in", ()))}
    stepless = {s.group for s in SLOTS if not s.step and generation_only(s.group)}
    return named | stepless


def replaced_paragraphs(configs: Sequence, swept: Sequence[str], gen: bool, held_fixed: Callable) -> list:
    """One paragraph when a config runs an application: which keys of the pipeline configs it
    replaced (held fixed among the pipeline configs only); [] otherwise."""
    replaced = replaced_groups(configs)
    if not replaced:
        return []
    apps = sorted({a for c in configs if (a := app_choice(c))})
    pipe = [c for c in configs if not app_choice(c)]
    own = held_fixed(pipe, swept, gen) if pipe else {}
    keys = [code(f"{k}={v}") for k, v in own.items() if k.split(".", 1)[0] in replaced]
    tail = [join(keys, ", "), " in the pipeline configs only."] if keys else ["no pipeline stage."]
    what = f"Replaced by the application (app={', '.join(apps)} runs its own retrieval and answer): "
    return [Paragraph(text(what, *tail))]


def verdict_paragraphs(v) -> list:
    """``select``'s verdict on the primary metric, as ``select`` prints it; [] for one config."""
    if v is None:
        return []
    tests = ", ".join(t.label for t in v.tests) or "–"
    budget = [" ", v.budget_text, "."] if v.budget_text and not v.budget_text.startswith("budget-") else []
    return [
        Paragraph(
            text(
                "Verdict on ", code(v.choice.metric), f" ({v.choice.why}): ", code("select"), " keeps ",
                bold(v.chosen or v.best), f"; {v.tie.text()}; test: {tests}.", *budget,
            )
        )
    ]  # fmt: skip
