"""From production and back (issue 39): traces → review candidates with inclusion probabilities →
accepted eval items with lineage → an estimate of how often production answers fail.

The "production" is a traced sweep run of the bundled sample (BM25, the cite prompt answered by a
deterministic chat server on 127.0.0.1, the heuristic judge) in a real sqlite MLflow store; the
user-application case is traces written with MLflow's own tracing API.
"""

from __future__ import annotations

import csv
import json
import math

import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.entities import SpanType

from rag_experiments.analysis.production import Labelled, estimate, hajek, stratified_ratio
from rag_experiments.analysis.trace_sample import RetrievedDoc, TracedQuery, Unit, pick
from rag_experiments.cli import evalset as cli
from rag_experiments.evalset.load import load_evalset, sample_dir
from rag_experiments.evalset.trace_review import COLUMNS, LEGACY_COLUMNS, note_checks
from tests.llm_fixtures import ChatServer
from tests.sweep_helpers import run_sweep
from tests.test_generation_digest import _prompt_of, answer_for

DOCS = str(sample_dir() / "docs")
SAMPLE = [json.loads(x) for x in (sample_dir() / "evalset.jsonl").read_text().splitlines() if x.strip()]


# ------------------------------------------------------------------------------ the design, by hand


def _units(signal: int, rest: int) -> list[Unit]:
    out = []
    for i in range(signal + rest):
        fails = i < signal
        q = TracedQuery(f"t{i}", f"question {i}", "I don't know." if fails else "Refunds take five days.",
                        [RetrievedDoc("Refunds take five days.", "refunds.md", 1.0)], timestamp_ms=i)  # fmt: skip
        out.append(Unit(q, [q.trace_id]))
    return out


def test_failures_design_takes_the_signal_stratum_with_certainty_and_fills_at_random() -> None:
    units = _units(3, 47)
    drawn, strata = pick(units, "failures", 10, seed=1)
    assert strata == {"rest": (47, 7), "signal": (3, 3)}
    assert len(drawn) == 10 and sum(u.stratum == "signal" for u in drawn) == 3
    assert {u.pi for u in units if u.stratum == "signal"} == {1.0}
    assert {u.pi for u in units if u.stratum == "rest"} == {7 / 47}
    assert math.isclose(sum(u.pi for u in units), 10)  # Σπ = n: the π are the draw's
    # a large signal stratum keeps ⌈0.2 n⌉ slots for the rest, so every unit has π > 0
    units = _units(40, 10)
    drawn, strata = pick(units, "failures", 10, seed=1)
    assert strata == {"rest": (10, 2), "signal": (40, 8)} and min(u.pi for u in units) > 0


def test_random_design_is_proportional_by_stratum() -> None:
    units = _units(0, 30)
    for i, u in enumerate(units):
        u.rep.tags["team"] = "a" if i < 20 else "b"
    drawn, strata = pick(units, "random", 6, stratify_by="team")
    assert strata == {"team=a": (20, 4), "team=b": (10, 2)}
    assert {u.pi for u in units} == {0.2}


def test_disagreement_and_uncertain_designs_read_the_named_judges() -> None:
    units = _units(0, 20)
    for i, u in enumerate(units):
        u.rep.feedback.update({"a": i % 2 == 0, "b": i % 4 == 0, "score": i / 20})
    drawn, strata = pick(units, "disagreement", 4, judges=["a", "b"])
    # a passes the even units, b every fourth: they disagree on i = 2, 6, 10, 14, 18
    assert strata == {"rest": (15, 1), "signal": (5, 3)}
    assert all(u.stratum == "signal" for u in units if u.rep.trace_id in {"t2", "t6", "t10", "t14", "t18"})
    drawn, strata = pick(units, "uncertain", 4, judges=["score"], threshold=0.5, band=0.1)
    assert strata["signal"] == (5, 3)  # scores 0.40 … 0.60
    assert {u.rep.trace_id for u in units if u.stratum == "signal"} == {f"t{i}" for i in range(8, 13)}


