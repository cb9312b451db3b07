"""The report's sections, and :func:`build_report`, which assembles them in order.

Each function builds one :class:`~rag_experiments.report.model.Section` from the :class:`Analysis`
(the Plots section is in ``report/figures.py``, definitions and reproducibility in
``report/provenance.py``); no Markdown or HTML here (``report/render.py`` lays the sections out).
"""

from __future__ import annotations

from collections.abc import Sequence

from rag_experiments.analysis.comparability import comparability
from rag_experiments.analysis.correctness_view import JUDGED
from rag_experiments.analysis.judge_trust import ANSWER_KAPPA, answers_checked, card_title, correctness_note
from rag_experiments.analysis.stats import first_stage_deltas
from rag_experiments.core.conf_groups import embedding_used, generation_only
from rag_experiments.core.run_record import is_bookkeeping
from rag_experiments.evaluation.headline import (
    CHUNKING_REASON,
    GENERATION_HEADLINE,
    headline_metrics,
    varies_chunking,
)
from rag_experiments.evaluation.registry import higher_is_better
from rag_experiments.report.brief import in_brief, levels_table
from rag_experiments.report.diagnostics import diagnostics_section
from rag_experiments.report.figures import plots_section
from rag_experiments.report.load import Config, ReportInput, level
from rag_experiments.report.model import (
    Analysis,
    Bullets,
    Paragraph,
    Report,
    Section,
    Subsection,
    Table,
    analyse,
    bold,
    code,
    f3,
    join,
    logged_ks,
    retrieval_metrics,
    table,
    text,
    with_ci,
)
from rag_experiments.report.provenance import definitions, reproducibility
from rag_experiments.report.queries import worst_query_headers, worst_query_rows
from rag_experiments.report.steps_table import cost_keys, step_table
from rag_experiments.report.tables import (
    NOISE_HEADERS,
    effect_headers,
    effect_rows,
    fmt_p,
    marginal_headers,
    marginal_rows,
    noise_rows,
)
from rag_experiments.report.verdict_view import replaced_groups, replaced_paragraphs, verdict_paragraphs

# Held-fixed params shown in the question: group choices (no dot) and these few settings.
SHOWN_SETTINGS = ("retriever.k", "embedding.name", "metrics.ks", "metrics.min_coverage", "evalset.limit")


def held_fixed(configs: Sequence[Config], factors: Sequence[str], generated: bool = True) -> dict[str, str]:
    """The params every config shares with one value, except factors and bookkeeping, and the keys
    of stages that ran in no config: they determine no result. Without ``generated`` (no config
    generated) the keys only generation reads (``prompt``, ``judge``, ``generation_subset``:
    ``conf_groups.generation_only``); ``embedding`` when no config's retriever calls the embedder
    (BM25 only: ``conf_groups.embedding_used``); the groups an app replaces when a config runs one
    (:func:`replaced_groups`: shared by the pipeline configs only, they are not held fixed)."""
    embedded = any(embedding_used(c.params) for c in configs)
    replaced = replaced_groups(configs)
    common = {}
    for key in sorted(set.intersection(*(set(c.params) for c in configs))):
        vals = {c.params[key] for c in configs}
        if (
            len(vals) == 1
            and key not in factors
            and not is_bookkeeping(key)
            and ("." not in key or key in SHOWN_SETTINGS)
            and (generated or not generation_only(key))
            and (embedded or key.split(".", 1)[0] != "embedding")
            and key.split(".", 1)[0] not in replaced
        ):
            common[key] = vals.pop()
    return common


