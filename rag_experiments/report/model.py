"""The report as data: the :class:`Report` tree, and the statistics it shows (:class:`Analysis`).

Statistics are computed once (:func:`analyse`); each section is then built from them by a pure
function (``report/sections.py``, which also assembles the report, ``report/figures.py``,
``report/provenance.py``). The tree holds text as :class:`Span` runs (plain, code, bold), tables as
headers plus rows, figures as a file name plus the data to draw. Markdown, HTML and PNG are produced
from it by ``report/render.py`` and ``report/plots.py``, so the two documents carry the same numbers
by construction.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

from rag_experiments import judge as judging
from rag_experiments.analysis.attribution import SweepAttribution, factor_effects
from rag_experiments.analysis.baseline import context_k as _context_k
from rag_experiments.analysis.baseline import sweep_baseline
from rag_experiments.analysis.comparability import (
    comparable_only,
    default_metric_choice,
    human_lines,
    incomparable,
    label_evidence_notes,
)
from rag_experiments.analysis.judge_trust import runs_judge_notes
from rag_experiments.analysis.verdict import pick_verdict
from rag_experiments.core.conf_groups import option_class
from rag_experiments.evaluation import aggregate, labels, registry
from rag_experiments.evaluation import metrics as M
from rag_experiments.evaluation.headline import table_metrics
from rag_experiments.evaluation.labels import FAILURE_LABELS
from rag_experiments.report.load import Config, ReportInput
from rag_experiments.report.plots import PlotData
from rag_experiments.report.tables import fmt_num
from rag_experiments.run.defaults import default_levels
from rag_experiments.tracking.runs import RunInputError, is_id_prefix, pick_by_prefix

# --------------------------------------------------------------------------------------------- metrics
# The metrics the report names, in one place; their keys, sides and functions are the registry's.

GENERATION_METRICS = registry.GENERATION_METRICS
RATE_ORDER = tuple(registry.render_key("rate_{label}", label=lab) for lab in FAILURE_LABELS)


def retrieval_metrics(hit_ks: Sequence[int], k: int) -> list[str]:
    """The retrieval columns of the results table: hit@k at every logged k, the rest at context k."""
    return [f"hit_at_{x}" for x in hit_ks] + [
        f"evidence_recall_at_{k}",
        "mrr",
        f"ndcg_at_{k}",
        f"context_precision_at_{k}",
    ]


def attribution_metrics(
    primary: str, k: int, configs: Sequence[Config], factors: Sequence[str] = ()
) -> list[str]:
    """The primary metric, the headline columns of the varied ``factors`` in the order of their
    side (``evaluation.headline.table_metrics``: generation metrics first when a generation setting
    is swept, budgeted metrics first when the chunking varies), the ranking metrics at context k,
    generation metrics and rate_ok: those every config's per-query table has."""
    cols = sorted(set.intersection(*(set(c.table.columns) for c in configs)))
    lead = table_metrics(cols, factors, k=k) if factors else []
    keys = [primary, *lead] + [m for m in (f"evidence_recall_at_{k}", "mrr", f"ndcg_at_{k}") if m != primary]
    keys += [*GENERATION_METRICS, "rate_ok"]
    keys = list(dict.fromkeys(keys))
    return [m for m in keys if all(m in c.table.columns for c in configs)]


