"""When a metric is comparable across a set of configs, and which one to use when it is not.

Every metric declares what breaks its comparability (``MetricSpec.breaks``,
``evaluation/metric_table.py``; docs/metrics.md, "Comparability"). :func:`comparability` reads
the configs' logged params and tags (``RunData``) and decides, for one metric and the configs at
hand, whether the metric is comparable, and if not why and which metric to use instead:

- ``corpus``: the configs searched different corpora (the ``corpus_digest`` tag differs). Every
  metric, no substitute: checked first, refused unless ``--allow-incomparable``, which every surface
  then says first.
- ``chunks``: what "a retrieved item" is differs: a different ``chunking`` choice or
  ``chunking.*`` key, or an application that returns its own contexts (``app=python|http``:
  its contexts replace the chunker, ``core/slots.py`` ``replaces``), app vs pipeline and app vs
  another app alike. A cut-off of k items (hit@k, MRR, nDCG@k, P@k, evidence/token recall@k,
  citations) favours big items: a whole document is one item however many tokens it costs the
  generator. The retriever, the embedding, the reranker (its candidate pool included: it re-orders
  the same chunks) and the query transform rank the same items, so they leave such a metric
  comparable. Instead: ``evidence_recall_at_{B}tok`` (every config fills the same B-token
  context), B the logged budget closest to the context the generator read (:func:`budget`).
- ``judge``: another judge scored the configs (``judge_identity``; a ``judge=none`` run's label
  rule rests on correctness only, so it counts as a judge of its own for the failure-label rates).
  No substitute: score both with one judge.
- ``key_facts``: a config's correctness still credits key facts the eval-set check calls weak: a
  generating run without the metric ``n_weak_key_facts`` was scored before weak facts were left
  out of correctness (``evalset.weak_facts``; a run that logs it, 0 included, left them out).
  Instead: ``answer_token_f1`` when logged.

``select``, ``gate``, ``compare`` (both forms) and ``report`` refuse a pick, a verdict or a ``*``
on an incomparable metric (exit 2, naming the metric to use) unless ``--allow-incomparable``,
which the output then prints. Pure: no MLflow, no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rag_experiments.analysis.correctness_view import JUDGED, STRING, correctness_choice
from rag_experiments.core.run_record import RunData
from rag_experiments.evaluation.defaults import TOKEN_BUDGETS
from rag_experiments.evaluation.registry import parse

ALLOW_INCOMPARABLE = "--allow-incomparable"
#: The metric whose weak key facts make correctness incomparable (the correctness side logs it).
WEAK_FACTS_METRIC = "n_weak_key_facts"
_WHY = {
    "corpus": "the configs searched different documents, so no metric compares them",
    "chunks": "a cut-off of k retrieved items favours big items (a whole document is one item)",
    "judge": "the metric is the judge's opinion (judge=none: the failure label rests on correctness only)",
    "key_facts": "correctness credits weak key facts (short, stop words, in the question or everywhere)",
}


@dataclass(frozen=True)
class JudgeRef:
    """A run's judge: ``name`` (the ``judge`` group choice, e.g. ``heuristic``, and the judge model
    when there is one) and ``identity`` (the ``judge_identity`` tag, ``identity.judge_fingerprint``)."""

    name: str
    identity: str
    from_tag: bool


def params_judge_identity(params: dict[str, str]) -> str:
    """Runs logged before the ``judge_identity`` tag: a hash of their judge.* params (the judge's
    settings; model bytes are not in the params, so this is the weaker fallback)."""
    keys = {k: v for k, v in params.items() if k.startswith("judge.") and not k.startswith("judge.pricing")}
    keys["judge"] = params.get("judge", "")
    return "params:" + hashlib.sha256(json.dumps(keys, sort_keys=True).encode()).hexdigest()[:16]


def generated(run: RunData) -> bool:
    """True when the run generated answers (it carries the judge tags a generating run logs)."""
    return "judge_identity" in run.tags or "judge_model" in run.tags


def run_judge(run: RunData) -> JudgeRef | None:
    """The judge that scored ``run``; None for a retrieval-only run or ``judge=none`` (no judge)."""
    tags, params = run.tags, run.params
    if not generated(run):
        return None  # no generator: nothing was judged
    if params.get("judge") == "none" or tags.get("judge_identity") in ("", "None"):
        return None  # judge=none: only judge-free metrics, which no judge change can move
    name = params.get("judge") or "?"
    model = tags.get("judge_model")
    if model and model != "None":
        name = f"{name} ({model})"
    ident = tags.get("judge_identity")
    return JudgeRef(name, ident or params_judge_identity(dict(params)), bool(ident))


def judge_key(run: RunData) -> str | None:
    """What the ``judge`` break compares: the judge identity, ``none`` for a generating run without a
    judge (its labels follow another rule), None for a retrieval-only run (not part of the rule)."""
    if not generated(run):
        return None
    ref = run_judge(run)
    return "judge=none" if ref is None else f"{ref.name} [{ref.identity}]"


def app_choice(run: RunData) -> str | None:
    """The ``app`` group choice of a run whose application returns its own contexts
    (``app=python|http``); None for the pipeline (``app=none`` or no ``app`` param)."""
    app = run.params.get("app")
    return None if app in (None, "", "none", "None", "null") else app


def chunk_key(run: RunData) -> str:
    """What one retrieved item is, as logged: an app's choice and its ``app.*`` params (its own
    contexts), else the ``chunking`` choice and every ``chunking.*`` param, sorted (the
    ``_target_`` follows from the choice)."""
    app = app_choice(run)
    group = "app" if app else "chunking"
    items = sorted(
        (k, v)
        for k, v in run.params.items()
        if (k == group or k.startswith(group + ".")) and k != f"{group}._target_"
    )
    if app:
        return "app returns its own contexts: " + ", ".join(f"{k}={v}" for k, v in items)
    return ", ".join(f"{k}={v}" for k, v in items) or "(default chunking)"


def corpus_key(run: RunData) -> str | None:
    """The corpus a run searched: its ``corpus_digest`` tag (None: not logged, not compared)."""
    return run.tags.get("corpus_digest") or None


def context_tokens(runs: Sequence[RunData]) -> float | None:
    """The context the generator read, measured: the median over ``runs`` of each run's mean
    prompt tokens per query (``tokens_in_generation``, what the generation endpoint reported),
    None when no run logged it (retrieval only, or an endpoint without usage)."""
    means = []
    for r in runs:
        if r.table is not None and "tokens_in_generation" in r.table.columns:
            col = r.table["tokens_in_generation"].astype(float)
            if col.notna().any():
                means.append(float(col.mean()))
    return float(sorted(means)[len(means) // 2]) if means else None


def _weak_facts(run: RunData) -> str | None:
    """Why ``run``'s correctness credits weak key facts (None: it leaves them out)."""
    if "correctness" in run.metrics and WEAK_FACTS_METRIC not in run.metrics:
        return "weak key facts (scored before they were left out of correctness)"
    return None