def question(an: Analysis) -> Section:
    """What varies (factors and levels), what is held fixed, the baseline, and the short answer."""
    configs, factors, inp = an.configs, an.factors, an.inp
    s = Section("question", "Question")
    what = "retrieval and answer quality" if an.gen else "retrieval quality"
    if factors:
        names = join([code(f) for f in factors], " × ")
        s.blocks.append(Paragraph(text(f"How does {what} on the eval set change with ", names, "?")))
        levels = {f: sorted({level(c, f) or "–" for c in configs}) for f in factors}
        s.blocks.append(table(["factor", "levels"], [[f, ", ".join(levels[f])] for f in factors]))
    else:
        s.blocks.append(
            Paragraph(
                text(
                    f"What is the {what} of this configuration on the eval set? (a single run: no factor varies)"
                )
            )
        )
    swept = [*factors, *inp.swept]  # a key the sweep varied is never "held fixed"
    fixed = join([code(f"{k}={v}") for k, v in held_fixed(configs, swept, an.gen).items()], ", ")
    s.blocks.append(Paragraph(text("Held fixed: ", fixed, ".")))
    s.blocks += replaced_paragraphs(configs, swept, an.gen, held_fixed)
    if one_level := [f for f in inp.swept if f not in factors]:  # swept, one level among those compared
        shown = join([code(f"{f}={level(configs[0], f) or '–'}") for f in one_level], ", ")
        s.blocks.append(Paragraph(text(
            "Swept, with one level among the configs compared (others stopped or unfinished): ", shown, ".")))  # fmt: skip
    n_q = int(max(c.metrics.get("n_queries", len(c.table)) for c in configs))
    n_unans = int(max(c.metrics.get("n_unanswerable", 0) for c in configs))
    why = f"({an.baseline_why})."
    # k swept: one k cannot be "the" context k; the retrieval columns are read at the common one
    k_text = (
        f" is swept; retrieval metrics at k are shown at k = {an.k}"
        if "retriever.k" in factors
        else f" = {an.k}"
    )
    s.blocks.append(
        Paragraph(
            text(
                "Experiment ",
                code(inp.experiment_name),
                f", {len(configs)} config(s), {n_q} eval queries ({n_unans} unanswerable: excluded from "
                "retrieval metrics). Context k (",
                code("retriever.k"),
                f"){k_text}; primary metric ",
                code(an.primary),
                "; baseline = ",
                bold(an.base.label),
                " ",
                why,
            )
        )
    )
    s.blocks += [Paragraph(text(bold("warning"), ": ", n)) for n in an.notes]
    s.blocks += verdict_paragraphs(an.verdict)
    s.blocks.append(Paragraph(text("In brief:")))
    also = GENERATION_HEADLINE[:2] if an.primary in GENERATION_HEADLINE else ()
    s.blocks.append(Bullets(in_brief(an.base, an.primary, an.att, an.baseline_why, also)))
    s.blocks += levels_table(an.base, an.att)
    return s


def constant_keys(configs: Sequence, keys: Sequence[str]) -> dict[str, float]:
    """The ``keys`` every config logged with one and the same value (more than one config)."""
    out = {}
    for key in keys:
        vals = {c.metrics.get(key) for c in configs}
        if len(configs) > 1 and len(vals) == 1 and None not in vals:
            out[key] = vals.pop()
    return out


def results_table(an: Analysis, keys: Sequence[str], mark_best: bool = True) -> Table:
    """Each config's mean and 95 % CI per metric; the best mean per metric in bold, in the metric's
    own direction (the registry's: lower is better for failure rates, latency, cost). No bold when
    every config ties on it (nothing to pick) or when the metric is not comparable across the
    configs (``analysis.comparability``: hit@k when the chunks differ)."""
    configs = an.configs
    keys = [x for x in keys if any(x in c.metrics for c in configs)]
    runs = [c.data for c in configs if getattr(c, "data", None) is not None]
    best = {}
    for key in keys:
        try:
            hib = higher_is_better(key)
        except KeyError:  # not a registered metric: no better side to mark
            continue
        vals = [c.metrics[key] for c in configs if key in c.metrics]
        comparable = len(runs) < len(configs) or comparability(key, runs).comparable
        if hib is not None and comparable and len(set(vals)) > 1:
            best[key] = (max if hib else min)(vals)
    rows = []
    for c in configs:
        cells: list = [c.label + (" (baseline)" if c is an.base else "")]
        for key in keys:
            cell = with_ci(c.metrics, key)
            is_best = mark_best and len(configs) > 1 and key in c.metrics and c.metrics[key] == best.get(key)
            cells.append(bold(cell) if is_best else cell)
        rows.append(cells)
    return table(["config", *keys], rows)


