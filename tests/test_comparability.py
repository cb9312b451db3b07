"""Every metric declares when it is comparable (issue 37 item 1): the rule on logged params and
tags, its documentation, and the CLIs on a real chunking × retriever sweep of the bundled sample."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.analysis.comparability import (
    budget,
    comparability,
    comparable_defaults,
    comparable_only,
    default_metric,
)
from rag_experiments.cli import compare as compare_cli
from rag_experiments.cli import gate as gate_cli
from rag_experiments.cli import select as select_cli
from rag_experiments.core.run_record import RunData
from rag_experiments.evaluation.registry import REGISTRY
from rag_experiments.report import cli as report_cli
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

DOCS = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
BUDGETED = ["evidence_recall_at_256tok", "evidence_recall_at_512tok", "hit_at_5", "mrr"]


def _run(name: str, chunking: str = "markdown", retriever: str = "bm25", **extra) -> RunData:
    params = {"chunking": chunking, "retriever": retriever, **extra.pop("params", {})}
    return RunData(name, name, params, tags=extra.pop("tags", {}), metrics=extra.pop("metrics", {}))


def test_chunk_counting_metrics_are_incomparable_only_when_the_chunks_differ():
    whole, md = _run("a", "whole"), _run("b", "markdown", params={"chunking.max_size": "1200"})
    c = comparability("hit_at_5", [whole, md], BUDGETED)
    assert not c.comparable and c.factor == "chunks" and c.instead == "evidence_recall_at_256tok"
    assert "chunking=whole" in c.message() and "--allow-incomparable" in c.message()
    for m in ("mrr", "ndcg_at_5", "context_precision_at_5", "evidence_recall_at_3", "hit_at_5_ci_low"):
        assert not comparability(m, [whole, md], BUDGETED).comparable, m
    # equal-budget metrics and the retriever, embedding, reranker: the same chunks
    assert comparability("evidence_recall_at_512tok", [whole, md], BUDGETED).comparable
    same_chunks = [_run("c", retriever="bm25"), _run("d", retriever="dense", params={"embedding": "bge"})]
    assert comparability("hit_at_5", same_chunks, BUDGETED).comparable
    # a chunking.* key alone breaks it too
    sizes = [_run("e", params={"chunking.size": "400"}), _run("f", params={"chunking.size": "800"})]
    assert comparability("mrr", sizes, BUDGETED).factor == "chunks"


def test_the_substitute_budget_comes_from_what_was_logged():
    assert budget(["evidence_recall_at_1024tok", "evidence_recall_at_512tok"]) == 512
    assert budget([], [_run("a", params={"metrics.token_budgets": "[128, 512]"})]) == 128
    assert budget([]) == 256


def test_judge_metrics_break_across_judges_and_label_rates_across_judge_none():
    def gen(name, judge, ident):
        return _run(name, params={"judge": judge}, tags={"judge_identity": ident})

    h, llm, none = gen("h", "heuristic", "h1"), gen("l", "llm", "l1"), gen("n", "none", "None")
    assert comparability("faithfulness", [h, llm]).factor == "judge"
    assert comparability("faithfulness", [h, llm]).instead is None
    assert comparability("correctness", [h, llm]).comparable  # key facts: no judge
    assert comparability("hit_at_5", [h, llm]).comparable
    # judge=none: the failure label rests on correctness only, so rate_ok moves with the rule
    assert comparability("rate_ok", [h, none]).factor == "judge"
    assert comparability("rate_ok", [h, gen("h2", "heuristic", "h1")]).comparable
    retrieval_only = _run("r")
    assert comparability("rate_ok", [h, retrieval_only]).comparable  # not part of the judge rule


def test_weak_key_facts_hook():
    # runs that leave weak facts out of correctness log how many they left out (0 included); a
    # generating run without the count was scored when correctness still credited them
    new = _run("n", metrics={"correctness": 0.5, "n_weak_key_facts": 3.0})
    old = _run("o", metrics={"correctness": 0.7})
    c = comparability("correctness", [new, old], ["answer_token_f1"])
    assert c.factor == "key_facts" and c.instead == "answer_token_f1" and "weak key facts" in c.detail
    assert comparability("correctness", [new, _run("m", metrics={"correctness": 0.4, "n_weak_key_facts": 0.0})]).comparable
    assert comparability("correctness", [_run("y"), _run("x")]).comparable  # retrieval only


def test_defaults_choose_comparable_metrics():
    runs = [_run("a", "whole"), _run("b", "markdown")]
    kept, notes = comparable_only(["evidence_recall_at_256tok", "hit_at_5", "mrr"], runs, BUDGETED)
    assert kept == ["evidence_recall_at_256tok"] and len(notes) == 1 and "hit_at_5, mrr" in notes[0]
    gated, notes = comparable_defaults(["hit_at_5", "mrr", "faithfulness"], runs, BUDGETED + ["faithfulness"])
    assert gated == ["evidence_recall_at_256tok", "faithfulness"] and len(notes) == 2
    assert default_metric(runs, BUDGETED) == "evidence_recall_at_256tok"


def test_the_docs_list_every_metric_with_a_break():
    table = DOCS.split("## Comparability")[1].split("\n## ")[0]
    rows = dict(re.findall(r"^\| `([^`]+)` \| ([a-z_, ]+) \|$", table, flags=re.M))
    assert rows == {s.pattern: ", ".join(s.breaks) for s in REGISTRY if s.breaks}


# ----------------------------------------------------------------------------- a real sweep


@pytest.fixture(scope="module")
def chunk_sweep(tmp_path_factory):
    """chunking = whole, markdown × retriever = bm25, dense on the bundled sample, retrieval only."""
    root = tmp_path_factory.mktemp("comparability")
    docs, ev = make_tiny(root)
    args = sweep_args(root, docs, ev) + ["generator=none"]
    run_sweep(root, "-m", "chunking=whole,markdown", "retriever=bm25,dense", *args)
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("test").experiment_id], max_results=100)
    sweep_id = next(r.data.tags["sweep_id"] for r in runs if "sweep_id" in r.data.tags)
    by_name = {r.info.run_name: r.info.run_id for r in runs if r.data.tags.get("mlflow.parentRunId")}
    return root, sweep_id, by_name


def _uri(root) -> list[str]:
    return ["--tracking-uri", f"sqlite:///{root}/mlflow.db"]


def test_select_refuses_hit_at_5_on_a_chunking_sweep_and_names_an_equal_budget_metric(chunk_sweep, capsys):
    root, sweep_id, _ = chunk_sweep
    assert select_cli.main([sweep_id, "--metric", "hit_at_5", *_uri(root)]) == 2
    err = capsys.readouterr().err
    assert "hit_at_5 is not comparable" in err and "Use evidence_recall_at_256tok instead" in err
    assert select_cli.main([sweep_id, "--metric", "hit_at_5", "--allow-incomparable", *_uri(root)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("note: --allow-incomparable: hit_at_5 compared across configs where the chunks differ")
    # the default: a comparable metric, said first
    assert select_cli.main([sweep_id, *_uri(root)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("metric evidence_recall_at_256tok: the default")
    assert "metric evidence_recall_at_256tok (higher is better)" in out


def test_gate_compare_and_report_apply_the_same_rule(chunk_sweep, capsys, tmp_path):
    root, sweep_id, runs = chunk_sweep
    whole, md = runs["chunking=whole,retriever=bm25"], runs["chunking=markdown,retriever=bm25"]
    pair = ["--baseline", md, "--candidate", whole, *_uri(root)]
    assert gate_cli.main([*pair, "--metric", "hit_at_5"]) == 2
    assert "Use evidence_recall_at_256tok" in capsys.readouterr().err
    assert gate_cli.main([*pair, "--metric", "hit_at_5", "--allow-incomparable"]) in (0, 1)
    assert "note: --allow-incomparable: hit_at_5" in capsys.readouterr().out
    gate_cli.main(pair)  # the defaults: hit_at_5 and mrr replaced, said so
    out = capsys.readouterr().out
    assert "default metric hit_at_5 → evidence_recall_at_256tok" in out
    assert not re.search(r"^(hit_at_5|mrr) ", out, flags=re.M)
    # retriever only: the same chunks, hit_at_5 gated as asked
    dense = runs["chunking=markdown,retriever=dense"]
    assert gate_cli.main(["--baseline", md, "--candidate", dense, "--metric", "hit_at_5", *_uri(root)]) in (0, 1)
    capsys.readouterr()
    assert compare_cli.main([md, whole, "--metric", "mrr", *_uri(root)]) == 2
    assert compare_cli.main([md, whole, *_uri(root)]) == 0
    out = capsys.readouterr().out
    assert "left out, not comparable across the configs" in out and "p_holm (Holm over " in out
    assert compare_cli.main(["--sweep", sweep_id, *_uri(root)]) == 0
    out = capsys.readouterr().out
    assert "left out, not comparable" in out and not re.search(r"\bhit_at_5\b(?!,| \()", out.split("Sweep attribution")[1])
    assert report_cli.main([sweep_id, "--metric", "hit_at_5", "--no-log", "--out", str(tmp_path / "r"), *_uri(root)]) == 2
    assert report_cli.main([sweep_id, "--no-log", "--out", str(tmp_path / "r"), *_uri(root)]) == 0
    assert "primary metric: evidence_recall_at_256tok" in capsys.readouterr().out


# ----------------------------------------------------------------------------- run-id prefixes (item 7)


def test_a_prefix_picks_one_run_and_an_ambiguous_one_names_the_candidates():
    from rag_experiments.tracking.runs import RunInputError, is_id_prefix, pick_by_prefix

    runs = [("abcd1234" + "0" * 24, "name=a"), ("abcd9999" + "0" * 24, "name=b")]
    assert pick_by_prefix("abcd12", runs) == runs[0][0]
    assert pick_by_prefix("ffff", runs) is None
    with pytest.raises(RunInputError, match="ambiguous") as e:
        pick_by_prefix("abcd", runs)
    assert runs[0][0] in str(e.value) and runs[1][0] in str(e.value)
    assert is_id_prefix("abcd1234") and not is_id_prefix("abc") and not is_id_prefix("chunking=whole")


def test_the_8_character_ids_select_prints_work_in_gate_compare_and_report(chunk_sweep, capsys, tmp_path):
    """gate rejected the 8-character run ids select, compare and docs/select.md print (issue 37)."""
    root, sweep_id, runs = chunk_sweep
    md, dense = runs["chunking=markdown,retriever=bm25"][:8], runs["chunking=markdown,retriever=dense"][:8]
    assert gate_cli.main(["--baseline", md, "--candidate", dense, "--metric", "hit_at_5", *_uri(root)]) in (0, 1)
    out = capsys.readouterr().out
    assert f"({md})" in out and f"({dense})" in out
    assert compare_cli.main([md, dense, "--metric", "hit_at_5", *_uri(root)]) == 0
    assert compare_cli.main(["--sweep", sweep_id, "--baseline", md, *_uri(root)]) == 0
    assert "baseline: chunking=markdown, retriever=bm25 (given with --baseline)" in capsys.readouterr().out
    rep = ["--no-log", "--out", str(tmp_path / "r"), *_uri(root)]
    assert report_cli.main([sweep_id, "--baseline", md, *rep]) == 0
    assert "given with --baseline" in capsys.readouterr().out
    assert gate_cli.main(["--baseline", "0000ffff", "--candidate", dense, *_uri(root)]) == 2
    assert "no run with that id, id prefix or name" in capsys.readouterr().err


def test_human_lines_lead_with_labels_and_name_unvalidated_judge_metrics_once():
    from rag_experiments.analysis.comparability import human_lines

    def judged(name, **metrics):
        return _run(name, params={"judge": "heuristic"}, tags={"judge_identity": "h1"}, metrics=metrics)

    plain = [judged("a"), judged("b")]
    lines = human_lines(["faithfulness", "answer_relevance", "hit_at_5", "correctness"], plain)
    assert len(lines) == 1 and lines[0].startswith("UNVALIDATED: faithfulness, answer_relevance are the judge's")
    assert human_lines("hit_at_5", plain) == [] and human_lines("faithfulness", [_run("r")]) == []
    fig = {"spotcheck/ppi_faithfulness": 0.168, "spotcheck/ppi_faithfulness_ci_low": 0.05,
           "spotcheck/ppi_faithfulness_ci_high": 0.3, "spotcheck/judge_faithfulness": 0.432,
           "spotcheck/kappa": -0.24, "spotcheck/n": 20}  # fmt: skip
    lines = human_lines("faithfulness", [judged("a", **fig), judged("b")])
    assert lines[0].startswith("human-corrected faithfulness (PPI, primary) of a: 0.168 [0.050, 0.300]")
    assert "judge-only" in lines[0] and "human κ -0.24" in lines[0]
    assert lines[1] == "no human labels on b: their faithfulness is the judge's alone"


def test_a_pick_the_human_labels_contradict_is_flagged():
    from rag_experiments.analysis.judge_trust import ppi_contradiction

    def m(v, lo, hi):
        return {"spotcheck/ppi_faithfulness": v, "spotcheck/ppi_faithfulness_ci_low": lo,
                "spotcheck/ppi_faithfulness_ci_high": hi}  # fmt: skip

    runs = [("a", m(0.17, 0.05, 0.30)), ("b", m(0.60, 0.45, 0.75)), ("c", m(0.25, 0.10, 0.40))]
    warn = ppi_contradiction("faithfulness", "a", runs)
    assert warn is not None and "b above a" in warn and "c" not in warn.split("contradicts the pick:")[1].split(" above")[0]
    assert ppi_contradiction("faithfulness", "c", runs[2:] + runs[:1]) is None  # overlapping CIs
    assert ppi_contradiction("faithfulness", "x", runs) is None  # the pick has no labels


def test_a_substitute_the_runs_never_logged_is_said_to_need_a_rerun():
    runs = [_run("a", "whole"), _run("b", "fixed")]
    assert "these runs did not log it" in comparability("hit_at_5", runs, ["hit_at_5"]).message()
    assert "did not log" not in comparability("hit_at_5", runs, BUDGETED).message()
