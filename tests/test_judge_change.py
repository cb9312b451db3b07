"""compare / gate / select refuse runs scored by different judges unless --allow-judge-change."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.cli import compare, gate
from rag_experiments.cli import select as select_cli
from rag_experiments.tracking.judge_runs import check_same_judge, run_judge
from rag_experiments.tracking.runs import RunInputError

N = 60
IDS = [f"q{i:02d}" for i in range(N)]


def _table(shift: float) -> pd.DataFrame:
    hits = np.array([1.0 if i % 3 else 0.0 for i in range(N)])
    return pd.DataFrame(
        {
            "id": IDS,
            "query": [f"q {i}" for i in range(N)],
            "tags": [["x"]] * N,
            "hit_at_5": hits,
            "mrr": hits / 2,
            "faithfulness": np.clip(np.where(hits == 1, 0.8, 0.5) + shift, 0, 1),
            "failure_label": ["ok"] * N,
            "error": [None] * N,
        }
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("judges")
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("rag", artifact_location=str(tmp / "mlruns"))
    parent = client.create_run(exp, run_name="parent", tags={"sweep_id": "sw"}).info.run_id

    def log(name, judge, ident, shift, sweep=None, tags=None):
        base = {"evalset_digest": "e1", "config_hash": name, "judge_model": "None", **(tags or {})}
        if ident:
            base["judge_identity"] = ident
        if sweep:
            base.update(sweep_id=sweep, **{"mlflow.parentRunId": parent})
        rid = client.create_run(exp, run_name=name, tags=base).info.run_id
        client.log_param(rid, "judge", judge)
        client.log_param(rid, "judge.sim_threshold", "0.54" if judge == "heuristic" else "x")
        path = tmp / rid / "per_query.parquet"
        path.parent.mkdir()
        _table(shift).to_parquet(path)
        client.log_artifact(rid, str(path))
        client.set_terminated(rid)
        return rid

    runs = {
        "h1": log("heur-a", "heuristic", "aaaaaaaaaaaaaaaa", 0.0),
        "h2": log("heur-b", "heuristic", "aaaaaaaaaaaaaaaa", 0.01),
        "llm": log("llm-judged", "local", "bbbbbbbbbbbbbbbb", 0.0, tags={"judge_model": "smol.gguf"}),
        "old": log("old-run", "heuristic", None, 0.0),  # logged before the judge_identity tag
        "s1": log("s1", "heuristic", "aaaaaaaaaaaaaaaa", 0.0, sweep="sw"),
        "s2": log("s2", "local", "bbbbbbbbbbbbbbbb", 0.0, sweep="sw"),
    }
    return uri, client, runs


def test_compare_refuses_mixed_judges_naming_both_and_accepts_with_the_flag(store, capsys):
    uri, _, runs = store
    argv = [runs["h1"], runs["llm"], "--tracking-uri", uri, "--resamples", "200"]
    assert compare.main(argv) == 2
    err = capsys.readouterr().err
    assert "different judges" in err and "heuristic" in err and "local (smol.gguf)" in err
    assert "aaaaaaaaaaaaaaaa" in err and "bbbbbbbbbbbbbbbb" in err and "--allow-judge-change" in err
    assert compare.main([*argv, "--allow-judge-change"]) == 0
    out = capsys.readouterr().out
    assert "judges differ" in out and "compared anyway (--allow-judge-change)" in out
    assert compare.main([runs["h1"], runs["h2"], "--tracking-uri", uri, "--resamples", "200"]) == 0
    assert "judges differ" not in capsys.readouterr().out


def test_gate_refuses_mixed_judges_unless_allowed(store, capsys):
    uri, _, runs = store
    argv = ["--baseline", runs["h1"], "--candidate", runs["llm"], "--tracking-uri", uri, "--resamples", "200"]
    assert gate.main(argv) == 2
    assert "different judges" in capsys.readouterr().err
    assert gate.main([*argv, "--allow-judge-change"]) in (0, 1)
    assert "compared anyway (--allow-judge-change)" in capsys.readouterr().out


def test_select_refuses_a_sweep_with_mixed_judges_unless_allowed(store, capsys):
    uri, _, _ = store
    argv = ["sw", "--metric", "hit_at_5", "--tracking-uri", uri]
    assert select_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "different judges" in err and "s1" in err and "s2" in err
    assert select_cli.main([*argv, "--allow-judge-change"]) == 0
    assert "judges differ" in capsys.readouterr().out


def test_runs_without_the_tag_compare_by_judge_params(store):
    _, client, runs = store
    old, h1, llm = (client.get_run(runs[k]) for k in ("old", "h1", "llm"))
    assert run_judge(old).from_tag is False and run_judge(h1).from_tag is True
    assert check_same_judge([old, h1]) is None  # same judge params: same judge
    with pytest.raises(RunInputError, match="different judges"):
        check_same_judge([old, llm])


def test_a_judge_free_run_compares_with_a_judged_one():
    """judge=none logs only judge-free metrics (F1/EM, citations, abstention, key-fact correctness):
    no judge change can move them, so compare/gate/select do not refuse the pair."""
    from rag_experiments.core.run_record import RunData
    from rag_experiments.tracking.judge_runs import check_same_judge

    def run(judge, ident, rid):  # the neutral record every reader returns (tracking.run_reader)
        return RunData(rid, rid, {"judge": judge}, {"judge_identity": ident}, run_name=rid)

    assert check_same_judge([run("heuristic", "abc", "r1"), run("none", "", "r2")]) is None
    with pytest.raises(Exception, match="different judges"):
        check_same_judge([run("heuristic", "abc", "r1"), run("verifier", "def", "r2")])
