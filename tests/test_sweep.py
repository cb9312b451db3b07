"""End-to-end retrieval sweeps with the real MiniLM into a real temp MLflow store."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    docs, ev = make_tiny(root)
    base = sweep_args(root, docs, ev) + ["generator=none"]
    first = run_sweep(root, "-m", "chunking=fixed,markdown", "retriever.k=3,5", *base)
    return root, docs, ev, base, first


def _client(root):
    return MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")


def _runs(root):
    c = _client(root)
    exp = c.get_experiment_by_name("test")
    return c, c.search_runs([exp.experiment_id], max_results=1000)


def test_parent_has_one_finished_child_per_config_with_group_choices(grid):
    root, *_ = grid
    c, runs = _runs(root)
    parents = [r for r in runs if r.data.tags.get("is_parent") == "true"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    assert all(r.info.status == "FINISHED" for r in children)
    assert all(r.data.tags["sweep_id"] == parents[0].data.tags["sweep_id"] for r in children)
    combos = {(r.data.params["chunking"], r.data.params["retriever.k"]) for r in children}
    assert combos == {("fixed", "3"), ("fixed", "5"), ("markdown", "3"), ("markdown", "5")}
    for r in children:
        assert r.data.params["embedding"] == "minilm" and r.data.params["generator"] == "none"
        assert "chunking.size" in r.data.params or r.data.params["chunking"] == "markdown"
        for tag in ("config_hash", "corpus_digest", "evalset_digest", "git_commit", "version.mlflow"):
            assert r.data.tags.get(tag), tag


def test_aggregates_equal_means_of_per_query_columns(grid):
    root, docs, ev, *_ = grid
    c, runs = _runs(root)
    n_items = sum(1 for _ in open(ev))
    for r in (r for r in runs if "mlflow.parentRunId" in r.data.tags):
        path = c.download_artifacts(r.info.run_id, "per_query.parquet", str(root / r.info.run_id))
        df = pd.read_parquet(path)
        assert len(df) == n_items and df["id"].is_unique
        k = int(r.data.params["retriever.k"])
        for key in (
            f"hit_at_{k}",
            "mrr",
            f"ndcg_at_{k}",
            f"context_precision_at_{k}",
            "hit_at_1",
            "evidence_recall_at_10",
        ):
            assert r.data.metrics[key] == pytest.approx(np.nanmean(df[key].to_numpy(float)), abs=1e-12), key
            assert r.data.metrics[f"{key}_ci_low"] <= r.data.metrics[key] <= r.data.metrics[f"{key}_ci_high"]
        assert r.data.metrics["n_queries"] == n_items
        assert r.data.metrics["n_unanswerable"] == 1
        retrieved = df["retrieved"].iloc[0]
        assert [x["rank"] for x in retrieved] == list(range(1, len(retrieved) + 1))
        assert {"chunk_id", "doc_id", "start", "end", "score"} <= set(retrieved[0])
        arts = {a.path for a in c.list_artifacts(r.info.run_id)}
        assert {"per_query.json", "per_query.parquet", "config.yaml"} <= arts
        assert c.get_run(r.info.run_id).inputs.dataset_inputs, "eval set logged via log_input"


def test_identical_multirun_resumes_and_adds_no_finished_runs(grid):
    root, docs, ev, base, first = grid
    _, before = _runs(root)
    again = run_sweep(root, "-m", "chunking=fixed,markdown", "retriever.k=3,5", *base)
    _, after = _runs(root)
    assert len([r for r in after if r.info.status == "FINISHED"]) == len(
        [r for r in before if r.info.status == "FINISHED"]
    )
    assert again.stdout.count("[skip]") == 4


def test_k_grid_shares_one_search_and_changed_chunk_size_misses_the_cache(grid):
    root, docs, ev, base, first = grid
    rankings = list((root / "cache" / "rankings").rglob("*.npz"))
    assert len(rankings) == 2, "k=3 and k=5 share one ranking per chunking (searched at the largest k)"
    chunk_files = set((root / "cache" / "chunks").rglob("*.parquet"))
    run_sweep(root, "chunking=fixed", "chunking.size=400", *base)
    new_chunks = set((root / "cache" / "chunks").rglob("*.parquet")) - chunk_files
    assert len(new_chunks) == 1, "a changed chunker parameter must change the chunk cache key"
    assert len(list((root / "cache" / "rankings").rglob("*.npz"))) == 3


def test_bad_input_exits_2_without_any_mlflow_run(tmp_path):
    docs, ev = make_tiny(tmp_path)
    rows = ev.read_text().splitlines()
    bad = json.loads(rows[0])
    bad["gold_evidence"][0]["quote"] = "this sentence is not in the docs"
    ev.write_text("\n".join([json.dumps(bad), *rows[1:]]) + "\n")
    p = run_sweep(tmp_path, *sweep_args(tmp_path, docs, ev), "generator=none", check=False)
    assert p.returncode == 2
    assert f"{ev}:1: gold_evidence[0].quote: not found" in p.stderr
    c = _client(tmp_path)
    exp = c.get_experiment_by_name("test")
    assert exp is None or not c.search_runs([exp.experiment_id])


def test_joblib_launcher_two_workers_share_the_sqlite_store(tmp_path):
    docs, ev = make_tiny(tmp_path, n_items=5)
    p = run_sweep(
        tmp_path,
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "retriever=dense,bm25",
        "retriever.k=3,5",
        *sweep_args(tmp_path, docs, ev),
        "generator=none",
    )
    assert "locked" not in (p.stdout + p.stderr).lower()
    _, runs = _runs(tmp_path)
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(children) == 4 and all(r.info.status == "FINISHED" for r in children)
    assert len({r.data.tags["mlflow.parentRunId"] for r in children}) == 1


def test_mlflow_ui_serves_the_parent_with_its_children_and_metrics(grid, tmp_path):
    """A real `mlflow server` (as the README starts it) and headless Chromium on its runs page."""
    import urllib.request

    from tests.mlflow_ui import chromium, mlflow_server

    root, *_ = grid
    with mlflow_server(root) as base:
        c, runs = _runs(root)
        exp_id = runs[0].info.experiment_id
        req = urllib.request.Request(
            f"{base}/api/2.0/mlflow/runs/search",
            method="POST",
            data=json.dumps({"experiment_ids": [exp_id], "max_results": 100}).encode(),
            headers={"Content-Type": "application/json"},
        )
        served = json.loads(urllib.request.urlopen(req, timeout=30).read())["runs"]
        parent = next(r for r in served if any(t["key"] == "is_parent" for t in r["data"].get("tags", [])))
        children = [
            r
            for r in served
            if any(
                t["key"] == "mlflow.parentRunId" and t["value"] == parent["info"]["run_id"]
                for t in r["data"].get("tags", [])
            )
        ]
        assert len(children) >= 4
        assert all(any(m["key"] == "hit_at_5" for m in r["data"]["metrics"]) for r in children)
        dom = chromium(f"{base}/#/experiments/{exp_id}/runs", tmp_path / "chr")
        assert parent["info"]["run_name"] in dom, "the UI's runs page lists the sweep's parent run"


def test_a_run_that_dies_is_marked_failed_not_left_running(tmp_path):
    docs, ev = make_tiny(tmp_path, n_items=3)
    # a BM25 parameter nested in the hybrid retriever's free-form ``bm25`` mapping: the config
    # schema lets it through and it breaks only once indexing starts, i.e. after the run was created
    p = run_sweep(
        tmp_path,
        *sweep_args(tmp_path, docs, ev),
        "generator=none",
        "retriever=hybrid",
        "+retriever.bm25={k1: not-a-number}",
        check=False,
    )
    assert p.returncode != 0
    _, (run,) = _runs(tmp_path)
    assert run.info.status == "FAILED"
    assert run.data.tags.get("error")


def test_compare_sweep_shows_interactions_of_the_factorial_grid(grid, capsys):
    """chunking × retriever.k is a 2 × 2 full factorial: main effects, the interaction and a
    plain-language line appear (analysis/interactions.py)."""
    from rag_experiments.cli import compare

    root, *_ = grid
    c, runs = _runs(root)
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    code = compare.main(
        ["--sweep", child.data.tags["sweep_id"], "--baseline", child.info.run_id,
         "--tracking-uri", f"sqlite:///{root}/mlflow.db", "--resamples", "199"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "Main effects and two-way interactions (full-factorial grid)" in out
    assert "chunking × retriever.k" in out and "the chunking effect depends on retriever.k" in out