def results_blocks(an: Analysis, keys: Sequence[str], mark_best: bool = True) -> list:
    """:func:`results_table` without the metrics constant across the configs, listed once below."""
    same = constant_keys(an.configs, keys)
    shown = [k for k in keys if k not in same]
    out: list = [results_table(an, shown, mark_best)] if shown else []
    if same:
        listed = join([code(f"{k} = {f3(v)}") for k, v in same.items()], ", ")
        out.append(Paragraph(text("Constant across the configs (not in the table): ", listed, ".")))
    return out


TOKEN_BUDGET_NOTE = (
    "The ranked chunks fill a context of B tokens (the last one truncated), so a chunker is not "
    "rewarded for handing the generator more text; hit@k and MRR below count chunks."
)

COUNT_KEYS = ("n_queries", "n_unanswerable", "n_errors", "n_unparseable_verdicts")


def results(an: Analysis) -> Section:
    """Every headline metric per config with its logged 95 % CI, and the query counts."""
    s = Section("results", "Results per config")
    s.blocks.append(
        Paragraph(
            text(
                "Each cell: mean over the queries it is defined for, with the 95 % bootstrap CI "
                "(query-level resampling, seeded) as logged by the sweep. ",
                bold("Bold"),
                ": best mean on that metric in its direction (lower is better for rates, latency and cost); "
                "a mean, not a test: which differences are significant is in the comparisons below. "
                "Not bold: a tie shared by every config, and a metric not comparable across the configs "
                "(chunk-counting metrics when the chunks differ, docs/metrics.md).",
            )
        )
    )
    if varies_chunking(an.factors):  # chunk-count metrics favour big chunks: equal-cost ones lead
        reason = CHUNKING_REASON
        cols = list(an.configs[0].table.columns)
        budgeted = [m for m in headline_metrics(an.factors, available=cols, k=an.k) if m.endswith("tok")]
        lead = [
            Paragraph(text(f"Budgeted metrics first: {reason}. ", TOKEN_BUDGET_NOTE)),
            *results_blocks(an, budgeted),
        ]
        s.subsections.append(Subsection("Retrieval at equal token budget", lead))
    retrieval = Subsection("Retrieval", results_blocks(an, retrieval_metrics(logged_ks(an.configs), an.k)))
    generation = []
    if an.gen_keys:
        generation.append(Subsection("Generation", results_blocks(an, an.gen_keys)))
        card = judge_card_table(an) + correctness_validity(an)
        if card:  # beside the generation metrics: how far the judge behind them can be trusted
            generation.append(Subsection("Judge validity: human labels first", card))
    added = first_stage_table(an)
    if added:  # a reranker's run: its final list against its own first stage
        retrieval.blocks += added
    # the side the primary metric is on leads (evaluation.headline)
    lead_gen = an.primary in an.gen_keys
    s.subsections += [*generation, retrieval] if lead_gen else [retrieval, *generation]
    if an.rate_keys:
        s.subsections.append(Subsection("Failure-label rates", results_blocks(an, an.rate_keys, False)))
    spot = spotcheck_table(an)
    if spot:
        s.subsections.append(Subsection("Judge-corrected faithfulness (human spot-check)", spot))
    counts = [
        [c.label, c.run.run_id, *(f3(c.metrics.get(k), nd=0) for k in COUNT_KEYS), c.run.status]
        for c in an.configs
    ]
    s.subsections.append(Subsection("Counts", [table(["config", "run", *COUNT_KEYS, "status"], counts)]))
    if any("cost_usd" in c.metrics for c in an.configs):  # docs/metrics.md, "Cost and tokens"
        keys = {k: nd for k, nd in cost_keys().items() if k == "cost_usd" or any(k in c.metrics for c in an.configs)}
        cost = [[c.label, *(f3(c.metrics.get(k), nd=nd) for k, nd in keys.items())] for c in an.configs]
        s.subsections.append(Subsection("Cost", [table(["config", *keys], cost)]))
    if per_step := step_table(an):
        s.subsections.append(Subsection("Per step", per_step))
    return s


