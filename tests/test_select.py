"""Best-config selection: pure tie / noise / constraint logic, and the CLI on a real tiny sweep whose
chosen config is written as YAML and re-run by the sweep with the same config_hash."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from rag_experiments.analysis.attribution import RunData
from rag_experiments.analysis.select import Constraints, runnable_config, select_config
from rag_experiments.cli import select as cli
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args

# ----------------------------------------------------------------------------- pure functions


def _run(name: str, values, latency_s: float = 0.01, k: int = 3, chash: str | None = None, chunk: int = 100):
    n = len(values)
    table = pd.DataFrame(
        {
            "id": [f"q{i}" for i in range(n)],
            "m": np.asarray(values, float),
            "latency_retrieval_s": latency_s,
            "retrieved": [json.dumps([{"start": 0, "end": chunk}] * 5)] * n,
        }
    )
    return RunData(name, name, {"retriever.k": str(k)}, {"config_hash": chash or name}, table)


def test_significantly_worse_is_not_a_tie_and_the_cheapest_tie_wins():
    rng = np.random.default_rng(0)
    best = rng.integers(0, 2, 60).astype(float)
    best[:40] = 1.0
    worse = best.copy()
    worse[:30] = 0.0  # 30 discordant pairs, all against: McNemar p ~ 2e-9
    near = best.copy()
    near[:1] = 0.0  # one query worse: not significant
    runs = [_run("best", best, chunk=300), _run("worse", worse, chunk=10), _run("near", near, chunk=100)]
    sel = select_config(runs, "m", True, costs=[0.0, 0.0, 0.0])
    t = sel.table.set_index("config")
    assert sel.best == "best" and t.loc["best", "tie"] and t.loc["near", "tie"]
    assert not t.loc["worse", "tie"] and t.loc["worse", "p_holm"] < 0.05
    assert t.loc["worse", "delta"] == pytest.approx(-0.5)
    # equal cost: the smaller context wins ("worse" has the smallest context but is not tied)
    assert sel.chosen == "near"
    # cost comes first
    sel = select_config(runs, "m", True, costs=[0.001, 0.0, 0.002])
    assert sel.chosen == "best"
    assert "no A/A noise floor available" in sel.noise and sel.noise_margin is None


def test_lower_is_better_and_constraints():
    good = np.zeros(40)
    bad = np.zeros(40)
    bad[:25] = 1.0
    runs = [_run("bad", bad), _run("good", good, latency_s=2.0)]
    sel = select_config(runs, "m", False, costs=[0.0, 0.0])
    assert sel.best == "good" and sel.chosen == "good"
    assert not sel.table.set_index("config").loc["bad", "tie"]
    sel = select_config(runs, "m", False, costs=[0.0, 0.0], constraints=Constraints(max_latency_ms=100))
    assert sel.chosen is None and sel.notes  # the only tied config is too slow
    lat = sel.table.set_index("config")["latency_p95_ms"]
    assert lat["good"] == pytest.approx(2000.0)
    sel = select_config(runs, "m", False, costs=[0.0, math.nan], constraints=Constraints(max_cost_usd=1.0))
    assert sel.chosen is None  # an unknown cost never passes a cost limit


def test_a_difference_within_the_noise_floor_is_a_tie():
    rng = np.random.default_rng(1)
    base = rng.normal(0.5, 0.05, 80)
    shifted = base - 0.03  # every query worse: sign-flip p tiny
    # two replicate runs of "base" that differ by noise of sd 0.2 per query: A/A CI wider than 0.03
    rep = base + rng.normal(0, 0.2, 80)
    runs = [_run("base", base, chash="h1"), _run("shifted", shifted, chash="h2")]
    no_noise = select_config(runs, "m", True, costs=[0.0, 0.0])
    assert not no_noise.table.set_index("config").loc["shifted", "tie"]
    replicates = [*runs, _run("base-again", rep, chash="h1")]
    sel = select_config(runs, "m", True, costs=[0.0, 0.0], replicates=replicates)
    assert sel.noise_margin is not None and sel.noise_margin > 0.03 and "replicate" in sel.noise
    assert sel.table.set_index("config").loc["shifted", "tie"]


def test_runnable_config_strips_hydra_and_group_defaults():
    primary = "defaults:\n  - retriever: dense\n  - override hydra/job_logging: none\n  - _self_\nhydra:\n  job:\n    chdir: false\n"
    out = yaml.safe_load(runnable_config("hydra: {x: 1}\nretriever: {k: 3}\nseed: 0\n", primary))
    assert out["defaults"] == [{"override hydra/job_logging": "none"}, "_self_"]
    assert out["hydra"] == {"job": {"chdir": False}} and out["retriever"] == {"k": 3}


# ----------------------------------------------------------------------------- a real sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("select")
    docs, ev = make_tiny(root)
    base = sweep_args(root, docs, ev) + ["generator=none"]
    run_sweep(root, "-m", "retriever=bm25,dense", "retriever.k=3,5", *base)
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    exp = client.get_experiment_by_name("test")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    sweep_id = next(r.data.tags["sweep_id"] for r in runs if "sweep_id" in r.data.tags)
    return root, docs, ev, client, sweep_id


def _main(root, *args):
    return cli.main([*args, "--tracking-uri", f"sqlite:///{root}/mlflow.db"])


def test_select_on_a_real_sweep_and_rerun_the_chosen_config(sweep, capsys):
    root, docs, ev, client, sweep_id = sweep
    out_dir = root / "selected"
    assert _main(root, sweep_id, "--metric", "hit_at_5", "--out", str(out_dir), "--name", "best") == 0
    text = capsys.readouterr().out
    assert "McNemar" in text and "no A/A noise floor available" in text and "(best)" in text
    assert sum(f"retriever.k={k}" in line for line in text.splitlines() for k in (3, 5)) >= 4
    chosen_line = next(line for line in text.splitlines() if line.startswith("chosen:"))
    chosen_hash = chosen_line.rsplit("config_hash ", 1)[1].rstrip(")")
    written = yaml.safe_load((out_dir / "best.yaml").read_text())
    assert "_self_" in written["defaults"] and "retriever" in written and "hydra" in written
    # the written config runs unchanged (place keys only: a fresh store, cache and output dirs)
    fresh = root / "rerun"
    fresh.mkdir()
    place = [a for a in sweep_args(fresh, docs, ev) if not a.startswith(("corpus=", "evalset="))]
    p = run_sweep(fresh, "--config-dir", str(out_dir), "--config-name", "best", *place)
    c2 = MlflowClient(f"sqlite:///{fresh}/mlflow.db")
    runs = c2.search_runs([c2.get_experiment_by_name("test").experiment_id])
    hashes = {r.data.tags.get("config_hash") for r in runs} - {None}
    assert hashes == {chosen_hash}, p.stdout[-2000:]


def test_lower_is_better_metric_on_the_sweep(sweep, capsys):
    root, _, _, _, sweep_id = sweep
    assert _main(root, sweep_id, "--metric", "rate_retrieval_failure") == 0
    text = capsys.readouterr().out
    assert "(lower is better)" in text
    rows = [line for line in text.splitlines() if "[" in line and "]" in line and "retriever" in line]
    means = [float(line.split("[")[0].split()[-1]) for line in rows]
    best = next(line for line in rows if "(best)" in line)
    assert len(means) == 4 and float(best.split("[")[0].split()[-1]) == min(means)


def test_constraints_that_nothing_meets_exit_1(sweep, capsys):
    root, _, _, _, sweep_id = sweep
    assert _main(root, sweep_id, "--metric", "hit_at_5", "--max-latency-ms", "0") == 1
    assert "no config is both tied" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["no-such-sweep", "--metric", "hit_at_5"], "unknown sweep"),
        (["SWEEP", "--metric", "recall_at_5"], "not registered"),
        (["SWEEP", "--metric", "faithfulness"], "not in the per-query table"),
        (["SWEEP", "--metric", "n_queries"], "no better side"),
    ],
)
def test_bad_input_exits_2(sweep, capsys, args, message):
    root, _, _, _, sweep_id = sweep
    args = [sweep_id if a == "SWEEP" else a for a in args]
    assert _main(root, *args) == 2
    assert message in capsys.readouterr().err