def metric_definitions(logged: Iterable[str], judge_choice: str | None) -> list[tuple[str, str]]:
    """(name, ``module.qualname`` and docstring) of the functions that computed the logged numbers.

    The metric functions are the registry's (``MetricSpec.compute``) for every spec a ``logged`` key
    is an instance of, in registry order; around them the helpers they rely on (relevance, mean and
    CI, failure labels; with generation metrics claim splitting, key-fact matching and the judge)
    and the attribution.
    """

    found = {got[0].pattern for key in logged if (got := registry.parse(key)) is not None}
    found_specs = [s for s in registry.REGISTRY if s.pattern in found]
    used = [s for s in found_specs if s.compute]

    def side(name: str) -> list[tuple[str, Callable]]:
        return [(s.pattern, s.function()) for s in used if s.side == name]

    fns: list[tuple[str, Callable]] = [
        ("relevance (chunk ↔ gold span)", M.relevance),
        *side("retrieval"),
        ("aggregates: mean and 95 % CI", aggregate.mean_ci),
        ("failure_label and rate_{label}", labels.failure_label),
    ]
    if any(s.side == "generation" for s in found_specs):
        fns += side("generation") + side("diagnostic")
        fns += [
            ("claims (answer → atomic claims)", judging.split_claims),
            ("key-fact match", judging.key_fact_recall),
            ("text normalisation for key facts", judging.normalise_text),
        ]
        judge_cls = option_class("judge", judge_choice) if judge_choice else None  # conf/judge/*.yaml
        if judge_cls is not None:
            fns.append((f"judge ({judge_choice}): verdicts", judge_cls))
            if hasattr(judge_cls, "answer_relevance"):
                fns.append((f"judge ({judge_choice}): answer_relevance", judge_cls.answer_relevance))
    fns.append(("attribution: factor effects", factor_effects))
    out = []
    for name, fn in fns:
        doc = inspect.getdoc(fn) or "(no docstring)"
        out.append((name, f"{fn.__module__}.{fn.__qualname__}\n\n{doc}"))
    return out


# --------------------------------------------------------------------------------------------- the tree


@dataclass(frozen=True)
class Span:
    """A run of text: ``style`` is "" (plain), "code" or "bold"."""

    text: str
    style: str = ""

    def __post_init__(self) -> None:
        if self.style not in ("", "code", "bold"):
            raise ValueError(f"unknown span style {self.style!r}")


Text = tuple[Span, ...]


def text(*parts: str | Span | Iterable[Span]) -> Text:
    """Rich text from plain strings, spans and other texts (concatenated)."""
    out: list[Span] = []
    for p in parts:
        if isinstance(p, str):
            out.append(Span(p))
        elif isinstance(p, Span):
            out.append(p)
        else:
            out.extend(p)
    return tuple(s for s in out if s.text)


def join(parts: Sequence[str | Span | Text], sep: str) -> Text:
    """``parts`` with ``sep`` between them (``", ".join`` for rich text)."""
    return text(*(x for i, p in enumerate(parts) for x in ([sep] if i else []) + [p]))


def code(s: Any) -> Span:
    return Span(str(s), "code")


def bold(s: Any) -> Span:
    return Span(str(s), "bold")


def plain(t: Text) -> str:
    return "".join(s.text for s in t)


@dataclass
class Paragraph:
    kind: ClassVar[str] = "paragraph"
    text: Text


@dataclass
class Bullets:
    kind: ClassVar[str] = "bullets"
    items: list[Text]


@dataclass
class Table:
    kind: ClassVar[str] = "table"
    headers: list[str]
    rows: list[list[Text]]


def table(headers: Sequence[str], rows: Iterable[Sequence[str | Span | Text]]) -> Table:
    """A table whose cells may be plain strings (most are) or rich text."""
    return Table(list(headers), [[text(c) if isinstance(c, str | Span) else c for c in r] for r in rows])


@dataclass
class CodeBlock:
    kind: ClassVar[str] = "code"
    text: str


@dataclass
class Figure:
    """A PNG in the report directory: ``plot`` is what ``report/plots.py`` draws into ``file``."""

    kind: ClassVar[str] = "figure"
    file: str
    caption: Text
    plot: PlotData


Block = Paragraph | Bullets | Table | CodeBlock | Figure


@dataclass
class Subsection:
    title: str
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Section:
    anchor: str  # the HTML id, and the entry of the table of contents
    title: str
    blocks: list[Block] = field(default_factory=list)
    subsections: list[Subsection] = field(default_factory=list)


