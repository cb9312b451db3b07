"""Best-config selection: pure tie / noise / constraint logic, and the CLI on a real tiny sweep whose
chosen config is written as YAML and re-run by the sweep with the same config_hash."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

from rag_experiments.analysis.attribution import RunData
from rag_experiments.analysis.gate import non_inferiority
from rag_experiments.analysis.select import Constraints, runnable_config, select_config
from rag_experiments.cli import gate as gate_cli
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
            "retrieved": [[{"start": 0, "end": chunk}] * 5] * n,
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


def test_the_margin_decides_and_the_noise_floor_is_only_reported():
    rng = np.random.default_rng(1)
    base = rng.normal(0.5, 0.05, 80)
    shifted = base - 0.03  # every query worse by exactly 0.03: shown worse, and shown within 0.112
    rep = base + rng.normal(0, 0.2, 80)  # a replicate of "base": A/A interval wider than 0.03
    runs = [_run("base", base, chash="h1"), _run("shifted", shifted, chash="h2")]
    sel = select_config(runs, "m", True, costs=[0.0, 0.0])
    t = sel.table.set_index("config")
    # gate's default margin 1/sqrt(80) = 0.112 > 0.03: non-inferior although significantly worse
    assert sel.margin == pytest.approx(1 / math.sqrt(80))
    assert t.loc["shifted", "tie"] and t.loc["shifted", "worse"]
    assert t.loc["shifted", "ni_bound"] == pytest.approx(-0.03)
    strict = select_config(runs, "m", True, costs=[0.0, 0.0], margin=0.01)
    assert not strict.table.set_index("config").loc["shifted", "tie"] and strict.chosen == "base"
    replicates = [*runs, _run("base-again", rep, chash="h1")]
    noisy = select_config(runs, "m", True, costs=[0.0, 0.0], replicates=replicates, margin=0.01)
    assert noisy.noise_margin is not None and noisy.noise_margin > 0.03 and "replicate" in noisy.noise
    assert not noisy.table.set_index("config").loc["shifted", "tie"]  # the noise floor does not widen it


def test_not_significant_is_not_a_tie_and_underpowered_picks_the_best_mean():
    """The issue-27 case: most configs far below the best but not significantly so at small n.
    The old rule tied them all and took the cheapest; now none is shown non-inferior, the
    selection says it is underpowered and keeps the best mean."""
    rng = np.random.default_rng(3)
    n = 27
    best = (rng.random(n) < 0.8).astype(float)
    runs = [_run("best", best, chunk=500)]
    for i in range(6):  # each ~0.2 below the best: not significant at n = 27 after Holm
        worse = best.copy()
        worse[rng.choice(np.flatnonzero(best == 1), 6, replace=False)] = 0.0
        worse[rng.choice(np.flatnonzero(best == 0), 1, replace=False)] = 1.0
        runs.append(_run(f"small{i}", worse, chunk=10 + i))
    sel = select_config(runs, "m", True, costs=[0.0] * len(runs))
    t = sel.table.set_index("config")
    assert not t.drop("best")["worse"].any()  # the old rule's "tie": nothing shown worse
    assert not t.drop("best")["tie"].any()  # but nothing shown non-inferior either
    u = sel.underpowered
    assert u is not None and u.n_indistinguishable == 6 and u.n_others == 6
    assert u.mde > 0 and u.n_needed is not None and u.n_needed > n
    assert sel.chosen == "best" and sel.tags()["select.underpowered"] == "true"
    msg = u.message()
    assert msg.startswith("UNDERPOWERED") and "6 of 6" in msg and f"n ≈ {u.n_needed}" in msg
    # constraints still apply: the best is too expensive, nothing else is shown non-inferior
    capped = select_config(
        runs, "m", True, costs=[1.0] + [0.0] * 6, constraints=Constraints(max_cost_usd=0.5)
    )
    assert capped.chosen is None and capped.underpowered is not None


def test_underpowered_picks_the_best_mean_among_ties_within_constraints():
    """Two configs within the margin of the best (both tied), the rest indistinguishable: the
    pick is the better-mean tie that meets the constraints, not the cheapest."""
    rng = np.random.default_rng(6)
    n = 100
    best = rng.random(n)
    near_good = best - 0.001
    near_cheap = best - 0.004
    runs = [_run("best", best), _run("near_good", near_good), _run("near_cheap", near_cheap)]
    for i in range(4):  # noisy and far below: neither non-inferior nor (after Holm) worse
        runs.append(_run(f"noisy{i}", best - 0.15 + rng.normal(0, 1.0, n)))
    costs = [0.9, 0.2, 0.1] + [0.0] * 4
    sel = select_config(runs, "m", True, costs=costs, constraints=Constraints(max_cost_usd=0.5))
    t = sel.table.set_index("config")
    # near_*: shown worse (every query lower) and shown within the margin: tied, both true
    assert sel.best == "best" and not t.filter(like="noisy", axis=0)["worse"].any()
    assert t.loc["near_good", "tie"] and t.loc["near_cheap", "tie"]
    assert sel.underpowered is not None and sel.underpowered.n_indistinguishable == 4
    assert sel.chosen == "near_good"  # best mean among tie ∧ ok; "best" costs too much


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(8, 120),
    k=st.integers(2, 6),
    kind=st.sampled_from(["binary", "bounded"]),
    hib=st.booleans(),
)
def test_property_the_pick_passes_gate_against_the_best(seed, n, k, kind, hib):
    """Random sweeps (k configs of random quality, binary or [0, 1] metrics, either direction):
    whatever select chooses passes gate's own non-inferiority test against the best."""
    rng = np.random.default_rng(seed)
    base = rng.random(n)
    runs = []
    for i in range(k):
        shift = rng.normal(0, 0.15)
        x = base + shift + rng.normal(0, rng.uniform(0, 0.5), n)
        vals = (rng.random(n) < np.clip(x, 0, 1)).astype(float) if kind == "binary" else np.clip(x, 0, 1)
        vals[rng.random(n) < 0.05] = np.nan  # unanswerable queries: pairing drops them
        runs.append(_run(f"c{i}", vals, chunk=int(rng.integers(1, 500))))
    costs = list(rng.choice([0.0, 0.01, 0.02], k))
    sel = select_config(runs, "m", hib, costs=costs, seed=seed % 7, n_resamples=499)
    assert sel.chosen is not None  # the best is always tied and there are no constraints
    best = next(r for r in runs if r.run_id == sel.best)
    tied = set(sel.table.loc[sel.table["tie"], "run_id"])
    assert sel.chosen in tied
    for r in runs:  # every tied config (the pick among them) passes gate against the best
        if r.run_id in tied:
            res = non_inferiority(
                best.series("m"), r.series("m"), seed=seed % 7, n_resamples=499, higher_is_better=hib
            )
            assert res.passed, (r.name, res, sel.table)
    if sel.underpowered:  # then the pick is the best mean
        assert sel.chosen == sel.best


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


