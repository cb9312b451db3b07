"""A sweep is the set of its configs: a config FINISHED by an earlier sweep is reused, counted and
listed in the new sweep (marked reused), and readers of the new sweep see it."""

from __future__ import annotations

import json

from mlflow.tracking import MlflowClient

from rag_experiments.tracking.runs import load_per_query, sweep_children
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


def test_a_config_finished_earlier_is_part_of_the_new_sweep(tmp_path):
    docs, ev = make_tiny(tmp_path, n_items=3)
    base = ["retriever=bm25", "generator=none", *sweep_args(tmp_path, docs, ev)]
    run_sweep(tmp_path, "-m", "retriever.k=1", *base)
    p = run_sweep(tmp_path, "-m", "retriever.k=1,2", *base)
    assert "configs finished 2/2" in p.stdout, p.stdout[-3000:]
    summary = p.stdout[p.stdout.index("configs finished 2/2") :].split("\n\n")[0]
    assert "retriever.k=1 (reused)" in summary and "retriever.k=2" in summary, summary

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp_id = client.get_experiment_by_name("test").experiment_id
    parents = client.search_runs(
        [exp_id], filter_string="tags.is_parent = 'true'", order_by=["attributes.start_time DESC"]
    )
    new_sweep = parents[0].data.tags["sweep_id"]
    children = sweep_children(client, new_sweep)
    ks = sorted("retriever.k=1" in json.loads(c.data.tags["overrides"]) for c in children)
    assert len(children) == 2 and ks == [False, True]  # compare/report/select see both levels
    reused = next(c for c in children if c.data.tags.get("reused_from"))
    assert len(load_per_query(client, reused)) == 3 and reused.data.metrics["hit_at_1"] >= 0
    old_sweep = parents[1].data.tags["sweep_id"]
    assert len(sweep_children(client, old_sweep)) == 1  # the earlier sweep keeps its run

    again = run_sweep(tmp_path, "-m", "retriever.k=1,2", *base)  # the same sweep again: nothing new
    assert "configs finished 2/2" in again.stdout
    assert len(sweep_children(client, new_sweep)) == 2
    assert len(client.search_runs([exp_id], filter_string="tags.is_parent != 'true'")) <= 4
