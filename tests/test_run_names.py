"""Run names show only what varies within a sweep; the headline rule of one-row-per-config tables;
the report's short answer (fast: no store, no model)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
from hydra.core.override_parser.overrides_parser import OverridesParser

from rag_experiments.analysis.attribution import RunData, SweepAttribution
from rag_experiments.core.run_names import (
    MAX_RUN_NAME,
    constant_overrides,
    run_name,
    sweep_description,
    swept_keys,
    varying_keys,
)
from rag_experiments.evaluation.headline import sweep_metrics, table_metrics
from rag_experiments.report.brief import in_brief, levels_table
from rag_experiments.report.render import md_inline

CHUNKERS = ("fixed", "markdown", "recursive", "sentence", "whole")


def _jobs(*varied: list[str]) -> list[list[str]]:
    const = ["corpus=dir", "corpus.path=/data/docs", "evalset=file", "retriever=bm25", "generator=none"]
    const += ["tracking.uri=sqlite:///x.db", "cache_dir=/c"]
    return [[v, *const] if isinstance(v, str) else [*v, *const] for v in varied]


def test_sweep_names_hold_only_the_varying_overrides_and_are_unique() -> None:
    jobs = _jobs(*(f"chunking={c}" for c in CHUNKERS))
    varying = varying_keys(jobs)
    assert varying == ["chunking"]
    names = [run_name(j, varying) for j in jobs]
    assert names == [f"chunking={c}" for c in CHUNKERS]
    assert constant_overrides(jobs[0], varying) == [
        "corpus=dir",
        "corpus.path=/data/docs",
        "evalset=file",
        "retriever=bm25",
        "generator=none",
    ]  # place keys (tracking, cache) are not constants of the experiment


def test_two_factors_keep_the_job_order_and_a_swept_input_path_names_the_run() -> None:
    jobs = [[f"chunking={c}", f"retriever.k={k}", "seed=0"] for c in ("fixed", "whole") for k in (3, 10)]
    varying = varying_keys(jobs)
    assert varying == ["chunking", "retriever.k"]
    assert run_name(jobs[1], varying) == "chunking=fixed,retriever.k=10"
    paths = [["corpus.path=/data/a/", "cache_dir=/c1"], ["corpus.path=/data/b", "cache_dir=/c2"]]
    assert varying_keys(paths) == ["corpus.path"]  # a content path names the run, a cache dir never
    # ... by its last component: no run name holds an absolute path
    assert [run_name(j, ["corpus.path"]) for j in paths] == ["corpus.path=a", "corpus.path=b"]


def test_single_run_keeps_its_overrides_and_no_cap_cuts_a_varying_value() -> None:
    assert run_name(["chunking=fixed", "retriever=bm25", "cache_dir=/x"]) == "chunking=fixed,retriever=bm25"
    assert run_name(["cache_dir=/x"]) == "default"
    # a single run on one's own corpus: the place keys (paths) never name it
    own = ["corpus=dir", "corpus.path=/home/me/acme-docs", "evalset=file", "evalset.path=/home/me/ev.jsonl"]
    assert run_name([*own, "chunking=fixed"]) == "corpus=dir,evalset=file,chunking=fixed"
    long_path = "corpus.path=/" + "d" * 260
    single = run_name([long_path, "chunking=fixed", "retriever=bm25"])
    assert single == "chunking=fixed,retriever=bm25"  # the data overrides go first
    many = [f"f{i}=value{i:03d}" for i in range(25)]  # 25 varying factors: over MLflow's 250
    jobs = [many, [o + "x" for o in many]]
    name = run_name(jobs[0], varying_keys(jobs))
    assert len(name) <= MAX_RUN_NAME and all(f"value{i:03d}" in name for i in range(25))


def test_optuna_style_sweeps_vary_their_sweep_overrides() -> None:
    parsed = OverridesParser.create().parse_overrides(
        ["chunking=choice(fixed,whole)", "retriever.k=range(3,6)", "seed=0", "x=a,a", "cache_dir=a,b"]
    )
    assert swept_keys(parsed) == ["chunking", "retriever.k"]


def test_parent_description_lists_the_constants_and_the_command() -> None:
    d = sweep_description(
        {
            "sweep_id": "s1",
            "n_jobs": 5,
            "varying": ["chunking"],
            "constants": ["retriever=bm25"],
            "command": "cmd",
        }
    )
    assert "`chunking`" in d and "- `retriever=bm25`" in d and "    cmd" in d and "5 configs" in d


def test_table_metrics_follow_the_swept_factors() -> None:
    avail = [
        "hit_at_5",
        "mrr",
        "evidence_recall_at_5",
        "hit_at_256tok",
        "evidence_recall_at_256tok",
        "correctness",
        "faithfulness",
        "rate_ok",
        "ndcg_at_10",
    ]
    chunked = table_metrics(avail, ["chunking"])
    assert chunked[:2] == ["evidence_recall_at_256tok", "hit_at_256tok"]
    assert chunked[2:5] == ["hit_at_5", "mrr", "evidence_recall_at_5"]
    assert table_metrics(avail, ["prompt"])[:3] == ["correctness", "faithfulness", "rate_ok"]
    # a generation factor among retrieval ones: only the generation metrics move with every factor
    assert table_metrics(avail, ["retriever", "prompt"])[0] == "correctness"
    assert table_metrics(avail, ["retriever"])[0] == "hit_at_5"
    # compare --sweep's default set: led by the same columns, then the rest in registry order
    lead = sweep_metrics(avail, ["chunking"])
    assert lead[:2] == chunked[:2] and "ndcg_at_10" not in lead and "correctness" in lead


def _att(effects: list[dict]) -> SweepAttribution:
    base = RunData("r0", "chunking=fixed", {"chunking": "fixed"}, {}, None)
    cols = [
        "factor",
        "level",
        "metric",
        "mean_a",
        "mean_b",
        "delta",
        "ci_low",
        "ci_high",
        "p_value",
        "p_holm",
    ]
    return SweepAttribution(
        {"chunking": list(CHUNKERS)},
        base,
        pd.DataFrame(effects, columns=cols),
        pd.DataFrame(),
        pd.DataFrame(),
    )


def test_in_brief_stays_short_and_the_table_marks_significance() -> None:
    rows = []
    for i, lev in enumerate(CHUNKERS[1:]):
        for j, m in enumerate(["hit_at_512tok", "mrr", "rate_retrieval_failure"]):
            sig = (i + j) % 2 == 0
            d = 0.2 if m != "rate_retrieval_failure" else 0.1  # a rise of a failure rate is worse
            rows.append(
                dict(
                    factor="chunking",
                    level=lev,
                    metric=m,
                    mean_a=0.5,
                    mean_b=0.5 + d,
                    delta=d,
                    ci_low=d - 0.1,
                    ci_high=d + 0.1,
                    p_value=0.001,
                    p_holm=0.01 if sig else 0.5,
                )
            )
    base = SimpleNamespace(label="chunking=fixed", metrics={"hit_at_512tok": 0.5})
    att = _att(rows)
    brief = [md_inline(t) for t in in_brief(base, "hit_at_512tok", att)]
    assert len(brief) == 4 and all(len(b) < 400 for b in brief)
    assert "6 of 12 (level, metric) comparisons, 4 better and 2 worse" in brief[-1]
    note, tab = levels_table(base, att)
    assert tab.headers == ["level", "hit_at_512tok", "mrr", "rate_retrieval_failure (↓)"]
    assert [md_inline(r[0]) for r in tab.rows] == [f"chunking={c}" for c in CHUNKERS[1:]]
    cells = [[md_inline(c) for c in r[1:]] for r in tab.rows]
    assert cells[0] == ["**+0.200** *", "+0.200", "**+0.100** *"]


def test_the_experiment_is_named_after_the_corpus_unless_it_is_the_sample() -> None:
    from rag_experiments.core.run_names import experiment_for_corpus
    from rag_experiments.evalset.load import sample_dir

    sample = str(sample_dir() / "docs")
    assert experiment_for_corpus(sample, "ferrymail-docs", sample) == "rag-sample"
    assert experiment_for_corpus(sample + "/", "", sample) == "rag-sample"
    assert experiment_for_corpus("/data/acme-docs/", "", sample) == "acme-docs"
    assert experiment_for_corpus("/data/acme-docs", "Acme handbook", sample) == "Acme handbook"
    assert experiment_for_corpus("/data/pages.jsonl", "", sample) == "pages"
    assert experiment_for_corpus("/data/beir/scifact/corpus.jsonl", None, sample) == "scifact"
    assert experiment_for_corpus(None, None, sample) == "rag-experiments"