def logged_budgets(available: Iterable[str], runs: Sequence[RunData] = ()) -> list[int]:
    """Every B of an ``evidence_recall_at_{B}tok`` among ``available``, ascending; else the runs'
    ``metrics.token_budgets`` param; else the default budgets."""
    found = set()
    for key in available:
        got = parse(key)
        if got and got[0].pattern == "evidence_recall_at_{B}tok" and got[1]["form"] == "mean":
            found.add(int(got[1]["B"]))
    if found:
        return sorted(found)
    for r in runs:
        try:
            logged = json.loads(r.params.get("metrics.token_budgets", "null"))
        except ValueError:
            logged = None
        if isinstance(logged, list) and logged and all(isinstance(b, int) for b in logged):
            return sorted(logged)
    return sorted(TOKEN_BUDGETS)


def budget_choice(available: Iterable[str], runs: Sequence[RunData] = ()) -> tuple[int, str]:
    """(B, why) of the equal-budget metric: the logged budget closest to the context the generator
    read (:func:`context_tokens`; a tie goes to the larger budget, which holds that context), else
    the smallest logged budget, saying no run measured its context."""
    budgets = logged_budgets(available, runs)
    tokens = context_tokens(runs)
    if tokens is None:
        return budgets[0], (
            f"the smallest logged budget, {budgets[0]} tokens: no run measured the context its generator "
            "read (tokens_in_generation), so the budget the generator reads is unknown"
        )
    b = min(budgets, key=lambda x: (abs(x - tokens), -x))
    return (
        b,
        f"the logged budget closest to the context the generator read ({tokens:.0f} prompt tokens per query)",
    )


def budget(available: Iterable[str], runs: Sequence[RunData] = ()) -> int:
    """B of the equal-budget substitute and default (:func:`budget_choice`)."""
    return budget_choice(available, runs)[0]


@dataclass(frozen=True)
class Comparability:
    """One metric over one set of configs: comparable, or why not (``factor``, ``detail``: the two
    differing values) and the metric to use instead (None: there is no substitute)."""

    metric: str
    comparable: bool
    factor: str | None = None
    detail: str = ""
    instead: str | None = None
    instead_logged: bool = True  # False: the runs did not log the substitute (older runs)

    def message(self) -> str:
        """Why the metric is refused, and what to use or pass instead."""
        use = f"Use {self.instead} instead" if self.instead else "No metric replaces it"
        if self.instead and not self.instead_logged:
            use += " (these runs did not log it: re-run them, metrics.token_budgets sets B)"
        return (
            f"{self.metric} is not comparable across these configs: {self.detail}; "
            f"{_WHY.get(self.factor or '', '')}. {use}, or pass {ALLOW_INCOMPARABLE} to "
            "compare it anyway"
        )

    def note(self) -> str:
        """The line printed when ``--allow-incomparable`` overrides the refusal."""
        alt = f"; {self.instead} is comparable" if self.instead else ""
        return f"note: {ALLOW_INCOMPARABLE}: {self.metric} compared across configs where {self.detail}{alt}"


