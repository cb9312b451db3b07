"""The metric registry: key parsing, directions, docs/metrics.md in sync, every key a real run logs."""

from __future__ import annotations

import importlib
import math
import re

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rag_experiments.evaluation.aggregate import metric_columns
from rag_experiments.evaluation.labels import FAILURE_LABELS
from rag_experiments.evaluation.registry import (
    FORMS,
    REGISTRY,
    higher_is_better,
    metric_keys,
    parse,
    render_key,
    spec,
    wrap,
)
from rag_experiments.judge.validity import build_judge
from rag_experiments.run.run_summary import summary_table
from rag_experiments.stages.generation import OpenAICompatibleGenerator
from tests.llm_fixtures import fake_llm  # noqa: F401  (pytest fixture)
from tests.sweep_helpers import REPO, tiny_inputs, tiny_pipeline

CONF = REPO / "rag_experiments" / "conf"
DOCS = (REPO / "docs" / "metrics.md").read_text()
EXAMPLE = {
    "k": 5,
    "B": 512,
    "label": "ok",
    "stage": "generation",
    "ci": "",
    "ptype": "support_evidence",
    "metric": "faithfulness",
    "component": "query",
    "cell": "unanswerable_declined",
}


def _example(s) -> dict:
    return {p: EXAMPLE[p] for p in s.params}


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("s", REGISTRY, ids=lambda s: s.pattern)
def test_every_pattern_round_trips_in_every_form(s):
    params = _example(s)
    base = s.render(**params)
    forms = [f.name for f in FORMS if s.per_query or f.name in ("mean",) or f.name.startswith("compare")]
    for form in forms:
        key = render_key(s.pattern, form, tag="para/phrase" if form == "by_tag" else None, **params)
        got = parse(key)
        assert got is not None, key
        found, p = got
        assert found is s and p["form"] == form and p["base"] == base, key
        assert {n: p[n] for n in s.params} == params
        if form == "by_tag":
            assert p["tag"] == "para/phrase"
    if not s.per_query:  # a count or a latency has no CI, n_scored or per-tag value
        assert parse(base + "_ci_low") is None and parse("n_scored/" + base) is None


def test_parse_keys_and_rejects():
    assert parse("hit_at_10_ci_high")[1] == {"k": 10, "form": "ci_high", "base": "hit_at_10"}
    assert parse("hit_at_512tok")[0].pattern == "hit_at_{B}tok"
    assert parse("by_tag/multi_hop/ndcg_at_3")[1]["tag"] == "multi_hop"
    assert parse("compare/mrr/p_value")[1]["form"] == "compare_p_value"
    for bad in (
        "hit_at_0",
        "hit_at_k",
        "rate_banana",
        "recall_at_5",
        "by_tag//mrr",
        "mrr_ci_lo",
        "n_scored/",
    ):
        assert parse(bad) is None, bad
    with pytest.raises(KeyError, match="hit_at_x"):
        spec("hit_at_x")
    with pytest.raises(ValueError, match="tag"):
        wrap("mrr", "by_tag")
    with pytest.raises(ValueError, match="missing"):
        render_key("hit_at_{k}")


def test_directions():
    assert higher_is_better("rate_ok") is True
    for lab in ("retrieval_failure", "generation_failure", "correct_without_evidence", "error"):
        assert higher_is_better(f"rate_{lab}") is False, lab
        assert higher_is_better(f"by_tag/exact/rate_{lab}") is False
    assert higher_is_better("hit_at_5_ci_low") is True and higher_is_better("latency_judge_s") is False
    assert higher_is_better("n_errors") is False and higher_is_better("n_queries") is None
    assert {p["label"] for p in (parse(f"rate_{lab}")[1] for lab in FAILURE_LABELS)} == set(FAILURE_LABELS)


def test_metric_keys_order():
    gen = metric_keys([1, 3, 5, 10], 5, generation=True)
    assert gen[:8] == [
        "hit_at_5",
        "evidence_recall_at_5",
        "mrr",
        "context_precision_at_5",
        "ndcg_at_5",
        "hit_at_1",
        "hit_at_3",
        "hit_at_10",
    ]
    assert gen[8:11] == ["faithfulness", "answer_relevance", "correctness"]
    assert gen[11:19] == [  # judge-free (evaluation.answer_metrics)
        "answer_token_f1",
        "answer_exact_match",
        "citation_precision",
        "citation_recall",
        "rate_uncited_answer",
        "rate_over_refusal",
        "rate_false_answer",
        "answer_context_overlap",
    ]
    assert gen[19:] == [
        "rate_retrieval_failure",
        "rate_generation_failure",
        "rate_ok",
        "rate_correct_without_evidence",
    ]
    assert metric_keys([1, 3], 3, generation=False)[-1] == "rate_retrieval_failure"
    assert "faithfulness" not in metric_keys([1, 3], 3, generation=False)


# ----------------------------------------------------------------------------- docs/metrics.md


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_every_definition_is_in_the_docs():
    docs = _flat(DOCS)
    missing = [s.pattern for s in REGISTRY if _flat(s.definition) not in docs]
    assert not missing, f"definitions not in docs/metrics.md: {missing}"


