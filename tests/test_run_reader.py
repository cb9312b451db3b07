"""The run reader is the seam (issue 28 item 5): the same runs, written into a real sqlite MLflow
store and into a ``MemoryStore``, give compare (pairwise and --sweep), gate, select and plan the
same answers through ``MlflowRunReader`` and ``MemoryRunReader``."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.cli import compare, compare_sweep, gate, plan, select
from rag_experiments.evaluation.labels import RATE_LABELS
from rag_experiments.tracking.memory import MemoryStore
from rag_experiments.tracking.run_reader import MemoryRunReader, MlflowRunReader, RunReader
from rag_experiments.tracking.runs import RunInputError

N = 60
IDS = [f"q{i:02d}" for i in range(N)]
SWEEP = "sweep-seam"
BASE = {"chunking": "fixed", "embedding": "minilm", "retriever": "dense", "retriever.k": "5", "generator": "none"}
# (name, chunking.size, P(hit), status, config_hash): 256 has a replicate, 1024 only failed
CHILDREN = [
    ("chunking.size=128", "128", 0.55, "FINISHED", "h128"),
    ("chunking.size=256", "256", 0.70, "FINISHED", "h256"),
    ("chunking.size=512", "512", 0.72, "FINISHED", "h512"),
    ("chunking.size=256", "256", 0.70, "FINISHED", "h256"),  # a re-run of the same config
    ("chunking.size=1024", "1024", 0.60, "FAILED", "h1024"),
]


def _table(p: float, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    hits = (rng.random(N) < p).astype(float)
    labels = np.where(hits == 1, "ok", "retrieval_failure")
    return pd.DataFrame(
        {
            "id": IDS,
            "query": [f"question {i}?" for i in range(N)],
            "tags": [["a"] if i % 2 else ["b"] for i in range(N)],
            "hit_at_1": hits * (np.arange(N) % 2),
            "hit_at_5": hits,
            "mrr": hits * rng.uniform(0.3, 1.0, N),
            "failure_label": labels,
            "latency_retrieval_s": rng.uniform(0.01, 0.03, N),
            **{f"rate_{lab}": (labels == lab).astype(float) for lab in RATE_LABELS},
        }
    )


def _runs():
    """(name, parent?, status, start ms, params, tags, metrics, table, artifacts) in start order."""
    out = [("sweep", True, "FINISHED", 1_000, {}, {"is_parent": "true", "sweep_id": SWEEP}, {}, None, {})]
    for i, (name, size, p, status, chash) in enumerate(CHILDREN):
        table = _table(p, seed=i if i != 3 else 1)  # the replicate: the same answers as its first run
        tags = {"sweep_id": SWEEP, "config_hash": chash, "evalset_digest": "ev1", "corpus_digest": "c1"}
        metrics = {"hit_at_5": float(table["hit_at_5"].mean()), "cost_usd": 0.001 * int(size) / 128}
        params = {**BASE, "chunking.size": size}
        art = {"config.yaml": f"chunking:\n  size: {size}\n"}
        out.append((name, False, status, 2_000 + 1_000 * i, params, tags, metrics, table, art))
    return out


@pytest.fixture(scope="module")
def readers(tmp_path_factory) -> dict[str, RunReader]:
    tmp = tmp_path_factory.mktemp("seam")
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("seam", artifact_location=str(tmp / "mlruns"))
    mem = MemoryStore()
    parent_ml = parent_mem = None
    for name, is_parent, status, start, params, tags, metrics, table, arts in _runs():
        tags_ml = {**tags, **({"mlflow.parentRunId": parent_ml} if not is_parent else {})}
        run = client.create_run(exp, start_time=start, run_name=name, tags=tags_ml)
        rid = run.info.run_id
        for k, v in params.items():
            client.log_param(rid, k, v)
        for k, v in metrics.items():
            client.log_metric(rid, k, v)
        if table is not None:
            path = tmp / rid / "per_query.parquet"
            path.parent.mkdir()
            table.to_parquet(path)
            client.log_artifact(rid, str(path))
        for a, text in arts.items():
            client.log_text(rid, text, a)
        client.set_terminated(rid, status=status)
        stored = mem.new_run(name, "seam", None if is_parent else parent_mem)
        stored.start_time, stored.status = start / 1000, status
        stored.params, stored.tags, stored.metrics = dict(params), dict(tags), dict(metrics)
        stored.table, stored.artifacts = (None if table is None else table.copy()), dict(arts)
        if is_parent:
            parent_ml, parent_mem = rid, stored.run_id
    return {"mlflow": MlflowRunReader(uri), "memory": MemoryRunReader(mem)}


def _ids_out(text: str, reader: RunReader) -> str:
    """``text`` with every run label and id of the reader's runs replaced by the run's name and
    start order: the two stores name runs alike, they do not number them alike."""
    runs = reader.sweep_config_runs(SWEEP) + reader.sweep_finished_runs(SWEEP)
    for r in runs:
        text = text.replace(r.label, f"<{r.name}@{r.start_time}>").replace(r.run_id, f"<{r.start_time}>")
    return text


def both(readers, fn):
    return [fn(readers[k]) for k in ("mlflow", "memory")]


def test_sweep_listing_and_resolve_agree(readers):
    def listing(rd):
        return [
            [(r.name, r.status, r.start_time, r.tags["config_hash"], r.metrics) for r in runs]
            for runs in (rd.sweep_children(SWEEP), rd.sweep_config_runs(SWEEP), rd.sweep_finished_runs(SWEEP))
        ]

    ml, mem = both(readers, listing)
    assert ml == mem
    children, configs, finished = ml
    assert [c[3] for c in children] == ["h128", "h512", "h256"]  # the re-run of 256 supersedes the first
    assert [c[3] for c in configs] == ["h128", "h512", "h256", "h1024"] and configs[-1][1] == "FAILED"
    assert len(finished) == 4
    got = both(readers, lambda rd: rd.resolve("chunking.size=128"))
    assert got[0].params == got[1].params and got[0].label.split(" (")[0] == got[1].label.split(" (")[0]
    assert got[0].parent_id and got[1].parent_id
    for rd in readers.values():
        with pytest.raises(RunInputError, match="is ambiguous; pass one of these run ids"):
            rd.resolve("chunking.size=256")
        with pytest.raises(RunInputError, match="unknown run 'nope' in experiment 'seam'"):
            rd.resolve("nope", "seam")
        with pytest.raises(RunInputError, match="unknown experiment 'other'"):
            rd.resolve("nope", "other")
        assert rd.text(rd.resolve("chunking.size=512"), "config.yaml") == "chunking:\n  size: 512\n"
    pd.testing.assert_frame_equal(*both(readers, lambda rd: rd.per_query(rd.resolve("chunking.size=512"))))


def test_compare_pairwise_is_identical(readers):
    def run(rd):
        comp = compare.build_comparison(
            rd, rd.resolve("chunking.size=128"), rd.resolve("chunking.size=512"), n_resamples=499
        )
        return comp, _ids_out(compare.render(comp, markdown=True), rd)

    (cm, tm), (cx, tx) = both(readers, run)
    assert [(r.metric, r.delta, r.ci_low, r.ci_high, r.p_value, r.p_holm) for r in cm.results] == [
        (r.metric, r.delta, r.ci_low, r.ci_high, r.p_value, r.p_holm) for r in cx.results
    ]
    assert cm.results and cm.diff == cx.diff == {"chunking.size": ("128", "512")}
    assert tm == tx


def test_compare_sweep_is_identical(readers):
    def run(rd):
        sc = compare_sweep.build_sweep_comparison(rd, SWEEP, n_resamples=499)
        text = compare_sweep.render_sweep(sc.attribution, SWEEP, True, sc.interactions, sc.stopped, sc.why)
        return sc, _ids_out(text, rd)

    (sm, tm), (sx, tx) = both(readers, run)
    assert sm.base.name == sx.base.name and sm.why == sx.why and sm.metrics == sx.metrics
    eff = [sc.attribution.effects.drop(columns=[c for c in ("run_id",) if c in sc.attribution.effects]) for sc in (sm, sx)]
    pd.testing.assert_frame_equal(*eff)
    assert not eff[0].empty
    assert tm == tx


def test_gate_is_identical(readers):
    def run(rd):
        res, notes = gate.run_gate(
            rd, "chunking.size=512", "chunking.size=128", ["hit_at_5", "mrr"], n_resamples=499,
            allow_incomparable=True,  # chunk sizes differ: the seam, not the metric, is under test
        )  # fmt: skip
        return [(r.metric, r.delta, r.bound, r.margin, r.n_pairs, r.verdict) for r in res], notes[1:]

    ml, mem = both(readers, run)
    assert ml == mem and ml[0][0][0] == "hit_at_5"


def test_select_is_identical(readers):
    args = argparse.Namespace(
        sweep=SWEEP, metric="hit_at_5", max_latency_ms=None, max_cost_usd=None, alpha=0.05, margin=None,
        resamples=499, experiment=None, seed=0, allow_judge_change=False, allow_incomparable=True,
    )  # fmt: skip

    def run(rd):
        verdict, by_id = select.run_select(rd, args)
        sel = verdict.selection
        names = {rid: f"{r.name}@{r.start_time}" for rid, r in by_id.items()}
        t = sel.table.drop(columns="run_id")
        return t, names[sel.best], names.get(sel.chosen), _ids_out(select.render(verdict), rd)

    (tm, bm, cm, rm), (tx, bx, cx, rx) = both(readers, run)
    pd.testing.assert_frame_equal(tm, tx)
    assert (bm, cm) == (bx, cx) and rm == rx
    assert len(tm) == 3  # the three configs that finished; the replicate feeds the noise floor


def test_plan_is_identical(readers):
    args = plan.build_parser().parse_args(["--pilot", "chunking.size=512", "--experiment", "seam"])
    ml, mem = both(readers, lambda rd: _ids_out(plan.run_plan(args, rd), rd))
    assert ml == mem and "hit_at_5" in ml and ml.startswith("pilot <chunking.size=512@4000>")


def test_missing_table_or_artifact_is_bad_input_in_both(readers):
    for rd in readers.values():
        parent = rd.get(rd.sweep_children(SWEEP)[0].parent_id)
        assert parent is not None and parent.tags["is_parent"] == "true"
        with pytest.raises(RunInputError, match=r"has no per_query\.parquet artifact"):
            rd.per_query(parent)
        with pytest.raises(RunInputError, match=r"has no nope\.txt artifact"):
            rd.text(parent, "nope.txt")
        assert rd.get("f" * 32) is None
        assert rd.experiment_name(parent.experiment_id) == "seam"