def _differ(runs: Sequence[RunData], key) -> tuple[str, str] | None:
    """The first two different values of ``key(run)`` over ``runs`` (None values left out)."""
    vals = [v for r in runs if (v := key(r)) is not None]
    other = next((v for v in vals[1:] if v != vals[0]), None)
    return None if other is None else (vals[0], other)


def comparability(
    metric: str, runs: Sequence[RunData], available: Iterable[str] | None = None
) -> Comparability:
    """Whether ``metric`` (a logged key, any form) is comparable across ``runs``: the first of its
    spec's ``breaks`` whose fact differs between two runs makes it incomparable. ``available``:
    the keys the runs logged (the substitute must be one of them; default: the runs' metrics and
    table columns). An unregistered key is comparable (nothing is declared about it)."""
    got = parse(metric)
    if got is None and not _differ(runs, corpus_key):
        return Comparability(metric, True)
    keys = set(available) if available is not None else _keys(runs)
    if d := _differ(runs, corpus_key):  # every metric: the documents searched differ
        return Comparability(
            metric, False, "corpus", f"the corpora differ (corpus_digest {d[0][:12]} vs {d[1][:12]})"
        )
    for factor in got[0].breaks if got else ():
        if factor == "chunks" and (d := _differ(runs, chunk_key)):
            b = budget(keys, runs)
            use = f"evidence_recall_at_{b}tok"
            what = "retrieved items" if any(app_choice(r) for r in runs) else "chunks"
            return Comparability(
                metric, False, factor, f"the {what} differ ({d[0]} vs {d[1]})", use, use in keys
            )
        if factor == "judge" and (d := _differ(runs, judge_key)):
            return Comparability(metric, False, factor, f"the judges differ ({d[0]} vs {d[1]})")
        if factor == "key_facts" and (w := next((x for r in runs if (x := _weak_facts(r))), None)):
            alt = "answer_token_f1" if "answer_token_f1" in keys else None
            return Comparability(metric, False, factor, f"a config's correctness counts {w}", alt)
    return Comparability(metric, True)


def _keys(runs: Sequence[RunData]) -> set[str]:
    out: set[str] = set()
    for r in runs:
        out |= set(r.metrics)
        if r.table is not None:
            out |= set(r.table.columns)
    return out


def incomparable(
    metrics: Iterable[str], runs: Sequence[RunData], available: Iterable[str] | None = None
) -> list[Comparability]:
    """The verdicts of the ``metrics`` that are not comparable across ``runs``, in order."""
    keys = list(available) if available is not None else None
    out = [comparability(m, runs, keys) for m in dict.fromkeys(metrics)]
    return [c for c in out if not c.comparable]


def comparable_only(
    metrics: Sequence[str], runs: Sequence[RunData], available: Iterable[str] | None = None
) -> tuple[list[str], list[str]]:
    """(the ``metrics`` comparable across ``runs``, a note per metric left out): how a default
    metric list drops what it may not show. Different corpora leave every metric in, for the
    caller's refusal (``tracking.judge_runs.check_comparable``): no metric survives them."""
    bad = {c.metric: c for c in incomparable(metrics, runs, available) if c.factor != "corpus"}
    groups: dict[tuple[str, str | None], list[str]] = {}
    for c in bad.values():
        groups.setdefault((c.detail, c.instead), []).append(c.metric)
    notes = [
        f"left out, not comparable across the configs ({detail}): {', '.join(ms)}"
        + (f"; {instead} is comparable" if instead else "")
        for (detail, instead), ms in groups.items()
    ]
    return [m for m in metrics if m not in bad], notes