def test_the_docs_name_the_function_each_metric_is_computed_by():
    """The "computed by" column: a declared function is named as declared, and every dotted name in
    the column (declared or bookkeeping) is importable, so a moved function cannot leave it stale."""
    table = DOCS.split("## Registered metrics")[1].split("\n## ")[0]
    cells = dict(re.findall(r"^\| `([^`]+)` \|.*\| ([^|]+) \|$", table, flags=re.M))
    for s in REGISTRY:
        if s.compute is not None:
            assert cells[s.pattern].startswith(f"`{s.compute.removeprefix('rag_experiments.')}`"), s.pattern
    for cell in cells.values():
        for path in re.findall(r"`([a-z_][\w]*(?:\.[A-Za-z_]\w*)+)`", cell):
            module, _, name = f"rag_experiments.{path}".rpartition(".")
            try:
                getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                importlib.import_module(f"rag_experiments.{path}")  # a module named as a whole


def test_every_metric_key_in_the_docs_is_registered():
    table = DOCS.split("## Registered metrics")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)
    assert rows == [s.pattern for s in REGISTRY]  # one row per pattern, in registry order
    # every other key-like name in the text: substitute the placeholders, then it must parse
    subst = {
        "{k}": "5",
        "{B}": "512",
        "{label}": "ok",
        "{stage}": "generation",
        "{tag}": "x",
        "{key}": "mrr",
        "…": "compare/mrr",
    }
    keyish = re.compile(
        r"^(?:[a-z_]+_at_[\w{}]+|rate_[a-z_{}]+|n_[a-z_]+|latency_[a-z_]+|(?:by_tag|n_scored|compare)/.+)$"
    )
    names = {n for n in re.findall(r"`([^`\s]+)`", DOCS) if keyish.match(n)}
    assert len(names) > 20
    unregistered = []
    for n in names:
        key = n
        for a, b in subst.items():
            key = key.replace(a, b)
        if parse(key) is None:
            unregistered.append(n)
    assert not unregistered, f"docs/metrics.md names unregistered keys: {unregistered}"


# ----------------------------------------------------------------------------- a real run's keys


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_inputs(tmp_path_factory.mktemp("registry"), n_items=5)


def _run(tiny, generator=None, judge=None):
    prompt = instantiate(OmegaConf.load(CONF / "prompt" / "concise.yaml")) if generator else None
    return tiny_pipeline(tiny, ks=(1, 3, 5), generator=generator, prompt=prompt, judge=judge)


def _check_run(res, generation: bool):
    agg, df = res.aggregates, res.per_query
    for key in agg:  # every logged key is registered and renders back to itself
        got = parse(key)
        assert got is not None, f"logged key {key!r} is not registered"
        s, p = got
        params = {n: p[n] for n in s.params}
        assert render_key(s.pattern, p["form"], tag=p.get("tag"), **params) == key
    floats = [c for c in df.columns if df[c].dtype.kind == "f"]
    assert floats and all(parse(c) is not None for c in floats), floats
    assert set(metric_columns(df)) == {c for c in floats if spec(c).per_query}
    shown = [k for k in metric_keys([1, 3, 5], 3, generation) if k in agg]
    assert ("faithfulness" in shown) == generation and "hit_at_3" in shown
    text = summary_table(agg, 3, [1, 3, 5])
    assert all(f"\n{k} " in text for k in shown)
    assert ("-- generation" in text) == generation and "-- failure labels" in text


def test_retrieval_only_run_logs_only_registered_keys(tiny):
    res = _run(tiny)
    _check_run(res, generation=False)
    assert "rate_ok" not in res.aggregates and "n_scored/rate_retrieval_failure" in res.aggregates


def test_generating_run_logs_only_registered_keys(tiny, fake_llm):  # noqa: F811
    judge = build_judge("heuristic")
    gen = OpenAICompatibleGenerator(base_url=fake_llm.base_url, model="garbage", max_retries=0, timeout_s=10)
    res = _run(tiny, gen, judge)
    _check_run(res, generation=True)
    agg = res.aggregates
    # the judge really ran (the fake model's "banana split" has no scorable claim: faithfulness NaN)
    assert not math.isnan(agg["answer_relevance"]) and agg["n_scored/correctness"] >= 1
    assert "faithfulness" in agg and "n_claims" in res.per_query
    assert sum(agg[f"rate_{lab}"] for lab in ("ok", "retrieval_failure", "generation_failure")) <= 1.0


def test_every_compute_resolves_to_its_function_and_names_declared_columns(tmp_path):
    """``MetricSpec.compute`` is a dotted path to a callable of that name; ``columns`` names only
    columns the per-query table declares (core/query_table.py) or registered per-query metrics; on
    a real retrieval run every column a present retrieval metric needs is in the table, as the
    declared Python data."""
    from rag_experiments.core.query_table import COLUMNS, NESTED, cell

    with_compute = [s for s in REGISTRY if s.compute]
    assert len(with_compute) >= 40
    for s in with_compute:
        f = s.function()
        assert callable(f), s.pattern
        assert f.__name__ == s.compute.rpartition(".")[2], (s.pattern, s.compute, f.__name__)
        for col in s.columns:
            found = parse(col)
            assert col in COLUMNS or (found is not None and found[0].per_query), (s.pattern, col)
    assert {s.pattern for s in REGISTRY if "retrieved" in s.columns} >= {"hit_at_{k}", "mrr", "ndcg_at_{k}"}
    assert spec("faithfulness").columns == ("verdicts",)
    assert all(not s.columns for s in REGISTRY if s.compute is None)

    df = tiny_pipeline(tiny_inputs(tmp_path, n_items=4)).per_query
    present = [spec(c) for c in df.columns if parse(c) is not None]
    needed = {col for s in present for col in s.columns}
    assert needed >= {"retrieved", "gold_spans"} and needed <= set(df.columns)
    for col in needed & set(NESTED):
        assert all(isinstance(v, list) and cell(col, v) == v for v in df[col]), col