def first_stage_table(an: Analysis) -> list:
    """Per config with a reranker, each retrieval metric on its first stage's list beside the final
    list's, with the paired test within the run (``analysis.stats.first_stage_deltas``, Holm over
    the metrics of that config)."""
    keys = retrieval_metrics(logged_ks(an.configs), an.k)
    rows = []
    for c in an.configs:
        if c.table is None:
            continue
        res = first_stage_deltas(c.table, keys)
        for r in res:
            rows.append([c.label, r.metric, f3(r.mean_a), f3(r.mean_b), f"{r.delta:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]",
                         f"{r.p_holm:.3g} (Holm over {len(res)})", r.test, str(r.n_pairs)])  # fmt: skip
    if not rows:
        return []
    note = Paragraph(text("What each config's reranker added: the first stage's list (the retriever's, "
                          "first_stage/<metric>) against the reranked list, paired by query within the run."))  # fmt: skip
    return [note, table(["config", "metric", "first stage", "final", "Δ [95% CI]", "p_holm", "test", "n"], rows)]


#: The card's columns: (metric key, header). Human labels lead; the synthetic card follows.
CARD_KEYS = (
    ("spotcheck/kappa", "human κ (spot-check, this run)"),
    ("judge_card/kappa", "card κ"),
    ("judge_card/balanced_accuracy", "card balanced accuracy"),
    ("judge_card/unparseable_rate", "unparseable"),
    ("judge_card/seconds_per_verdict", "s / verdict"),
    ("judge_card/flip_rate", "flip rate (repeats, pairs)"),
    ("judge_flip_rate", "flip rate (repeats, run claims)"),
)


def _card_cell(m: dict[str, float], key: str) -> str:
    """``value [lo, hi]``: card figures log their CI as ``{key}/ci_low`` (spot-check: ``_ci_low``)."""
    if key + "/ci_low" not in m:
        return with_ci(m, key)
    return f"{f3(m[key])} [{f3(m.get(key + '/ci_low'))}, {f3(m.get(key + '/ci_high'))}]"


def judge_card_table(an: Analysis) -> list:
    """The judge's agreement with humans and its validity card per config (``spotcheck/kappa``,
    ``judge_card/*``, docs/judges.md): human labels first; a card on synthetic pairs is labelled
    an optimistic bound (``analysis.judge_trust``), never the judge's accuracy on this corpus."""
    configs = [c for c in an.configs if "judge_card/kappa" in c.metrics or "spotcheck/kappa" in c.metrics]
    if not configs:
        return []
    rows = [
        [
            c.label,
            c.params.get("judge", "?"),
            *(_card_cell(c.metrics, key) for key, _ in CARD_KEYS[:1]),
            f"{card_title(c.tags.get('judge_card_source', '?'))} "
            f"({f3(c.metrics.get('judge_card/n_pairs'), nd=0)})",
            *(_card_cell(c.metrics, key) for key, _ in CARD_KEYS[1:]),
        ]
        for c in configs
    ]
    note = text(
        "Human κ: the judge against this run's own human labels (spotcheck score), the figure to "
        "trust. Card: the judge's agreement with labelled (claim, evidence) pairs, 95 % cluster-bootstrap "
        "CI over claim groups; on human-labelled pairs (judge_card.pairs) it measures the judge, on "
        "synthetic pairs made from the corpus by rule it is an optimistic bound (clean, easy "
        "perturbations: a judge can score κ 0.5 there and 0.05 on real answers). An unparseable verdict "
        "counts as a disagreement. Definitions: docs/judges.md."
    )
    heads = [h for _, h in CARD_KEYS]
    return [Paragraph(note), table(["config", "judge", heads[0], "card pairs (n)", *heads[1:]], rows)]


