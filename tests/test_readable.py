"""Readable sweeps, end to end: a 5-chunker retrieval-only sweep over the tiny corpus is named by
the chunker alone, its parent describes the constants, and the end-of-sweep table, compare --sweep
and the report lead with the equal-budget metrics in one row per level (issue 21, item 5)."""

from __future__ import annotations

import re

import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.cli import compare
from rag_experiments.report import cli as report_cli
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

CHUNKERS = ("fixed", "markdown", "recursive", "sentence", "whole")
GENERATION_KEYS = ("prompt=", "judge=", "generation_subset=", "replicates=")


@pytest.fixture(scope="module")
def chunker_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("readable")
    docs, ev = make_tiny(root)
    p = run_sweep(
        root,
        "-m",
        f"chunking={','.join(CHUNKERS)}",
        "retriever=bm25",
        "generator=none",
        *sweep_args(root, docs, ev),
    )
    uri = f"sqlite:///{root}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("test")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("is_parent") == "true")
    children = [r for r in runs if r.data.tags.get("is_parent") != "true"]
    return root, uri, parent, children, p.stdout


def test_run_names_hold_only_the_chunker_and_the_parent_the_constants(chunker_sweep):
    _, _, parent, children, _ = chunker_sweep
    assert sorted(c.info.run_name for c in children) == [f"chunking={c}" for c in CHUNKERS]
    note = parent.data.tags["mlflow.note.content"]
    for const in ("retriever=bm25", "generator=none", "corpus=dir", "evalset=file"):
        assert f"- `{const}`" in note
    assert "`chunking`" in note and "chunking=fixed" not in note.split("Command:")[0]
    assert children[0].data.params["retriever"] == "bm25"  # constants stay in the params


def test_end_of_sweep_table_leads_with_the_equal_budget_metrics(chunker_sweep):
    *_, out = chunker_sweep
    table = out.split("configs finished 5/5")[1].split("Open the MLflow UI")[0]
    headers = [h for line in table.splitlines() if line.startswith("run ") for h in line.split()[1:]]
    assert headers[:9] == [
        f"{m}_at_{b}tok" for m in ("evidence_recall", "hit", "token_precision") for b in (256, 512, 1024)
    ]
    assert headers[9:12] == ["hit_at_5", "mrr", "evidence_recall_at_5"]
    labels = {line.split()[0] for line in table.splitlines() if line.startswith("chunking=")}
    assert labels == {f"chunking={c}" for c in CHUNKERS}  # whole names, nothing cut


def test_compare_sweep_prints_one_row_per_level(chunker_sweep, capsys, tmp_path):
    _, uri, parent, children, _ = chunker_sweep
    sweep_id = parent.data.tags["sweep_id"]
    base = ["--sweep", sweep_id, "--baseline", "chunking=fixed", "--tracking-uri", uri, "--resamples", "199"]
    assert compare.main([*base, "--out", str(tmp_path / "wide.md")]) == 0
    capsys.readouterr()
    md = (tmp_path / "wide.md").read_text()
    table = md.split("## Levels vs the baseline")[1].split("\n\n")[0]
    rows = [r for r in table.splitlines() if r.startswith("| chunking=")]
    assert len(rows) == 5 and rows[0].startswith("| chunking=fixed (baseline) |")
    assert table.splitlines()[1].startswith("| level | evidence_recall_at_256tok | evidence_recall_at_512tok")
    assert compare.main([*base, "--long"]) == 0
    long = capsys.readouterr().out
    effects = [
        line for line in long.splitlines() if re.match(r"chunking=\w+\s+\w+_at_|chunking=\w+\s+mrr", line)
    ]
    assert len(effects) >= 4 * 11 and "p_holm" in long  # the long form: one row per (level, metric)


def test_report_in_brief_is_short_with_a_levels_table_and_no_generation_keys(chunker_sweep):
    root, uri, parent, *_ = chunker_sweep
    out = root / "report"
    sweep_id = parent.data.tags["sweep_id"]
    assert (
        report_cli.main(
            [sweep_id, "--tracking-uri", uri, "--out", str(out), "--resamples", "199", "--no-log"]
        )
        == 0
    )
    md = (out / "report.md").read_text()
    question = md.split("## Question")[1].split("## Results per config")[0]
    brief = question.split("In brief:")[1]
    bullets = [line for line in brief.splitlines() if line.startswith("- ")]
    assert 2 <= len(bullets) <= 4 and all(len(b) < 300 for b in bullets)
    levels = [line for line in brief.splitlines() if line.startswith("| chunking=")]
    assert len(levels) == 4  # every level but the baseline, one row each
    assert "| level | evidence_recall_at_256tok |" in brief
    held = question.split("Held fixed:")[1].split("\n")[0]
    assert "retriever=bm25" in held and "generator=none" in held
    assert not any(k in held for k in GENERATION_KEYS), held
    assert "embedding" not in held, held  # BM25 never calls the embedder
    html = (out / "report.html").read_text()
    assert "<th>level</th><th>evidence_recall_at_256tok</th>" in html
