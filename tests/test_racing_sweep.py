"""Racing sweeps end to end (docs/racing.md): bad input exits 2 before any run; a config that
answers nothing right is stopped early (basic launcher: one after another; joblib: concurrently),
ends FINISHED with its partial table and racing tags, and makes fewer generation calls."""

from __future__ import annotations

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from rag_experiments.evalset.corpus import Corpus
from rag_experiments.evalset.load import EvalSet
from tests.llm_fixtures import fake_llm  # noqa: F401  (fixture)
from tests.sweep_helpers import make_tiny, run_sweep, sweep_args


def _client(root):
    return MlflowClient(tracking_uri=f"sqlite:///{root}/mlflow.db")


def _children(root):
    c = _client(root)
    exp = c.get_experiment_by_name("test")
    if exp is None:
        return []
    return [r for r in c.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]


def _gen_args(url):
    return [
        "generator=openai",
        f"generator.base_url={url}",
        "generator.api_key_env=null",
        "generator.max_retries=0",
        "generation_subset=null",
        "tracking.traces=false",
        # an LLM judge on the same fake endpoint: cheap (its verdicts are unparseable and counted;
        # correctness, the raced metric, is key-fact matching and needs no judge)
        "judge=openai",
        f"judge.base_url={url}",
        "judge.model=ok",
        "judge.api_key_env=null",
        "judge.decompose=false",
        "judge.n_questions=1",
        "judge.max_retries=0",
    ]


@pytest.mark.parametrize(
    "extra, expect",
    [
        ([], "conf/config: racing: needs a multirun"),
        (["-m", "racing.batch_size=0", "retriever.k=1,3"], "conf/config: racing.batch_size: must be an integer >= 1"),
        (["-m", "racing.primary=latency_total_s", "retriever.k=1,3"], "conf/config: racing.primary:"),
        (["-m", "generator=none", "retriever.k=1,3"], "conf/config: racing: needs generation"),
    ],
)
def test_bad_racing_input_exits_2_naming_the_key_without_a_run(tmp_path, extra, expect):
    docs, ev = make_tiny(tmp_path, n_items=4)
    gen = [] if "generator=none" in extra else _gen_args("http://127.0.0.1:9/v1")
    p = run_sweep(tmp_path, *extra, "racing=true", *sweep_args(tmp_path, docs, ev), *gen, check=False)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert expect in p.stderr
    assert _children(tmp_path) == []


@pytest.mark.parametrize(
    "launcher", [[], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]], ids=["basic", "joblib"]
)
def test_racing_stops_the_losing_config_and_saves_generation_calls(
    tmp_path, fake_llm, launcher, capsys  # noqa: F811
):
    docs, ev = make_tiny(tmp_path, n_items=40)
    n_items = len(ev.read_text().splitlines())
    run_sweep(
        tmp_path,
        "-m",
        *launcher,
        "racing=true",
        "racing.batch_size=4",
        "racing.primary=correctness",
        "generator.model=ok,garbage",  # "garbage" answers "banana split" to everything
        *sweep_args(tmp_path, docs, ev),
        *_gen_args(fake_llm.base_url),
        "retriever=bm25",
        "retriever.k=1",  # short echoed answers: a cheap judge
        "metrics.ks=[1]",
        "metrics.token_budgets=[]",
    )
    runs = {r.data.params["generator.model"]: r for r in _children(tmp_path)}
    ok, bad = runs["ok"], runs["garbage"]
    assert ok.info.status == bad.info.status == "FINISHED"
    assert ok.data.tags["racing.status"] == "survived"
    assert bad.data.tags["racing.status"] == "stopped"
    assert bad.data.tags["racing.stopped_by"] == ok.info.run_id
    n_stop = int(bad.data.tags["racing.stopped_at_n"])
    assert 4 <= n_stop < n_items and n_stop % 4 == 0
    assert ok.data.metrics["n_generated"] == n_items and bad.data.metrics["n_generated"] == n_stop
    calls = sum(v for (m, _), v in fake_llm.attempts.items() if m == "garbage")
    assert calls == n_stop  # generation calls the stopped config made: only its batches
    table = pd.read_parquet(
        _client(tmp_path).download_artifacts(bad.info.run_id, "per_query.parquet", str(tmp_path))
    )
    assert len(table) == n_items and int(table["generated"].sum()) == n_stop  # partial table
    # every generated item is scored on correctness but one whose key facts are all weak (a059's
    # "seconds" is in its question: left out, evalset.weak_facts)
    items = EvalSet(str(ev), Corpus(str(docs))).items
    weak_only = {it.id for it in items if it.key_facts and not it.strong_key_facts}
    n_weak = int(table.loc[table["generated"].astype(bool), "id"].isin(weak_only).sum())
    assert bad.data.metrics["n_scored/correctness"] == n_stop - n_weak
    if not launcher:
        _readers_keep_stopped_configs_apart(tmp_path, ok, bad, capsys)


