"""Conversations (issue 44, docs/conversations.md): the turn format and its checks (each problem
``FILE:LINE``, exit 2), the breakdown tags, the history slot (window, oracle, a model's rewrite
against a real chat server on 127.0.0.1, its counted failures), config_hash unchanged by the
default ``history=last_turn``, the MTRAG importer on a hand-made file and on the shared MTRAG-UN
subset, and the bundled multi-turn sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rag_experiments.cli.evalset import main
from rag_experiments.core.cache import StageCache
from rag_experiments.core.identity import semantic_config
from rag_experiments.evalset.corpus import Corpus
from rag_experiments.evalset.importers import import_mtrag
from rag_experiments.evalset.load import EvalSet, EvalSetError, load_evalset, sample_dir
from rag_experiments.run.assemble import build, input_problems  # registers ${sample_dir:}
from rag_experiments.run.config_schema import validate
from rag_experiments.run.pipeline import run_pipeline
from rag_experiments.run.types import PipelineData, RunSettings, Stages
from rag_experiments.stages.chunking import MarkdownChunker
from rag_experiments.stages.generation import OpenAICompatibleGenerator
from rag_experiments.stages.history import HistoryRewrite, Oracle, Window, render
from rag_experiments.stages.retrieval import BM25Retriever
from tests.llm_fixtures import ChatServer
from tests.sweep_helpers import REPO

CONF = str(REPO / "rag_experiments" / "conf")
Q1 = "How long does Ferrymail keep retrying a failed webhook?"
A1 = "For 24 hours after the first attempt."
QUOTE = "Ferrymail will retry with exponential backoff for 24 hours after the first attempt"


def _turn(n: int, query: str, **extra) -> dict:
    history = [{"role": "user", "text": Q1}, {"role": "assistant", "text": A1}][: 2 * (n - 1)]
    row = {"id": f"c1#{n}", "conversation_id": "c1", "turn": n, "history": history, "query": query,
           "gold_evidence": [{"doc_id": "webhook-retries.md", "quote": QUOTE}]}  # fmt: skip
    return row | extra


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _docs():
    return Corpus(str(sample_dir() / "docs")).docs


# ------------------------------------------------------------------------------ format


def test_turns_load_with_their_fields_and_breakdown_tags(tmp_path) -> None:
    rows = [_turn(1, Q1, answerability="answerable"),
            _turn(2, "And how many attempts?", standalone_query="How many webhook delivery attempts?"),
            _turn(2, "What about SMS?", id="c2#2", conversation_id="c2", answerability="unanswerable",
                  gold_evidence=[], tags=["unanswerable"], standalone=True)]  # fmt: skip
    items, _ = load_evalset(_write(tmp_path / "e.jsonl", rows), _docs())
    a, b, c = items
    assert (b.turn, b.conversation_id, b.history[1]["role"], b.standalone_query) == (
        2, "c1", "assistant", "How many webhook delivery attempts?")  # fmt: skip
    assert a.tags == ["turn:1", "answerability:answerable", "standalone:yes"]
    assert b.tags == ["turn:2", "standalone:no"]
    assert c.tags == ["unanswerable", "turn:2", "answerability:unanswerable", "standalone:yes"]


def test_single_turn_items_get_no_field_and_keep_their_digest(tmp_path) -> None:
    path = sample_dir() / "evalset.jsonl"
    items, digest = load_evalset(path, _docs())
    assert all(not it.history and it.turn is None and not any(":" in t for t in it.tags) for it in items)
    raw = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    _, again = load_evalset(_write(tmp_path / "same.jsonl", raw), _docs())
    assert again == digest


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (_turn(2, "and?", history=[{"role": "bot", "text": "x"}], turn=1), "history[0].role: must be 'user' or 'assistant'"),
        (_turn(2, "and?", turn=3), "turn: 3, but the history holds 1 user turns (expected turn 2)"),
        (_turn(2, "and?", history=[{"role": "user", "text": " "}, {"role": "assistant", "text": A1}]),
         "history[0].text: must be a non-empty string"),
        (_turn(1, Q1, answerability="underspecified"), "gold_evidence: an underspecified turn has no gold evidence"),
        (_turn(1, Q1, answerability="maybe"), "answerability: 'maybe' is not one of"),
        (_turn(1, Q1, turn=True), "turn: expected int, got bool"),
    ],
)  # fmt: skip
def test_a_bad_turn_is_named_by_file_and_line(tmp_path, row, problem) -> None:
    path = _write(tmp_path / "e.jsonl", [_turn(1, Q1, id="ok#1", conversation_id="ok"), row])
    with pytest.raises(EvalSetError) as e:
        load_evalset(path, _docs())
    assert any(p.startswith(f"{path}:2: ") and problem in p for p in e.value.problems), e.value.problems


def test_turns_of_one_conversation_must_agree(tmp_path, capsys) -> None:
    dup = _write(tmp_path / "dup.jsonl", [_turn(1, Q1), _turn(1, Q1, id="c1#1b")])
    other = _turn(
        2, "and?", history=[{"role": "user", "text": "Something else"}, {"role": "assistant", "text": A1}]
    )
    drift = _write(tmp_path / "drift.jsonl", [_turn(1, Q1), other])
    assert main(["validate", "--evalset", str(dup)]) == 2
    assert f"{dup}:2: turn: conversation 'c1' has turn 1 twice (first on line 1)" in capsys.readouterr().err
    assert main(["validate", "--evalset", str(drift)]) == 2
    assert (
        f"{drift}:2: history: does not begin with turn 1's history and question (line 1)"
        in capsys.readouterr().err
    )


# ----------------------------------------------------------------------------- the slot


def test_window_oracle_and_the_rendered_conversation() -> None:
    (item,) = [it for it in _sample_turns() if it.id == "c01#3"]
    assert Window(turns=2).search_query(item) == "And how many attempts is that at most? " + item.query
    assert Window(turns=9).search_query(item).startswith("How long does Ferrymail keep retrying")
    assert A1 not in Window(turns=2, roles="all").search_query(item)  # the sample's own answers
    assert item.history[-1]["text"] in Window(turns=2, roles="all").search_query(item)
    assert Oracle().search_query(item) == item.standalone_query
    text = render(item, turns=2)
    assert text.splitlines()[0].startswith("User: And how many") and text.endswith(f"User: {item.query}")


def _sample_turns():
    return EvalSet(str(sample_dir() / "conversations.jsonl"), Corpus(str(sample_dir() / "docs"))).items


class RewriteChat(ChatServer):
    """Rewrites to a fixed query; the model ``junk`` replies with a list marker only."""

    def __init__(self) -> None:
        super().__init__(lambda body: {"ok": "Sure! Here is the query:\nwebhook delivery attempts maximum",
                                       "junk": "-"}[body["model"]], usage=(11, 4))  # fmt: skip

    def llm(self, model: str) -> OpenAICompatibleGenerator:
        return OpenAICompatibleGenerator(self.url, model, api_key_env=None, max_retries=0, backoff_s=0.0)


def _run(items, history, cache_dir: Path):
    corpus = Corpus(str(sample_dir() / "docs"))
    stages = Stages(chunker=MarkdownChunker(), retriever=BM25Retriever(k=3), history=history,
                    chunking_cfg={"_target_": "rag_experiments.stages.chunking.MarkdownChunker"})  # fmt: skip
    settings = RunSettings(k=3, ks=(1, 3), n_resamples=50, progress=False, token_budgets=())
    return run_pipeline(
        stages, PipelineData(corpus.docs, corpus.digest, items), settings, StageCache(cache_dir)
    )


def test_rewrite_searches_the_models_query_caches_it_and_counts_failures(tmp_path) -> None:
    items = [it for it in _sample_turns() if it.conversation_id == "c01"][:2]
    srv = RewriteChat()
    try:
        res = _run(items, HistoryRewrite(srv.llm("ok")), tmp_path / "c")
        df = res.per_query
        # turn 1 has no history: not sent, searched as it is; turn 2 searches the rewrite
        assert df["history_query"].tolist() == [items[0].query, "webhook delivery attempts maximum"]
        assert df["search_queries"].tolist() == [[items[0].query], ["webhook delivery attempts maximum"]]
        assert srv.calls == 1 and res.calls["history"] == 1 and res.aggregates["n_history_errors"] == 0
        assert df["tokens_in_history"].tolist()[1] == 11 and json.loads(res.tags["steps"])
        _run(items, HistoryRewrite(srv.llm("ok")), tmp_path / "c")
        assert srv.calls == 1  # from the cache
        bad = _run(items, HistoryRewrite(srv.llm("junk")), tmp_path / "c")
        assert (
            bad.aggregates["n_history_errors"] == 1
            and "unparseable reply" in bad.per_query["history_error"][1]
        )
        assert bad.per_query["history_query"][1] == items[1].query  # the last question, counted
        assert bad.records["history"].items == 1 and bad.records["history"].failed == 1
    finally:
        srv.close()


def test_oracle_beats_the_last_turn_on_the_sample_and_tags_break_it_down(tmp_path) -> None:
    items = _sample_turns()
    last = _run(items, None, tmp_path / "c").aggregates
    oracle = _run(items, Oracle(), tmp_path / "c").aggregates
    assert oracle["hit_at_3"] > last["hit_at_3"]
    assert oracle["by_tag/standalone:no/hit_at_3"] > last["by_tag/standalone:no/hit_at_3"]
    # a standalone turn's oracle query is its question: the same ranking
    assert oracle["by_tag/standalone:yes/hit_at_3"] == last["by_tag/standalone:yes/hit_at_3"]
    assert {"by_tag/turn:1/hit_at_3", "by_tag/turn:2/hit_at_3", "by_tag/turn:3plus/hit_at_3"} <= set(last)


def _cfg(*overrides: str) -> dict:
    with initialize_config_dir(version_base="1.3", config_dir=CONF):
        cfg = compose("config", overrides=["generator=none", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def test_history_last_turn_is_not_in_config_hash_and_a_shared_llm_is_ignored() -> None:
    plain = _cfg()
    assert plain["history"] == {"name": "last_turn"} and "history" not in semantic_config(plain)
    shared = _cfg("+generator@history.llm=local")
    assert validate(shared) == [] and semantic_config(shared) == semantic_config(plain)
    window = semantic_config(_cfg("history=window"))
    assert window == semantic_config(_cfg("history=window", "+generator@history.llm=local"))
    assert window["history"]["turns"] == 3
    rewrite = _cfg("history=rewrite")
    assert validate(rewrite) == [
        "conf/history: llm: missing: with generator=none the history rewrite needs a chat model of its own "
        "(e.g. +generator@history.llm=local, or +generator@history.llm=openai history.llm.model=...)"
    ]
    assert validate(_cfg("history=window", "history.turns=0")) == [
        "conf/history: turns: must be an integer >= 1 (got 0)"
    ]


def test_oracle_on_an_eval_set_without_rewrites_is_refused_before_any_run(tmp_path) -> None:
    with initialize_config_dir(version_base="1.3", config_dir=CONF):
        cfg = compose("config", overrides=["generator=none", "history=oracle", f"cache_dir={tmp_path}"])
    problems, loaded = input_problems(cfg)
    assert loaded is None and "history=oracle needs a standalone_query on every item" in problems[0]
    assert problems[1].startswith("line 1: a001: no standalone_query")
    with initialize_config_dir(version_base="1.3", config_dir=CONF):
        ok = compose("config", overrides=["generator=none", "history=oracle", "evalset=sample_conversations"])
    assert isinstance(build(ok, StageCache(tmp_path)).stages.history, Oracle)


# ------------------------------------------------------------------------------ import


def _mtrag_task(turn, inp, contexts, answerability="ANSWERABLE", multi="Follow-up", conv="cv1") -> dict:
    return {"conversation_id": conv, "task_id": f"{conv}<::>{turn}", "turn": str(turn), "input": inp,
            "contexts": contexts, "targets": [{"speaker": "agent", "text": "The reference answer."}],
            "answerability": [answerability], "Multi-Turn": [multi], "Collection": "govt"}  # fmt: skip


def _mtrag_file(tmp_path: Path) -> Path:
    u1, a1 = {"speaker": "user", "text": "What is form W-4?"}, {"speaker": "agent", "text": "A tax form."}
    u2 = {"speaker": "user", "text": "Who files it?"}
    p1 = {"document_id": "d1", "text": "\nForm W-4 tells your employer how much tax to withhold.\n"}
    p2 = {"document_id": "d2", "text": "Employees file Form W-4 with their employer."}
    tasks = [
        _mtrag_task(2, [u1, a1, u2], [p1, p2]),
        _mtrag_task(2, [u1, a1, u2], [p2], "UNDERSPECIFIED", conv="cv2"),
        _mtrag_task(5, [u1, a1, u2], [{"document_id": "d1", "text": "another text"}], conv="cv3"),
        _mtrag_task(1, [u1], [], "UNANSWERABLE", "N/A", conv="cv4"),
        _mtrag_task(1, [u1, a1], [p1], conv="cv5"),
    ]
    return _write(tmp_path / "reference.jsonl", tasks)


def test_import_mtrag_maps_turns_keeps_no_gold_for_unanswerable_and_reports(tmp_path, capsys) -> None:
    corpus, evals, rep = import_mtrag(_mtrag_file(tmp_path))
    assert [d["doc_id"] for d in corpus] == ["d1", "d2"]
    assert [e["id"] for e in evals] == ["cv1#2", "cv2#2", "cv4#1"]
    first = evals[0]
    assert first["history"] == [
        {"role": "user", "text": "What is form W-4?"},
        {"role": "assistant", "text": "A tax form."},
    ]
    assert (first["query"], first["turn"], first["standalone"], first["gold_answer"]) == (
        "Who files it?", 2, False, "The reference answer.")  # fmt: skip
    assert first["gold_evidence"][0] == {"doc_id": "d1", "start": 1, "end": len(corpus[0]["text"]) - 1}
    assert evals[1]["gold_evidence"] == [] and evals[1]["tags"] == ["govt", "unanswerable"]
    assert (rep.kept, rep.repaired, rep.dropped, rep.dropped_items) == (2, 1, 2, 2)
    assert main(["import-mtrag", str(tmp_path / "reference.jsonl"), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "reference passages: kept 2, repaired 1, dropped 2" in out and out.rstrip().endswith("OK")
    assert (
        main(["import-mtrag", str(tmp_path / "reference.jsonl"), "--out", str(tmp_path / "s"), "--strict"])
        == 2
    )
    assert (
        "cv3<::>5: contexts[0] 'd1': another text under the same document id: dropped"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "s").exists()


def test_import_mtrag_on_the_shared_mtrag_un_subset(shared_datasets, tmp_path, capsys) -> None:
    src = shared_datasets / "mtrag_un" / "reference_fiqa_govt.jsonl"
    assert main(["import-mtrag", str(src), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "reference passages: kept 419, repaired 0, dropped 192" in out and out.rstrip().endswith("OK")
    items, _ = load_evalset(tmp_path / "evalset.jsonl", Corpus(str(tmp_path / "corpus.jsonl")).docs)
    assert len(items) == 234 and len(Corpus(str(tmp_path / "corpus.jsonl")).docs) == 592
    by = {t: sum(t in it.tags for it in items) for t in ("answerability:unanswerable", "answerability:underspecified",
                                                          "turn:1", "standalone:yes")}  # fmt: skip
    assert by == {"answerability:unanswerable": 39, "answerability:underspecified": 32, "turn:1": 16,
                  "standalone:yes": 42}  # fmt: skip
    assert all(it.id == f"{it.conversation_id}#{it.turn}" and not it.standalone_query for it in items)


def test_the_bundled_sample_is_15_conversations_each_turn_with_its_rewrite() -> None:
    items = _sample_turns()
    convs = {it.conversation_id for it in items}
    assert len(convs) == 15 and all(2 <= sum(it.conversation_id == c for it in items) <= 4 for c in convs)
    assert all(it.standalone_query for it in items)
    assert {it.answerability for it in items} == {"answerable", "unanswerable", "underspecified"}


# ------------------------------------------------------------------------------- sweep (slow)


def test_a_history_sweep_on_the_sample_logs_turn_breakdowns_and_sessions(tmp_path) -> None:
    """``-m history=last_turn,window,oracle`` on the bundled conversations: three FINISHED runs,
    by_tag/turn:*/ breakdowns logged, oracle above last_turn on the non-standalone turns, and each
    turn's trace in its conversation's session (``mlflow.trace.session``), read back from sqlite."""
    from mlflow import MlflowClient

    from rag_experiments.analysis.conversations import breakdown
    from tests.sweep_helpers import run_sweep

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run_sweep(tmp_path, "-m", "evalset=sample_conversations", "history=last_turn,window,oracle", "retriever=bm25",
              "generator=none", f"tracking.uri={uri}", f"tracking.artifact_root={tmp_path}/mlruns",
              f"cache_dir={tmp_path}/cache", "progress=false", f"hydra.sweep.dir={tmp_path}/multirun",
              "experiment_name=conv")  # fmt: skip
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("conv").experiment_id
    runs = {r.data.params["history"]: r for r in client.search_runs([exp]) if "history" in r.data.params}
    assert set(runs) == {"last_turn", "window", "oracle"} and all(
        r.info.status == "FINISHED" for r in runs.values()
    )
    m = {h: r.data.metrics for h, r in runs.items()}
    assert m["oracle"]["by_tag/standalone:no/hit_at_5"] > m["last_turn"]["by_tag/standalone:no/hit_at_5"]
    assert {"by_tag/turn:1/hit_at_5", "by_tag/turn:3plus/evidence_recall_at_512tok"} <= set(m["window"])
    traces = client.search_traces(locations=[exp], run_id=runs["oracle"].info.run_id, max_results=100)
    sessions = {t.info.trace_metadata.get("mlflow.trace.session") for t in traces}
    assert len(traces) == 47 and sessions == {f"c{i:02d}" for i in range(1, 16)}
    from rag_experiments.tracking.run_reader import MlflowRunReader

    reader = MlflowRunReader(uri)
    tables = {h: reader.per_query(reader.get(r.info.run_id)) for h, r in runs.items()}
    rows = {r.group: r for r in breakdown(tables, "last_turn", ["hit_at_5"], n_resamples=200)}
    assert rows["turn:1"].deltas["oracle"]["hit_at_5"].delta == 0  # a first turn is its own rewrite
    assert rows["all"].n == 47 and rows["standalone:no"].deltas["oracle"]["hit_at_5"].delta > 0


# ----------------------------------------------------------------------- the generator's prompt


def test_the_prompt_shows_the_last_turns_teacher_forced_and_cuts_the_oldest_to_fit() -> None:
    from rag_experiments.stages.context_fit import fit_context, fit_history
    from rag_experiments.stages.prompts import PromptTemplate

    (item,) = [it for it in _sample_turns() if it.id == "c01#4"]
    plain = PromptTemplate("p", "Answer from the context.", "{context}\n\nQ: {question}")
    assert plain.render(item.query, [], item.history) == plain.render(
        item.query, []
    )  # history_turns 0: as before
    two = PromptTemplate("p", "Answer from the context.", "{context}\n\nQ: {question}", history_turns=2)
    msgs = two.render(item.query, [], item.history)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[1]["content"] == item.history[2]["text"] and msgs[2]["content"] == item.history[3]["text"]
    assert "history_turns: 2" in two.text and "history_turns" not in plain.text
    count = lambda messages: sum(len(m["content"]) for m in messages) // 4  # noqa: E731 - ~4 chars a token
    full = count(two.render(item.query, [], item.history))
    kept, cut = fit_history(two, item.query, [], item.history, full - 1, count)
    assert cut == 1 and kept == item.history[4:]  # the oldest shown turn went first
    assert fit_history(two, item.query, [], item.history, full, count) == (two.recent(item.history), 0)
    assert fit_context(two, item.query, [], full, count, kept) == ([], False)


def test_the_report_shows_each_turn_group_with_paired_deltas_and_the_worst_conversations():
    """Issue 44: the report's per-turn section: per turn index and answerability, hit@5 and evidence
    recall at 512 tokens per history option, the paired Δ against the baseline with its CI, and
    the baseline's worst conversations turn by turn."""
    from types import SimpleNamespace

    import pandas as pd

    from rag_experiments.report.model import plain
    from rag_experiments.report.sweep_extras import turn_section

    def table(hits):
        rows = []
        for c in range(6):
            for turn in (1, 2, 3):
                h = hits(c, turn)
                rows.append({"id": f"c{c}#{turn}", "query": f"q{c}.{turn}", "failure_label": "ok",
                             "tags": [f"turn:{turn if turn < 3 else '3plus'}", "answerability:answerable",
                                      f"standalone:{'yes' if turn == 1 else 'no'}"],
                             "hit_at_5": h, "evidence_recall_at_512tok": h})  # fmt: skip
        return pd.DataFrame(rows)

    last = SimpleNamespace(label="history=last_turn", table=table(lambda c, t: 1.0 if t == 1 or c % 2 else 0.0))
    window = SimpleNamespace(label="history=window", table=table(lambda c, t: 1.0))
    s = turn_section(SimpleNamespace(base=last, configs=[last, window]), n_resamples=200)
    head, rows = s.blocks[1].headers, [[plain(c) for c in r] for r in s.blocks[1].rows]
    assert head[:5] == ["turns", "n", "metric", "history=last_turn", "history=window"]
    by = {(r[0], r[2]): r for r in rows}
    assert by[("turn:1", "hit_at_5")][3:5] == ["1.000", "1.000"] and by[("turn:2", "hit_at_5")][3] == "0.500"
    assert by[("turn:2", "hit_at_5")][5].startswith("+0.500 [") and "(n=6)" in by[("turn:2", "hit_at_5")][5]
    worst = [[plain(c) for c in r] for r in s.subsections[0].blocks[0].rows]
    assert worst[0][0] == "c0" and [r[1] for r in worst[:3]] == ["1", "2", "3"]  # a conversation, in turn order
    assert turn_section(SimpleNamespace(base=SimpleNamespace(label="x", table=pd.DataFrame(
        {"id": ["a"], "tags": [["exact"]], "hit_at_5": [1.0]})), configs=[])) is None  # fmt: skip