def test_stratified_ratio_matches_the_formula_and_a_census_has_no_variance() -> None:
    rows = [Labelled("a", "ok", 1.0, 1, "signal"), Labelled("b", "retrieval_failure", 1.0, 2, "signal"),
            Labelled("c", "ok", 0.1, 1, "rest"), Labelled("d", "retrieval_failure", 0.1, 1, "rest"),
            Labelled("e", "ok", 0.1, 1, "rest")]  # fmt: skip
    sizes = {"signal": 2, "rest": 30}
    est, uncovered = stratified_ratio(rows, sizes, "retrieval_failure")
    # θ = (2·mean(0, 2) + 30·mean(0, 1, 0)) / (2·mean(1, 2) + 30·1) = (2 + 10) / 33
    assert math.isclose(est.value, 12 / 33) and uncovered == []
    d = [x * 1.0 - 12 / 33 * 1 for x in (0, 1, 0)]
    mean = sum(d) / 3
    s2 = sum((x - mean) ** 2 for x in d) / 2
    half = 1.959963984540054 * math.sqrt(30**2 * (1 - 3 / 30) * s2 / 3) / 33
    # the normal interval, widened where Korn–Graubard's exact one (few positives) is wider: never narrower
    from rag_experiments.evaluation.intervals import korn_graubard

    kg_lo, kg_hi = korn_graubard(12 / 33, (half / 1.959963984540054) ** 2, 5)
    assert math.isclose(est.ci_high, min(1.0, max(12 / 33 + half, kg_hi))) and est.ci_high - est.value >= half
    assert est.ci_low == max(0.0, min(est.value - half, kg_lo))  # clipped
    census, _ = stratified_ratio(rows[:2], {"signal": 2}, "ok")
    assert census.value == census.ci_low == census.ci_high == 1 / 3
    # a label never seen is not "certainly 0": Clopper–Pearson for 0 of n_eff (Kish) successes
    never, _ = stratified_ratio(rows, sizes, "error")
    w = [1, 2, 10, 10, 10]  # N_h/n_h · m
    n_eff = sum(w) ** 2 / sum(x * x for x in w)
    assert never.value == never.ci_low == 0 and math.isclose(never.ci_high, 1 - 0.025 ** (1 / n_eff))
    assert stratified_ratio(rows[:2], sizes, "ok")[1] == ["rest"]  # not covered: said, not guessed
    # without strata: the Hájek estimate with weights m/π
    h = hajek(rows, "retrieval_failure")
    assert math.isclose(h.value, (2 / 1 + 1 / 0.1) / (1 + 2 + 10 + 10 + 10))


def test_a_reviewers_note_says_never_as_checks():
    checks, text, problems = note_checks(
        'never: refund in cash ; CRITICAL never: " 100 % " ;never:/a+b/; call back'
    )
    assert checks == [
        {"type": "not_contains", "value": "refund in cash"},
        {"type": "not_contains", "value": " 100 % ", "critical": True},  # quotes keep the spaces
        {"type": "not_regex", "value": "a+b"},
    ]
    assert text == ["call back"] and problems == []
    assert note_checks("never: //")[2] and note_checks("")[0:2] == ([], [])
    assert note_checks("we never said that")[1] == ["we never said that"]  # no colon: free text


# ------------------------------------------------------------------------------ a traced run


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    root = tmp_path_factory.mktemp("prod")
    chat = ChatServer(lambda body: answer_for(_prompt_of(body)), usage=(50, 9))
    try:
        run_sweep(
            root, "retriever=bm25", "prompt=cite", "generator=openai", f"generator.base_url={chat.url}",
            "generator.model=digest", "generator.api_key_env=HOME", "judge=heuristic", "judge_card.enabled=false",
            "generation_subset=null", f"tracking.uri=sqlite:///{root}/mlflow.db",
            f"tracking.artifact_root={root}/mlruns", f"cache_dir={root}/cache", "progress=false",
            f"hydra.run.dir={root}/outputs", "experiment_name=prod",
        )  # fmt: skip
    finally:
        chat.close()
    return {"root": root, "uri": f"sqlite:///{root}/mlflow.db"}


def _from_traces(traced, out, *extra) -> int:
    return cli.main(["from-traces", "--experiment", "prod", "--tracking-uri", traced["uri"], "--out", str(out),
                     "--pick", "failures", "--n", "10", *extra])  # fmt: skip