def _readers_keep_stopped_configs_apart(root, ok, bad, capsys):
    """select / compare --sweep / report: the stopped config is listed apart with its n, never the
    winner or part of the comparisons."""
    from rag_experiments.cli import compare, select
    from rag_experiments.report import cli as report_cli

    uri = ["--tracking-uri", f"sqlite:///{root}/mlflow.db"]
    sweep_id = ok.data.tags["sweep_id"]
    assert select.main([sweep_id, "--metric", "correctness", *uri]) == 0
    out = capsys.readouterr().out
    assert "stopped by racing (1)" in out and f"run {ok.info.run_id}" in out
    assert bad.info.run_name in out.split("stopped by racing")[1]  # listed only in the stopped table
    assert bad.info.run_name not in out.split("stopped by racing")[0]
    assert compare.main(["--sweep", sweep_id, "--baseline", ok.info.run_id, "--resamples", "99", *uri]) == 0
    assert "Stopped by racing (1)" in capsys.readouterr().out
    assert compare.main(["--sweep", sweep_id, "--baseline", bad.info.run_id, *uri]) == 2
    out_dir = root / "report"
    assert report_cli.main([sweep_id, "--out", str(out_dir), "--no-log", "--resamples", "99", *uri]) == 0
    md = (out_dir / "report.md").read_text()
    assert "Stopped by racing (1)" in md and "partial" in md


def _racing_args(tmp_path, url):
    docs, ev = make_tiny(tmp_path, n_items=40)
    return [
        "-m", "racing=true", "racing.batch_size=4", "racing.primary=correctness",
        "generator.model=ok,garbage", *sweep_args(tmp_path, docs, ev), *_gen_args(url),
        "retriever=bm25", "retriever.k=1", "metrics.ks=[1]", "metrics.token_budgets=[]",
    ]


def _stops(root) -> dict[str, tuple[str, str]]:
    runs = [r for r in _children(root) if r.info.status == "FINISHED"]
    ids = {r.info.run_id: r.data.params["generator.model"] for r in runs}
    return {
        ids[r.info.run_id]: (r.data.tags.get("racing.status"), r.data.tags.get("racing.stopped_at_n"),
                             ids.get(r.data.tags.get("racing.stopped_by", ""), ""))
        for r in runs
    }


def test_a_resumed_racing_sweep_decides_as_an_uninterrupted_one(tmp_path, fake_llm):  # noqa: F811
    """Issue 31 item 13: the configs a resumed sweep reuses go back on its board, so the configs it
    re-runs race them and stop where the uninterrupted sweep stopped them."""
    whole = tmp_path / "whole"
    whole.mkdir()
    run_sweep(whole, *_racing_args(whole, fake_llm.base_url))
    expected = _stops(whole)
    assert expected["garbage"][0] == "stopped" and expected["garbage"][2] == "ok"

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    args = _racing_args(resumed, fake_llm.base_url)
    fake_llm.down = {"garbage"}  # an outage kills the sweep at its second config: ok FINISHED
    first = run_sweep(resumed, *args, check=False)
    assert first.returncode != 0 or "garbage" not in _stops(resumed)
    fake_llm.down = set()
    again = run_sweep(resumed, *args)
    assert _stops(resumed) == expected
    assert "[skip]" in again.stdout and "back on the board" in again.stdout
