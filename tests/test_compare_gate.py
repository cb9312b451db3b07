"""compare / gate CLIs end to end against a real temporary MLflow store (sqlite + file artifacts)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.cli import compare, gate
from rag_experiments.evaluation.labels import RATE_LABELS
from rag_experiments.evaluation.registry import parse
from rag_experiments.tracking.runs import (
    RunInputError,
    group_choices,
    resolve_run,
    sweep_children,
    tracking_uri,
)

N = 200
IDS = [f"q{i:03d}" for i in range(N)]
PARAMS = {
    "chunking": "fixed",
    "chunking._target_": "rag_experiments.stages.chunking.FixedChunker",
    "chunking.size": "256",
    "embedding": "minilm",
    "retriever": "dense",
    "retriever.k": "5",
    "generator": "none",
    "prompt": "concise",
    "judge": "heuristic",
    "cache_dir": ".cache/rag_experiments",
}


def _table(hits: np.ndarray, labels: list[str]) -> pd.DataFrame:
    rates = {f"rate_{lab}": (np.array(labels) == lab).astype(float) for lab in RATE_LABELS}
    return pd.DataFrame(
        {
            "id": IDS,
            "query": [f"How does feature {i} work?" for i in range(N)],
            "tags": [["paraphrase"] if i % 3 == 0 else ["exact"] for i in range(N)],
            "hit_at_1": hits * (np.arange(N) % 2),
            "hit_at_5": hits,
            "mrr": hits * 0.5,
            "faithfulness": np.where(hits == 1, 0.9, 0.4),
            "failure_label": labels,
            "error": [None] * N,
            "latency_retrieval_s": np.linspace(0.01, 0.02, N),
            **rates,  # the pipeline logs one indicator column per rate label
        }
    )


def _labels(hits: np.ndarray) -> list[str]:
    return ["ok" if h else "retrieval_failure" for h in hits]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{tmp}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("rag", artifact_location=str(tmp / "mlruns"))

    def log(name, params, table, digest="evalset-1", tags=None, with_table=True):
        run = client.create_run(
            exp,
            run_name=name,
            tags={"evalset_digest": digest, "corpus_digest": "c1", "config_hash": name, **(tags or {})},
        )
        rid = run.info.run_id
        for k, v in params.items():
            client.log_param(rid, k, v)
        if with_table:
            path = tmp / f"{rid}" / "per_query.parquet"
            path.parent.mkdir()
            table.to_parquet(path)
            client.log_artifact(rid, str(path))
            client.log_metric(rid, "hit_at_5", float(table["hit_at_5"].mean()))
        client.set_terminated(rid)
        return rid

    hits_a = np.array([1.0 if i % 4 else 0.0 for i in range(N)])  # 75 % hits; misses at i % 4 == 0
    hits_b = hits_a.copy()
    hits_b[1], hits_b[4] = 0.0, 1.0  # q001 hit→miss, q004 miss→hit
    labels_b = _labels(hits_b)
    labels_b[2] = "generation_failure"  # q002 ok→generation_failure with the hit unchanged
    hits_w = hits_a.copy()
    hits_w[np.flatnonzero(hits_a == 1)[:60]] = 0.0  # clearly worse: −30 points

    runs = {
        "a": log("chunking=fixed,chunking.size=256", PARAMS, _table(hits_a, _labels(hits_a))),
        "b": log(
            "chunking=fixed,chunking.size=512",
            dict(PARAMS, **{"chunking.size": "512", "cache_dir": "/tmp/other"}),
            _table(hits_b, labels_b),
        ),
        "worse": log("embedding=static", dict(PARAMS, embedding="static"), _table(hits_w, _labels(hits_w))),
        "other_evalset": log("other-evalset", PARAMS, _table(hits_a, _labels(hits_a)), digest="evalset-2"),
        "no_table": log("no-table", PARAMS, None, with_table=False),
        "dup1": log("dup", PARAMS, _table(hits_a, _labels(hits_a))),
        "dup2": log("dup", PARAMS, _table(hits_a, _labels(hits_a))),
    }
    # a 2-run sweep: parent + children tagged with sweep_id and overrides
    parent = client.create_run(exp, run_name="sweep-parent", tags={"sweep_id": "sw1"}).info.run_id
    for key, size, hits in (("s256", "256", hits_a), ("s512", "512", hits_w)):
        runs[key] = log(
            f"sweep chunking.size={size}",
            dict(PARAMS, **{"chunking.size": size}),
            _table(hits, _labels(hits)),
            tags={
                "sweep_id": "sw1",
                "mlflow.parentRunId": parent,
                "overrides": json.dumps([f"chunking.size={size}"]),
            },
        )
    runs["parent"] = parent
    return {"uri": uri, "client": client, "runs": runs, "tmp": tmp}


def test_tracking_uri_precedence(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri() == "sqlite:///mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    assert tracking_uri() == "sqlite:///env.db"
    assert tracking_uri("sqlite:///cli.db") == "sqlite:///env.db"  # one rule: tracking/uri.py


def test_resolve_run_by_id_name_and_ambiguity(store):
    client, runs = store["client"], store["runs"]
    assert resolve_run(client, runs["a"]).info.run_id == runs["a"]
    assert resolve_run(client, "chunking=fixed,chunking.size=256").info.run_id == runs["a"]
    with pytest.raises(RunInputError, match="ambiguous") as e:
        resolve_run(client, "dup")
    assert runs["dup1"] in str(e.value) and runs["dup2"] in str(e.value)
    with pytest.raises(RunInputError, match="unknown run"):
        resolve_run(client, "no-such-run")
    assert group_choices(client.get_run(runs["a"]))["chunking"] == "fixed"
    assert {r.info.run_id for r in sweep_children(client, "sw1")} == {runs["s256"], runs["s512"]}


def test_compare_end_to_end(store, tmp_path, capsys):
    runs, uri, client = store["runs"], store["uri"], store["client"]
    out = tmp_path / "cmp.md"
    argv = [runs["a"], "chunking=fixed,chunking.size=512", "--tracking-uri", uri, "--out", str(out), "--log"]
    # the chunk size differs and the runs log no equal-budget metric: hit_at_5 and mrr are left out
    # of the default family (docs/metrics.md, "Comparability") unless --allow-incomparable
    assert compare.main(argv) == 0
    assert "left out, not comparable across the configs" in capsys.readouterr().out
    code = compare.main([*argv, "--allow-incomparable"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "note: --allow-incomparable: hit_at_5 compared across configs where the chunks differ" in printed
    md = out.read_text()

    # the config diff names the differing param only (cache_dir is bookkeeping)
    diff = md.split("## Config diff")[1].split("##")[0]
    assert "| chunking.size | 256 | 512 |" in diff
    assert diff.count("\n| ") == 2  # header + one row

    # flips listed with their text: q001 hit→miss, q004 miss→hit; labels: q001, q002, q004
    hits = md.split("## Flipped queries: hit_at_5")[1].split("##")[0]
    assert "| hit→miss | q001 | How does feature 1 work? | exact |" in hits
    assert "| miss→hit | q004 | How does feature 4 work? | exact |" in hits
    assert "(2)" in md.split("## Flipped queries: hit_at_5")[1].splitlines()[0]
    labels = md.split("## Flipped queries: failure_label")[1].split("##")[0]
    assert "| ok→retrieval_failure | q001 |" in labels
    assert "| ok→generation_failure | q002 |" in labels
    assert "| retrieval_failure→ok | q004 |" in labels
    assert labels.count("| q0") == 3

    # the per-metric table: hit_at_5 unchanged on average (one flip each way), McNemar p = 1
    row = next(line for line in md.splitlines() if line.startswith("| hit_at_5 |"))
    assert "+0.0000" in row and "mcnemar-exact" in row and row.rstrip().endswith("| 200 | n.s. |")
    assert "Failure-label transitions" in md and "hit→miss" in printed
    assert "latency_retrieval_s" not in md  # not a metric key: compared only when named

    # --log: markdown artifact and compare/* metrics on run B
    arts = [f.path for f in client.list_artifacts(runs["b"], "compare")]
    assert arts == [f"compare/{runs['a']}_vs_{runs['b']}.md"]
    metrics = client.get_run(runs["b"]).data.metrics
    assert metrics["compare/hit_at_5/delta"] == 0.0 and "compare/mrr/p_value" in metrics
    assert all(parse(k) is not None for k in metrics), sorted(metrics)  # every logged key is registered


def test_compare_group_change_is_one_factor(store, tmp_path):
    out = tmp_path / "g.md"
    r = store["runs"]
    assert (
        compare.main(
            [r["a"], r["worse"], "--tracking-uri", store["uri"], "--out", str(out), "--metric", "hit_at_5"]
        )
        == 0
    )
    diff = out.read_text().split("## Config diff")[1].split("##")[0]
    assert "| embedding | minilm | static |" in diff and diff.count("\n| ") == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["a", "other_evalset"], "different eval sets"),
        (["a", "no-such-run"], "unknown run"),
        (["a", "no_table"], "per_query.parquet"),
        (["a", "b", "--metric", "nope"], "nope"),
    ],
)
def test_compare_refuses_bad_input(store, capsys, argv, message):
    r = store["runs"]
    argv = [r.get(x, x) for x in argv]
    assert compare.main([*argv, "--tracking-uri", store["uri"]]) == 2
    assert message in capsys.readouterr().err


def test_compare_sweep_attribution(store, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["uri"])
    code = compare.main(["--sweep", "sw1", "--baseline", "sweep chunking.size=256", "--resamples", "999"])
    assert code == 0
    out = capsys.readouterr().out
    assert "chunking.size ∈ {256, 512}" in out
    assert "chunking.size=512" in out and "A/A noise" in out
    assert "-0.300" in out  # the −30-point hit_at_5 effect of the worse level, one row per level
    args = ["--sweep", "sw1", "--baseline", "sweep chunking.size=256", "--resamples", "999", "--long"]
    assert compare.main(args) == 0
    out = capsys.readouterr().out
    assert "split-half" in out and "-0.3000" in out  # --long: one row per (level, metric)


def test_gate_self_passes_worse_fails_bad_input_exits_2(store, capsys):
    r, uri = store["runs"], store["uri"]
    assert gate.main(["--baseline", r["a"], "--candidate", r["a"], "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "hit_at_5" in out and "faithfulness" in out and "mrr" in out

    assert gate.main(["--baseline", r["a"], "--candidate", "embedding=static", "--tracking-uri", uri]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "GATE FAILED" in out

    # a small change within the margin passes (q001 hit→miss, q004 miss→hit: delta 0)
    assert (
        gate.main(["--baseline", r["a"], "--candidate", r["b"], "--margin", "0.02", "--tracking-uri", uri])
        == 0
    )
    capsys.readouterr()

    for argv, message in [
        (["--candidate", r["other_evalset"]], "different eval sets"),
        (["--candidate", "no-such-run"], "unknown run"),
        (["--candidate", r["b"], "--metric", "answer_relevance"], "answer_relevance"),
        (["--candidate", r["no_table"]], "per_query.parquet"),
    ]:
        assert gate.main(["--baseline", r["a"], *argv, "--tracking-uri", uri]) == 2, argv
        assert message in capsys.readouterr().err


def test_gate_is_deterministic(store, capsys):
    r, uri = store["runs"], store["uri"]
    argv = ["--baseline", r["a"], "--candidate", r["worse"], "--metric", "mrr", "--tracking-uri", uri]
    gate.main(argv)
    first = capsys.readouterr().out
    gate.main(argv)
    assert capsys.readouterr().out == first


def _row(text: str, metric: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"| {metric} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_compare_reads_direction_from_the_registry(store, tmp_path):
    """More retrieval failures is worse, fewer is better; hit@5 the other way round."""
    r, uri = store["runs"], store["uri"]
    out = tmp_path / "worse.md"
    # the failure rates are outside an embedding change's headline family: --all tests every metric
    assert compare.main([r["a"], r["worse"], "--all", "--tracking-uri", uri, "--out", str(out)]) == 0
    md = out.read_text()
    fail, hit, ok = (_row(md, m) for m in ("rate_retrieval_failure", "hit_at_5", "rate_ok"))
    assert fail[3].startswith("+0.3") and fail[-1] == "worse"
    assert hit[3].startswith("-0.3") and hit[-1] == "worse" and ok[-1] == "worse"
    assert compare.main([r["worse"], r["a"], "--all", "--tracking-uri", uri, "--out", str(out)]) == 0
    md = out.read_text()
    assert _row(md, "rate_retrieval_failure")[-1] == "better" and _row(md, "hit_at_5")[-1] == "better"
    assert compare.change("n_queries", 1.0, 0.001) == "–" and compare.change("mrr", 0.01, 0.4) == "n.s."


def test_gate_fails_a_rise_of_a_lower_is_better_metric(store, capsys):
    r, uri = store["runs"], store["uri"]
    argv = ["--metric", "rate_retrieval_failure", "--tracking-uri", uri]
    # 60 more retrieval failures (+30 points): the gate must fail, as it does for a hit@5 drop
    assert gate.main(["--baseline", r["a"], "--candidate", r["worse"], *argv]) == 1
    out = capsys.readouterr().out
    row = next(x for x in out.splitlines() if x.startswith("rate_retrieval_failure"))
    assert "lower" in row and "FAIL" in row and "GATE FAILED" in out
    # the same change the other way round is an improvement: passes
    assert gate.main(["--baseline", r["worse"], "--candidate", r["a"], *argv]) == 0
    assert "PASS" in capsys.readouterr().out
    # a small rise within the margin passes (q001 hit→miss and q004 miss→hit: no net change)
    assert gate.main(["--baseline", r["a"], "--candidate", r["b"], *argv, "--margin", "0.02"]) == 0
    capsys.readouterr()
    # a count without a direction, or an unregistered column, cannot be gated
    assert (
        gate.main(["--baseline", r["a"], "--candidate", r["b"], "--metric", "query", "--tracking-uri", uri])
        == 2
    )
    assert "not registered" in capsys.readouterr().err


def test_human_kappa_below_0_4_marks_generation_conclusions(store, capsys):
    """A spot-check κ of 0.05 on one run of the comparison: compare (two runs and --sweep) and
    select on a generation metric print the marker; a retrieval-only comparison does not."""
    from rag_experiments.cli import select

    client, r, uri = store["client"], store["runs"], store["uri"]
    marker = "judge κ=0.05 vs your labels (spot-check, n=58): generation conclusions unreliable"
    args = ["--tracking-uri", uri, r["a"], r["b"], "--resamples", "999"]
    assert compare.main([*args, "--metric", "faithfulness"]) == 0
    assert marker not in capsys.readouterr().out  # no human labels yet
    for rid in (r["b"], r["s512"]):
        client.log_metric(rid, "spotcheck/kappa", 0.05)
        client.log_metric(rid, "spotcheck/n", 58)
    assert compare.main([*args, "--metric", "faithfulness"]) == 0
    assert f"warning: {marker}" in capsys.readouterr().out
    assert compare.main([*args, "--metric", "hit_at_5", "--allow-incomparable"]) == 0  # chunk sizes differ
    assert marker not in capsys.readouterr().out  # retrieval: the judge plays no part
    sweep = ["--tracking-uri", uri, "--sweep", "sw1", "--baseline", "sweep chunking.size=256", "--resamples", "999"]
    assert compare.main([*sweep, "--metric", "faithfulness"]) == 0
    assert f"warning: {marker}" in capsys.readouterr().out
    assert select.main(["sw1", "--metric", "faithfulness", "--tracking-uri", uri]) in (0, 1)
    assert f"warning: {marker}" in capsys.readouterr().out
    assert select.main(["sw1", "--metric", "hit_at_5", "--allow-incomparable", "--tracking-uri", uri]) in (0, 1)
    assert marker not in capsys.readouterr().out