@dataclass
class Report:
    title: str
    sections: list[Section]
    footer: Text
    baseline: str
    primary: str
    notes: list[str]  # warnings worth printing on the terminal too (plain text)
    baseline_why: str = ""  # why that baseline (analysis.baseline): printed as compare --sweep does

    @property
    def figures(self) -> list[Figure]:
        blocks = [
            b for s in self.sections for b in [*s.blocks, *(b for u in s.subsections for b in u.blocks)]
        ]
        return [b for b in blocks if isinstance(b, Figure)]


# --------------------------------------------------------------------------------------------- statistics


f3 = partial(fmt_num, nd=3)  # the report prints 3 decimals


def with_ci(m: dict[str, float], key: str) -> str:
    """``mean [ci_low, ci_high]`` of a logged metric, ``–`` when the run did not log it."""
    if key not in m:
        return "–"
    return f"{f3(m[key])} [{f3(m.get(key + '_ci_low'))}, {f3(m.get(key + '_ci_high'))}]"


def context_k(configs: Sequence[Config]) -> int:
    """The context k (retriever.k) most configs share; ties go to the larger k."""
    return _context_k([c.params for c in configs])


def logged_ks(configs: Sequence[Config], prefix: str = "hit_at_") -> list[int]:
    ks: set[int] = set()
    for c in configs:
        ks |= {int(k[len(prefix) :]) for k in c.metrics if re.fullmatch(re.escape(prefix) + r"\d+", k)}
    return sorted(ks)


def has_generation(configs: Sequence[Config]) -> bool:
    return any(m in c.metrics for c in configs for m in GENERATION_METRICS)


def choose_baseline(
    configs: Sequence[Config], factors: Sequence[str], primary: str, baseline: str | None
) -> tuple[Config, str]:
    """The config named by ``baseline`` (run id, unique run-id prefix, run name or label), else the sweep's default
    baseline (``analysis.baseline.sweep_baseline``, the rule ``compare --sweep`` uses); and why."""
    if baseline:
        for c in configs:
            if baseline in (c.run.run_id, c.run.run_name, c.label):
                return c, "given with --baseline"
        if is_id_prefix(baseline) and (rid := pick_by_prefix(baseline, [(c.run.run_id, c.label) for c in configs])):
            return next(c for c in configs if c.run.run_id == rid), "given with --baseline"
        raise RunInputError(
            f"--baseline {baseline!r} is not a run of this report; runs: "
            + ", ".join(f"{c.label} ({c.run.run_id})" for c in configs)
        )
    if len(configs) == 1 or not factors:
        return configs[0], "the only config" if len(configs) == 1 else "the first run"
    got = sweep_baseline([c.data for c in configs], factors, primary, defaults=default_levels(factors))
    return configs[got.index], got.why


@dataclass
class Analysis:
    """Everything the sections show, computed once."""

    inp: ReportInput
    base: Config
    baseline_given: bool
    baseline_why: str  # "the default config", "given with --baseline", … (analysis.baseline)
    primary: str
    k: int  # context k
    gen: bool
    gen_keys: list[str]  # generation metrics some config logged
    rate_keys: list[str]  # failure-label rates some config logged
    att: SweepAttribution | None  # None: a single config or no factor varies
    notes: list[str]  # warnings shown under the question and printed by the CLI
    n_worst: int
    interactions: Any = None  # analysis.interactions.InteractionResult of a full-factorial sweep
    verdict: Any = None  # analysis.verdict.SelectVerdict on the primary metric (more than one config)
    primary_why: str = ""

    @property
    def configs(self) -> list[Config]:
        return self.inp.configs

    @property
    def factors(self) -> list[str]:
        return self.inp.factors