def correctness_validity(an: Analysis) -> list:
    """Key-fact correctness against answer-level human labels (the correctness card of ``spotcheck
    score-answers``, docs/spotcheck.md): each config's κ where it was checked, else the note naming
    ``spotcheck sample-answers`` with the n needed (``analysis.judge_trust.correctness_note``)."""
    if "correctness" not in an.gen_keys:
        return []
    checked = [c for c in an.configs if answers_checked(c.metrics)]
    if not checked:
        return [Paragraph(text(correctness_note(an.base.run.run_id)))]
    keys = [ANSWER_KAPPA, *[k for k in (f"spotcheck/answers/{JUDGED}/kappa",) if any(k in c.metrics for c in checked)]]
    rows = [[c.label, *(_card_cell(c.metrics, k) for k in keys), f3(c.metrics.get("spotcheck/answers/correctness/n"), nd=0)]
            for c in checked]  # fmt: skip
    note = text(
        "Correctness κ: key-fact correctness against the answers a human labelled correct / incorrect / "
        "declined (spotcheck score-answers, 95 % bootstrap CI); a config not listed was never checked."
        + (" The verdict reads the better-validated view (docs/spotcheck.md)." if len(keys) > 1 else "")
    )
    heads = ["config", "correctness κ (answer labels)", *([f"{JUDGED} κ"] if len(keys) > 1 else []), "answers"]
    return [Paragraph(note), table(heads, rows)]


def spotcheck_table(an: Analysis) -> list:
    """Judge-only and PPI claim-level supported rate of the configs a human spot-checked
    (``spotcheck score``; estimand and method in docs/spotcheck.md)."""
    rows = [
        [
            c.label,
            with_ci(c.metrics, "spotcheck/judge_faithfulness"),
            with_ci(c.metrics, "spotcheck/ppi_faithfulness"),
            f3(c.metrics.get("spotcheck/n"), nd=0),
        ]
        for c in an.configs
        if "spotcheck/ppi_faithfulness" in c.metrics
    ]
    if not rows:
        return []
    note = text(
        "Share of the run's judged claims that are supported, pooled over queries (not the per-query "
        "mean above), 95 % CI; judge-corrected: prediction-powered inference with the human labels "
        "(docs/spotcheck.md)."
    )
    return [Paragraph(note), table(["config", "judge only", "judge-corrected (PPI)", "labels"], rows)]


ATTRIBUTION_METHOD = (
    "every other factor at the baseline's value. delta = mean(level) − mean(baseline) over the queries "
    "defined in both; 95 % CI: paired percentile bootstrap over queries; p: exact McNemar for 0/1 metrics, "
    "paired sign-flip permutation otherwise; p_holm: Holm-adjusted across every comparison of the "
    "attribution (* = p_holm < 0.05)."
)