def default_metric_choice(
    runs: Sequence[RunData], available: Sequence[str], factors: Sequence[str] | None = None
) -> tuple[str, str]:
    """(metric, why) a pick over ``runs`` defaults to: the first of the swept factors' headline
    columns (``evaluation.headline.table_metrics``: equal-budget metrics first when the chunking
    varies, generation metrics first when a generation setting is swept) that is comparable across
    the runs, an incomparable one replaced by its logged substitute (hit@5 of an app against the
    pipeline → the equal-budget metric); ``evaluation.headline.primary_metric`` when none is. An
    equal-budget default is read at :func:`budget_choice`'s B (the context the generator read).
    ``factors``: the swept factors (default: ``analysis.attribution.infer_factors`` of the runs)."""
    from rag_experiments.analysis.attribution import infer_factors
    from rag_experiments.analysis.baseline import context_k
    from rag_experiments.evaluation.headline import primary_metric, table_metrics

    factors = list(factors) if factors is not None else infer_factors(runs)
    k = context_k([r.params for r in runs])
    lead = table_metrics(available, factors, k)
    ok, _ = comparable_defaults(lead, runs, available)
    metric = ok[0] if ok else primary_metric(factors, available, k)
    why = "the default: the swept factors' primary metric comparable across the configs"
    if (
        metric == STRING
        and JUDGED in set(available)
        and (c := correctness_choice(runs))
        and c.metric == JUDGED
        and comparability(JUDGED, runs, available).comparable  # one judge read every config's facts
    ):
        metric, why = (
            JUDGED,
            why + "; correctness_judged in its place, the better-validated view (the correctness card)",
        )
    got = parse(metric)
    if got and got[0].pattern == "evidence_recall_at_{B}tok" and got[1]["form"] == "mean":
        b, how = budget_choice(available, runs)
        if f"evidence_recall_at_{b}tok" in set(available):
            metric = f"evidence_recall_at_{b}tok"
            why = f"the default: equal-budget evidence recall (what is retrieved differs), at {how}"
    return metric, why


def default_metric(
    runs: Sequence[RunData], available: Sequence[str], factors: Sequence[str] | None = None
) -> str:
    """The metric of :func:`default_metric_choice`."""
    return default_metric_choice(runs, available, factors)[0]


def comparable_defaults(
    metrics: Sequence[str], runs: Sequence[RunData], available: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Default ``metrics`` with each one not comparable across ``runs`` replaced by the metric to
    use instead when ``available`` has it (hit_at_5 and mrr → evidence_recall_at_{B}tok when the
    retrieved items differ), else left out; a note per change (``gate``'s defaults). Different
    corpora leave every metric in place, for the caller's refusal (no metric replaces them)."""
    out, notes = [], []
    for c in (comparability(m, runs, available) for m in metrics):
        use = (
            c.metric
            if c.comparable or c.factor == "corpus"
            else (c.instead if c.instead in available else None)
        )
        if not c.comparable and c.factor != "corpus":
            notes.append(f"default metric {c.metric} → {use or 'left out'}: {c.detail}")
        if use:
            out.append(use)
    return list(dict.fromkeys(out)), notes


def label_evidence_notes(runs: Sequence[RunData]) -> list[str]:
    """One line when some runs' failure labels rest on correctness only (``judge=none``: the run tag
    ``failure_label_evidence``), naming them: their rate_* read another rule than a judged run's."""
    free = [r for r in runs if r.tags.get("failure_label_evidence")]
    if not free:
        return []
    names = ", ".join(r.label if r.run_name else r.name for r in free[:5]) + (" …" if len(free) > 5 else "")
    return [
        f"note: failure labels of {names} rest on correctness only (judge=none: "
        f"{free[0].tags['failure_label_evidence']}); rate_ok and the other rates are not a judged run's"
    ]


def judged(metric: str, runs: Sequence[RunData]) -> bool:
    """True when ``metric`` is the judge's opinion (registry break ``judge``) and a judge scored
    one of ``runs``: what human labels validate (``analysis.judge_trust.human_figures``)."""
    got = parse(metric)
    return got is not None and "judge" in got[0].breaks and any(run_judge(r) for r in runs)


def human_lines(metrics: str | Sequence[str], runs: Sequence[RunData]) -> list[str]:
    """``analysis.judge_trust.human_figures`` of each of ``metrics`` over ``runs``: the
    label-corrected estimates first, and one UNVALIDATED line naming the judged metrics that no
    run's human labels validate."""
    from rag_experiments.analysis.judge_trust import human_figures

    lines, unvalidated = [], []
    for m in [metrics] if isinstance(metrics, str) else list(dict.fromkeys(metrics)):
        carded = m == JUDGED and any(f"spotcheck/answers/{JUDGED}/kappa" in r.metrics for r in runs)
        got = human_figures(m, [(r.label, r.metrics, r.tags) for r in runs], judged(m, runs) and not carded)
        if got and got[0].startswith("UNVALIDATED"):
            unvalidated.append((m, got[0]))
        else:
            lines += got
    if len(unvalidated) == 1:
        lines.insert(0, unvalidated[0][1])
    elif unvalidated:
        names = ", ".join(m for m, _ in unvalidated)
        first = unvalidated[0][1].split(" is the judge's opinion", 1)[1]
        lines.insert(0, f"UNVALIDATED: {names} are the judge's opinion{first}")
    return lines