def verdict_and_caveats(runs: list, primary: str, why: str, overrides: list[str], seed: int) -> tuple:
    """(``select``'s verdict on ``primary``, computed as ``select`` computes it: same margin, seed and
    resamples, so both count the same ties; its caveats in its order). One config: no verdict, the
    overrides and label lines only."""
    human = [x for x in human_lines(primary, runs) if not x.startswith("UNVALIDATED")]  # PPI leads
    verdict = None
    if len(runs) > 1:
        try:
            verdict = pick_verdict(runs, primary, why, registry.higher_is_better, seed=seed, notes=overrides, human=human)
        except ValueError:
            verdict = None
    lead = verdict.caveat_lines() if verdict else [*overrides, *human]
    return verdict, lead + [o for o in overrides if o not in lead]


def analyse(
    inp: ReportInput,
    baseline: str | None = None,
    primary: str | None = None,
    n_worst: int = 5,
    seed: int = 0,
    n_resamples: int = 4999,
    allow_incomparable: bool = False,
) -> Analysis:
    """Choose the baseline and primary metric, check the runs agree, run the attribution.

    A ``primary`` not comparable across the configs (``analysis.comparability``) is refused
    (RunInputError naming the metric to use) unless ``allow_incomparable``; the attribution tests
    only the comparable metrics (a note names the ones left out)."""
    configs = inp.configs
    k = context_k(configs)
    # the metric every swept factor can move leads (evaluation.headline; docs/metrics.md)
    common = set.intersection(*(set(c.table.columns) for c in configs))
    runs = [c.data for c in configs]
    why = "given with --metric"
    if primary is None:
        primary, why = default_metric_choice(runs, sorted(common), inp.factors)
    primary_why = why
    missing = [c.label for c in configs if primary not in c.table.columns]
    if missing:
        raise RunInputError(f"metric {primary!r} is not in the per-query table of: {', '.join(missing)}")
    notes = []
    bad = incomparable([primary], runs, sorted(common))
    if bad and not allow_incomparable:
        raise RunInputError(bad[0].message())
    overrides = [c.note() for c in bad]
    base, why = choose_baseline(configs, inp.factors, primary, baseline)
    if (missing_note := inp.target.unfinished_note()) is not None:  # FAILED or never-run configs
        notes.insert(0, missing_note)
        why = why.replace("the only config", "the only config that finished")
    if len({c.tags.get("evalset_digest") for c in configs} - {None}) > 1:
        notes.append(
            "the runs were evaluated on different eval sets (evalset_digest differs); "
            "paired comparisons below are not meaningful."
        )
    verdict, lead = verdict_and_caveats(runs, primary, primary_why, overrides, seed)
    notes[:0] = [n.removeprefix("note: ") for n in lead]  # the verdict's caveats lead, in its order
    notes += [n.removeprefix("note: ") for n in label_evidence_notes(runs)]  # judge=none labels
    if has_generation(configs):  # human κ < 0.4, or no human labels at all (analysis.judge_trust)
        notes += runs_judge_notes([(c.metrics, c.tags) for c in configs], base.run.run_id)
    att = inter = None
    if len(configs) > 1 and inp.factors:
        from rag_experiments.analysis.interactions import sweep_interactions

        metrics = attribution_metrics(primary, k, configs, inp.factors)
        if not allow_incomparable:  # no * on a metric the configs cannot be compared on
            metrics, left_out = comparable_only(metrics, runs, sorted(common))
            notes += left_out
        att = factor_effects(
            [c.data for c in configs], base.data, metrics, seed=seed, n_resamples=n_resamples
        )
        inter = sweep_interactions([c.data for c in configs], inp.factors, metrics)
    return Analysis(
        inp=inp,
        base=base,
        baseline_given=bool(baseline),
        baseline_why=why,
        primary=primary,
        k=k,
        gen=has_generation(configs),
        gen_keys=[m for m in GENERATION_METRICS if any(m in c.metrics for c in configs)],
        rate_keys=[m for m in RATE_ORDER if any(m in c.metrics for c in configs)],
        att=att,
        notes=notes,
        n_worst=n_worst,
        interactions=inter,
        verdict=verdict,
        primary_why=primary_why,
    )