def attribution(an: Analysis) -> Section:
    """One factor at a time against the baseline, marginal means, and the A/A noise floor."""
    s = Section("attribution", "Attribution (one factor at a time)")
    att = an.att
    if att is None:
        s.blocks.append(
            Paragraph(
                text(
                    "A single configuration: there is no factor to attribute. Use ",
                    code("python -m rag_experiments.compare RUN_A RUN_B"),
                    " to compare two runs.",
                )
            )
        )
        return s
    s.blocks.append(
        Paragraph(
            text("Each level is compared with the baseline ", bold(an.base.label), ", " + ATTRIBUTION_METHOD)
        )
    )
    if att.effects.empty:
        s.blocks.append(Paragraph(text("(no one-factor-at-a-time comparison is possible in this grid)")))
    else:
        s.blocks.append(table(effect_headers(att.holm_n), effect_rows(att.effects, f3, fmt_p)))
    if att.skipped:
        s.blocks.append(Paragraph(text("Not in the grid (comparison skipped): " + "; ".join(att.skipped))))
    if len(an.factors) > 1 and not att.marginals.empty:
        rows = marginal_rows(att.marginals, f3, fmt_p, with_p_value=False)
        s.subsections.append(
            Subsection("Marginal means over the grid", [table(marginal_headers(with_p_value=False, n=att.holm_n), rows)])
        )
    if not att.noise_floor.empty:
        noise = [
            table(NOISE_HEADERS, noise_rows(att.noise_floor, f3)),
            Paragraph(text(f"Method: {att.noise_floor['detail'].iloc[0]}")),
        ]
        s.subsections.append(Subsection("A/A noise floor", noise))
    from rag_experiments.report.sweep_extras import interactions_subsection

    if (inter := interactions_subsection(an)) is not None:
        s.subsections.append(inter)
    return s


def worst_queries(an: Analysis) -> Section:
    """Per config, the ``n_worst`` worst queries with their gold spans and top retrieved chunks."""
    s = Section("worst", "Worst queries")
    k = an.k
    s.blocks.append(
        Paragraph(
            text(
                f"Per config, the {an.n_worst} worst queries: by failure label (error, retrieval_failure, "
                "generation_failure, correct_without_evidence first)"
                + (", then correctness and faithfulness" if an.gen else "")
                + f", then reciprocal rank, evidence_recall@{k} and nDCG@{k} (lowest first). Top 3 retrieved "
                "chunks: ✓ relevant to a gold span, ✗ not. 'first rel.': rank of the first relevant chunk."
                + (" Items never generated (outside evalset.generation_subset) are left out." if an.gen else "")
            )
        )
    )
    headers = worst_query_headers(an.gen)
    for c in an.configs:
        rows = worst_query_rows(c, k, an.n_worst, an.gen)
        s.subsections.append(Subsection(c.label, [table(headers, rows)]))
    return s


# --------------------------------------------------------------------------------------------- the report


def build_report(
    inp: ReportInput,
    baseline: str | None = None,
    primary: str | None = None,
    n_worst: int = 5,
    seed: int = 0,
    n_resamples: int = 4999,
    allow_incomparable: bool = False,
) -> Report:
    """The report of the loaded runs: statistics first, then each section from them, in order."""
    an = analyse(inp, baseline, primary, n_worst, seed, n_resamples, allow_incomparable)
    plots, curve_notes = plots_section(an)
    diag = diagnostics_section(an)
    from rag_experiments.report.sweep_extras import checks_section, stopped_section, turn_section

    stopped = stopped_section(inp)
    turns = turn_section(an, seed=seed)
    checks = checks_section(an) if len(an.configs) > 1 else None
    body = [
        question(an),
        results(an),
        *([stopped] if stopped else []),
        *([diag] if diag else []),
        attribution(an),
        *([turns] if turns else []),
        *([checks] if checks else []),
        plots,
        worst_queries(an),
        definitions(an),
        reproducibility(an),
    ]
    t = inp.target
    title = f"RAG sweep report: {t.sweep_id}" if inp.is_sweep else f"RAG run report: {t.label}"
    return Report(
        title=title,
        sections=body,
        footer=text("Report generated by ", code(f"python -m rag_experiments.report {t.label}"), "."),
        baseline=an.base.label,
        baseline_why=an.baseline_why,
        primary=an.primary,
        notes=[f"warning: {n}" for n in an.notes] + curve_notes,
    )