def _rows(path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_from_traces_accept_and_estimate_on_a_traced_sample_run(traced, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    review = tmp_path / "review.csv"
    assert _from_traces(traced, review) == 0
    rows = _rows(review)
    design = json.loads((tmp_path / "review.design.json").read_text())
    assert len(rows) == 10 and list(rows[0]) == COLUMNS
    assert all(0 < float(r["inclusion_prob"]) <= 1 for r in rows)
    assert all(r["retrieved_context"] and r["trace_id"].startswith("tr-") for r in rows)
    assert sum(n for _, n in design["strata"].values()) == 10
    for r in rows:  # the CSV's π is the design's: n_h / N_h of the row's stratum
        u = design["units"][r["id"]]
        n_units, n_drawn = design["strata"][u["stratum"]]
        assert float(r["inclusion_prob"]) == u["pi"] == n_drawn / n_units
    (n_sig, d_sig), (n_rest, d_rest) = design["strata"]["signal"], design["strata"]["rest"]
    # failures first, ⌈0.2·10⌉ slots kept for the rest (as many as it has), the signal stratum fills the others
    assert n_rest >= 1 and d_rest == min(2, n_rest) and d_sig == 10 - d_rest and n_sig >= d_sig
    assert all(
        design["units"][r["id"]]["reasons"] for r in rows if design["units"][r["id"]]["stratum"] == "signal"
    )
    assert design["frame_judge"] is not None  # failure_label on every trace: PPI applies
    out = capsys.readouterr().out
    assert "near-duplicates merged (MiniLM cosine ≥ 0.95)" in out

    # the reviewer: evidence and answer from the sample (these are its questions), a label for each
    # answer, one row left for later and one discarded
    by_query = {it["query"]: it for it in SAMPLE}
    for i, r in enumerate(rows):
        item = by_query[r["query"]]
        ev = item["gold_evidence"]
        r["keep"] = "unanswerable" if not ev else "yes"
        r["doc_id"], r["quote"] = (ev[0]["doc_id"], ev[0]["quote"]) if ev else ("", "")
        r["answer"] = item.get("gold_answer") or ""
        r["label"] = "ok" if i % 3 else "generation_failure"
    rows[0]["note"] = 'never: "free of charge"; critical never: /(?i)\\bguarantee\\w*/; seen by Ana'
    rows[-1]["keep"] = rows[-1]["label"] = ""  # not reviewed yet
    rows[-2]["keep"] = "discard"
    with review.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    base = tmp_path / "base.jsonl"
    picked = {r["query"] for r in rows}
    base.write_text("".join(json.dumps(it) + "\n" for it in SAMPLE if it["query"] not in picked))
    new = tmp_path / "new.jsonl"
    argv = ["accept", str(review), "--corpus", DOCS, "--evalset", str(base), "--out", str(new),
            "--tracking-uri", traced["uri"], "--experiment", "prod"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "8 new item(s) (0 already in the eval set, 1 discarded, 1 not reviewed yet" in out
    assert cli.main(["validate", "--corpus", DOCS, "--evalset", str(new)]) == 0
    from rag_experiments.evalset.corpus import load_corpus

    docs = load_corpus(DOCS)
    _, d_base = load_evalset(base, docs)
    items, d_new = load_evalset(new, docs)
    assert d_new != d_base and len(items) == len(SAMPLE) - 10 + 8
    added = [json.loads(x) for x in new.read_text().splitlines()][-8:]
    kept = [r for r in rows if r["keep"] in ("yes", "unanswerable")]
    assert [a["source"]["trace_id"] for a in added] == [r["trace_id"] for r in kept]
    assert all(a["id"].startswith("trace-") and "production" in a["tags"] for a in added)
    # the reviewer's note: two checks, validated as any assert, and the rest kept as the note
    assert added[0]["assert"] == [{"type": "not_contains", "value": "free of charge"},
                                  {"type": "not_regex", "value": "(?i)\\bguarantee\\w*", "critical": True}]  # fmt: skip
    assert added[0]["source"]["note"] == "seen by Ana" and all("assert" not in a for a in added[1:])
    # the MLflow evaluation dataset: the new version, its parent and each record's trace
    client = MlflowClient(tracking_uri=traced["uri"])
    ds = client.search_datasets(filter_string=f"name = 'evalset-{d_new[:16]}'")[0]
    assert ds.tags["parent_digest"] == d_base and ds.tags["source"] == "from-traces"
    mlflow.set_tracking_uri(traced["uri"])
    recs = ds.to_df()
    lineage = {r["item_id"]: t.get("source_trace") for r, t in zip(recs["inputs"], recs["tags"], strict=True)}
    assert {lineage[a["id"]] for a in added} == {a["source"]["trace_id"] for a in added}

    # re-accepting the same review onto the new eval set changes nothing
    again = tmp_path / "again.jsonl"
    assert cli.main([*argv[:5], str(new), "--out", str(again), "--no-mlflow"]) == 0
    assert again.read_text() == new.read_text()
    assert "nothing new" in capsys.readouterr().out

    # the production estimate: n, coverage, a CI per label, PPI with the judge on every trace
    assert cli.main(["estimate", str(review)]) == 0
    out = capsys.readouterr().out
    assert "n = 9 labelled of 10 sampled" in out and "stratified ratio (Hájek)" in out
    assert "covers: " in out and "traces of experiment 'prod'" in out
    line = next(x for x in out.splitlines() if x.startswith("generation_failure"))
    share, lo, hi = (
        float(x) for x in line.replace("[", " ").replace("]", " ").replace(",", " ").split()[1:4]
    )
    assert 0 <= lo <= share <= hi <= 1 and hi > lo
    head = next(x for x in out.splitlines() if x.startswith("label"))
    assert head.split()[-6:] == ["judge", "only", "PPI", "PPI", "95%", "CI"]
    # without the design file: the rows' own π (Hájek, with-replacement variance), and no coverage claims
    (tmp_path / "review.design.json").unlink()
    assert cli.main(["estimate", str(review)]) == 0
    out = capsys.readouterr().out
    assert "Hájek estimator with weights m/π" in out and "covers:" not in out


def test_accept_refuses_bad_reviews_and_writes_nothing(traced, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    review = tmp_path / "review.csv"
    assert _from_traces(traced, review, "--seed", "3") == 0
    rows = _rows(review)
    base = tmp_path / "base.jsonl"
    base.write_text("".join(json.dumps(it) + "\n" for it in SAMPLE[:20]))
    out = tmp_path / "new.jsonl"
    argv = ["accept", str(review), "--corpus", DOCS, "--evalset", str(base), "--out", str(out), "--no-mlflow"]

    def write(rows, header=COLUMNS):
        with review.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows([[r.get(c, "") for c in COLUMNS] for r in rows])

    good = dict(rows[0], keep="yes", doc_id="refunds.md", quote="not a sentence of the refunds page")
    write([good])
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    # the eval-set validator's own message, at the review's line
    assert f"{review}:2: gold_evidence[0].quote: not found in refunds.md" in err and not out.exists()
    write([dict(rows[0], keep="maybe")])
    assert cli.main(argv) == 2 and "keep: 'maybe'" in capsys.readouterr().err
    write([rows[0], dict(rows[1], id=rows[0]["id"])])
    assert cli.main(argv) == 2 and "id: duplicate" in capsys.readouterr().err
    write(rows[:2], header=[*COLUMNS[:-1], "verdict"])
    assert cli.main(argv) == 2 and "header: changed" in capsys.readouterr().err
    # a note's check is an assert like any other: an invalid regex names the row, exit 2
    ok = dict(rows[0], keep="unanswerable")
    write([dict(ok, note="critical never: /refund(/")])
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{review}:2: note: assert[0]: not_regex: invalid regular expression" in err
    assert f"(row {rows[0]['id']}, from its never: entries)" in err
    write([dict(ok, note="never:   ")])
    assert (
        cli.main(argv) == 2 and f"{review}:2: note: 'never:': never: needs a text" in capsys.readouterr().err
    )
    assert not out.exists()
    # a review written before the note column: accepted, no check
    with review.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(LEGACY_COLUMNS)
        w.writerow([ok.get(c, "") for c in LEGACY_COLUMNS])
    assert cli.main(argv) == 0 and "assert" not in out.read_text().splitlines()[-1]


def test_from_traces_bad_input_exits_2_and_user_app_traces_are_read(traced, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = traced["uri"]
    client = MlflowClient(tracking_uri=uri)
    mlflow.set_tracking_uri(uri)
    client.create_experiment("empty")
    out = tmp_path / "r.csv"
    base = ["from-traces", "--tracking-uri", uri, "--out", str(out), "--n", "3"]
    assert cli.main([*base, "--experiment", "empty"]) == 2
    assert "no trace" in capsys.readouterr().err and not out.exists()

    # an application traced with MLflow tracing, without a retriever span
    mlflow.set_experiment("chatbot")
    for i in range(4):
        with mlflow.start_span("app", span_type=SpanType.CHAIN) as s:
            s.set_inputs({"messages": [{"role": "user", "content": f"How do refunds work, case {i}?"}]})
            s.set_outputs({"choices": [{"message": {"role": "assistant", "content": "Within 5 days."}}]})
    mlflow.flush_trace_async_logging()
    assert cli.main([*base, "--experiment", "chatbot"]) == 2
    err = capsys.readouterr().err
    assert "has a RETRIEVER span" in err and "What still works" in err and not out.exists()
    assert cli.main([*base, "--experiment", "chatbot", "--without-context", "--pick", "random"]) == 0
    assert [r["query"] for r in _rows(out)] != [] and all(r["retrieved_context"] == "" for r in _rows(out))

    # with a retriever span: its documents (text, doc id from the metadata's source) are the context
    mlflow.set_experiment("rag-app")
    for i in range(3):
        with mlflow.start_span("app", span_type=SpanType.CHAIN) as s:
            s.set_inputs({"question": f"Which events are retried, variant {i}?"})
            with mlflow.start_span("search", span_type=SpanType.RETRIEVER) as r:
                r.set_outputs([{"page_content": "Ferrymail will retry with exponential backoff",
                                "metadata": {"source": "webhook-retries.md", "score": 0.7}}])  # fmt: skip
            s.set_outputs("They are retried for 24 hours.")
    mlflow.flush_trace_async_logging()
    out2 = tmp_path / "app.csv"
    assert (
        cli.main([*base[:-4], "--out", str(out2), "--n", "2", "--experiment", "rag-app", "--pick", "random"])
        == 0
    )
    got = _rows(out2)
    assert len(got) == 2 and all("[webhook-retries.md] Ferrymail" in r["retrieved_context"] for r in got)
    assert all(r["production_answer"] == "They are retried for 24 hours." for r in got)

    # filters: a tag, and a time range with no trace in it
    tagged = tmp_path / "tagged.csv"
    args = ["--tag", "eval_tags=unanswerable", "--pick", "random", "--n", "3"]
    assert cli.main([*base[:-4], "--out", str(tagged), "--experiment", "prod", *args]) == 0
    unanswerable = {it["query"] for it in SAMPLE if "unanswerable" in it["tags"] and len(it["tags"]) == 1}
    assert len(_rows(tagged)) == 3 and {r["query"] for r in _rows(tagged)} <= unanswerable
    assert json.loads((tmp_path / "tagged.design.json").read_text())["frame_traces"] == len(unanswerable)
    later = tmp_path / "later.csv"
    assert cli.main([*base[:-4], "--out", str(later), "--experiment", "prod", "--since", "2099-01-01"]) == 2
    assert "no trace matching" in capsys.readouterr().err and not later.exists()

    # questions already in the eval set are left out: the sample's own questions, all of them
    ev = tmp_path / "ev.jsonl"
    ev.write_text("".join(json.dumps(it) + "\n" for it in SAMPLE))
    assert _from_traces(traced, tmp_path / "none.csv", "--evalset", str(ev)) == 2
    assert "already in" in capsys.readouterr().err
    assert estimate([], ["ok"]) [0].hajek.n == 0  # fmt: skip