def test_underpowered_sweep_leads_with_the_warning_and_its_pick_passes_gate(sweep, capsys):
    """7 answerable queries, 4 configs: bm25 misses 2 queries dense finds, which neither shows
    bm25 worse nor non-inferior. select says so first, keeps the best mean, tags the sweep's
    parent run; gate of the pick against the best passes (the issue-27 failure was exit 1)."""
    root, _, _, client, sweep_id = sweep
    assert _main(root, sweep_id, "--metric", "hit_at_5") == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("UNDERPOWERED: this eval set cannot separate the configs")
    assert "indistinguishable from the best" in lines[0] and "MDE" in lines[0] and "n ≈" in lines[0]
    best = next(line for line in lines if "(best)" in line).split(" (best)")[0]
    chosen = next(line for line in lines if line.startswith("chosen:"))
    chosen_id = chosen.split("(run ")[1].split(",")[0]
    runs = {
        r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("test").experiment_id])
    }
    best_id = runs[best].info.run_id
    assert (
        gate_cli.main(
            [
                "--baseline",
                best_id,
                "--candidate",
                chosen_id,
                "--metric",
                "hit_at_5",
                "--tracking-uri",
                f"sqlite:///{root}/mlflow.db",
            ]
        )
        == 0
    )
    assert "GATE PASSED" in capsys.readouterr().out
    parent = client.get_run(runs[best].data.tags["mlflow.parentRunId"])
    assert parent.data.tags["select.underpowered"] == "true"
    assert parent.data.tags["select.metric"] == "hit_at_5"
    assert parent.data.tags["select.chosen"] == chosen_id


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


def test_a_wide_default_margin_is_underpowered_not_a_tie():
    """n = 8: gate's default margin 1/√8 = 0.35 makes every config 'non-inferior'; select says the
    eval set cannot decide (and how many queries would, for ±0.15) instead of calling it a tie."""
    a = np.array([1, 0, 0, 1, 0, 0, 1, 0], float)
    b = a.copy()
    b[0] = 0.0
    sel = select_config([_run("a", a), _run("b", b)], "m", True, costs=[0.0, 0.0])
    assert sel.underpowered is not None and "default margin" in sel.underpowered.message()
    assert "within ±0.15" in sel.underpowered.message()
    assert sel.chosen == "a"  # the best mean, not the cheaper/smaller tie
    explicit = select_config([_run("a", a), _run("b", b)], "m", True, costs=[0.0, 0.0], margin=0.4)
    # an explicit margin is not the wide-default reason (one loss in 8 still cannot show θ > −0.4:
    # P(≤ 1 loss | P(loss) = 0.4) = 0.11, so the score test leaves b indistinguishable)
    assert explicit.underpowered is None or "the default margin 1/√n" not in explicit.underpowered.message()


def test_the_underpowered_count_says_when_same_score_configs_count_once():
    """Configs with the same per-query scores count once in the power line; it says so, with how
    many were compared, so it reads beside the tie set's count of every config (a 12-config sweep
    said '3 of 3 configs indistinguishable' next to '11 indistinguishable')."""
    from types import SimpleNamespace as NS

    from rag_experiments.analysis.select import underpowered

    r = NS(passed=False, mde=0.4, margin=0.1, n_pairs=6)
    keys = [b"a", b"b", b"c", b"a", b"b", b"c", b"a", b"b", b"c", b"a", b"b"]
    u = underpowered([r] * 11, [False] * 11, [0.2] * 11, 0.05, keys=keys, compared=11)
    assert "3 of 3 distinct configs (of 11 compared: configs with the same per-query scores count once)" in u.reasons[1]
    assert "3 of 3 distinct configs (of 11 compared: configs with the same per-query scores count once) are" in u.message()
    plain = underpowered([r] * 3, [False] * 3, [0.2] * 3, 0.05, keys=keys[:3], compared=3)
    assert "3 of 3 configs indistinguishable" in plain.reasons[1] and "distinct" not in plain.message()
