"""Eval-set bootstrapping: generate → review CSV → accept → validated eval set."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from rag_experiments.cli.evalset import main
from rag_experiments.core.types import Document
from rag_experiments.evalset.corpus import load_corpus
from rag_experiments.evalset.generate import REVIEW_COLUMNS, heuristic_tags, paragraphs, sample_passages
from rag_experiments.evalset.load import load_evalset
from tests.http_fakes import FakeHTTP, Reply, Request, completion
from tests.llm_fixtures import requires_smollm2

GOOD_Q = "For how long does the service keep retrying a failed webhook?"
DOCS = {
    "good.md": "Webhooks are retried for 24 hours with exponential backoff. After that the delivery is marked failed.",
    "zdup.md": "Each retry waits twice as long as the one before it, up to one hour between attempts.",
    "nojson.md": "API keys can be rotated from the dashboard without downtime.",
    "field.md": "Invoices are issued on the first day of each month in the account currency.",
    "notfound.md": "Audit logs are kept for 400 days and can be exported as CSV.",
    "ambig.md": "Requests are signed. Keys rotate yearly. Requests are signed.",
    "err.md": "Data stays in the region chosen at sign-up.",
}
REPLIES = {  # doc -> reply content (None: HTTP 400, a generation error)
    "good.md": json.dumps(
        {
            "question": GOOD_Q,
            "quote": "retried for 24 hours with exponential backoff. After that the delivery",
            "answer": "24 hours",
        }
    ),
    "zdup.md": json.dumps(
        {
            "question": "For how long does the service keep retrying failed webhooks?",
            "quote": "up to one hour between attempts",
            "answer": "one hour",
        }
    ),
    "nojson.md": "Sure! Here is a question about rotating keys.",
    "field.md": 'Answer: {"question": "When are invoices issued?", "quote": ""}',
    "notfound.md": json.dumps(
        {"question": "How long are logs kept?", "quote": "kept for 90 days", "answer": "x"}
    ),
    "ambig.md": json.dumps(
        {"question": "Are requests signed?", "quote": "Requests are signed.", "answer": "yes"}
    ),
    "err.md": None,
    # not in DOCS: the near-miss test's own corpus
    "near.md": json.dumps(
        {
            "question": "What happens to exports before they reach the bucket?",
            "quote": "Exports are compressed with gzip before they're uploaded to the bucket",
            "answer": "they are gzip-compressed",
        }
    ),
    "number.md": json.dumps(
        {
            "question": "How many regions are there?",
            "quote": "Data is replicated across 5 regions",
            "answer": "5",
        }
    ),
}
NEAR_DOC = "Exports are **compressed** with `gzip` before they are uploaded to the bucket. Nothing else."


@pytest.fixture
def corpus(tmp_path) -> Path:
    d = tmp_path / "docs"
    d.mkdir()
    for name, text in DOCS.items():
        (d / name).write_text(text + "\n", encoding="utf-8")
    return d


@pytest.fixture
def scripted_llm():
    """An OpenAI-compatible endpoint that answers each passage's prompt with the scripted reply."""
    calls: list[str] = []

    def reply(r: Request) -> Reply | dict:
        doc = re.search(r"document '([^']+)'", r.body["messages"][-1]["content"]).group(1)
        calls.append(doc)
        content = REPLIES[doc]
        if content is None:
            return Reply(400, b'{"error": {"message": "bad"}}')
        return completion(content, r.body["model"])

    with FakeHTTP(reply) as srv:
        yield srv.url, calls


def _rows(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=REVIEW_COLUMNS)
        w.writeheader()
        w.writerows(rows)


def test_rejects_are_counted_by_reason_and_accept_validates(corpus, scripted_llm, tmp_path, capsys):
    url, calls = scripted_llm
    review = tmp_path / "review.csv"
    argv = ["generate", "--corpus", str(corpus), "--n", "20", "--base-url", url, "--model", "scripted"]
    assert main([*argv, "--api-key-env", "", "--out", str(review)]) == 0
    out = capsys.readouterr().out
    assert sorted(calls) == sorted(DOCS)  # one call per passage; 7 one-paragraph documents
    assert "7 generator calls, 1 kept" in out
    for reason in ("generation_error", "no_json", "missing_field", "quote_not_found", "quote_ambiguous"):
        assert f"{reason}: 1" in out, reason
    assert "near_duplicate: 1" in out  # zdup.md, after good.md: MiniLM cosine ≥ 0.9
    rows = _rows(review)
    assert [r["query"] for r in rows] == [GOOD_Q] and rows[0]["keep"] == ""
    assert rows[0]["tags"] == "paraphrase;boundary"  # 'long', 'service' not in quote; two sentences

    # the reviewer keeps it, adds a hand-written row, and rejects a broken one
    rows[0]["keep"] = "Yes"
    hand = dict(id="hand-1", query="Where is data stored?", doc_id="err.md", quote="Data stays in the region")
    rows += [{**hand, "answer": "", "tags": "exact", "keep": "1"}]
    rows += [dict(id="x", query="?", doc_id="nope.md", quote="zzz", answer="", tags="", keep="no")]
    _write(review, rows)
    out_jsonl = tmp_path / "evalset.jsonl"
    assert main(["accept", str(review), "--corpus", str(corpus), "--out", str(out_jsonl)]) == 0
    items, _ = load_evalset(out_jsonl, load_corpus(corpus))
    assert [it.id for it in items] == [rows[0]["id"], "hand-1"]
    assert items[0].tags == ["paraphrase", "boundary"]
    assert DOCS["good.md"][items[0].gold_spans[0].start :].startswith("retried for 24 hours")

    # bad rows marked keep: file:line messages, exit 2, nothing written
    rows[2]["keep"] = "true"  # nope.md is not in the corpus
    rows[1]["quote"] = "Data stays in the continent"
    _write(review, rows)
    out_jsonl.unlink()
    capsys.readouterr()
    assert main(["accept", str(review), "--corpus", str(corpus), "--out", str(out_jsonl)]) == 2
    err = capsys.readouterr().err
    assert f"{review}:3: gold_evidence[0].quote: not found in err.md" in err
    assert f"{review}:4: gold_evidence[0].doc_id: unknown document 'nope.md'" in err
    assert not out_jsonl.exists()
    rows[2]["keep"] = "maybe"
    _write(review, rows)
    assert main(["accept", str(review), "--corpus", str(corpus), "--out", str(out_jsonl)]) == 2
    assert f"{review}:4: keep: 'maybe'" in capsys.readouterr().err


def test_passages_are_seeded_and_tags_follow_the_rules():
    text = "First para one. Still first.\n\n  Second para here.\n\n\nThird."
    assert [text[s:e] for s, e in paragraphs(text)] == [
        "First para one. Still first.",
        "Second para here.",
        "Third.",
    ]
    docs = [Document("b", "B", text), Document("a", "A", "Alpha.\n\nBeta.")]
    one = sample_passages(docs, 3, seed=1)
    assert one == sample_passages(list(reversed(docs)), 3, seed=1) and len(one) == 3
    assert len(sample_passages(docs, 99)) == 5  # every window once, no more
    from rag_experiments.evalset.generate import Candidate

    d = Document("d", "D", text)
    s = text.index("Still")
    c = Candidate(
        "c", "What is still first?", "d", "Still first.\n\n  Second", "", s, text.index("Second") + 6
    )
    assert heuristic_tags(d, c) == ["exact", "boundary", "multi_chunk"]  # crosses a paragraph break
    c2 = Candidate("c", "Where is the second para zebra?", "d", "Second para here.", "", *paragraphs(text)[1])
    assert heuristic_tags(d, c2) == ["synonym"]  # 'zebra' occurs nowhere in the document


@requires_smollm2
def test_end_to_end_with_the_packaged_local_model(tmp_path, capsys):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "retries.md").write_text(
        "# Retries\n\nWebhooks are retried for 24 hours with exponential backoff.\n\n"
        "After 15 attempts the delivery is marked failed and an email is sent.\n",
        encoding="utf-8",
    )
    (d / "keys.md").write_text(
        "# Keys\n\nAPI keys can be rotated from the dashboard.\n\nOld keys stop working after 24 hours.\n",
        encoding="utf-8",
    )
    review = tmp_path / "review.csv"
    argv = ["generate", "--corpus", str(d), "--n", "4", "--max-tokens", "96", "--out", str(review)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    m = re.search(r"(\d+) generator calls, (\d+) kept \(\d+ near-miss quotes[^)]*\); rejected (.*)", out)
    calls, kept = int(m.group(1)), int(m.group(2))
    rejected = {k: int(v) for k, v in re.findall(r"(\w+): (\d+)", m.group(3))}
    assert calls == 4 and kept + sum(rejected.values()) == calls, out
    # the reply schema is passed to llama.cpp: some replies parse even from the 135M model
    assert rejected["no_json"] + rejected["missing_field"] < calls, out
    rows = _rows(review)
    assert len(rows) == kept and list(rows[0] if rows else REVIEW_COLUMNS) == REVIEW_COLUMNS
    # keep every surviving row, plus a hand-edited one; accept must validate them all
    for r in rows:
        r["keep"] = "yes"
    rows.append(
        dict(
            id="hand",
            query="How long are webhooks retried?",
            doc_id="retries.md",
            quote="24 hours",
            answer="",
            tags="",
            keep="yes",
        )
    )
    _write(review, rows)
    out_jsonl = tmp_path / "evalset.jsonl"
    assert main(["accept", str(review), "--corpus", str(d), "--out", str(out_jsonl)]) == 0
    items, _ = load_evalset(out_jsonl, load_corpus(d))
    assert len(items) == kept + 1


def _corpus(root: Path, docs: dict[str, str]) -> Path:
    d = root / "docs"
    d.mkdir()
    for name, text in docs.items():
        (d / name).write_text(text + "\n", encoding="utf-8")
    return d


def test_near_miss_quote_is_kept_with_its_similarity_and_progress_has_an_eta(scripted_llm, tmp_path, capsys):
    """A quote the model did not copy verbatim (Markdown dropped, "they are" → "they're") is kept
    for review as the document's span with its similarity; a changed number is not a near miss."""
    url, _ = scripted_llm
    docs = _corpus(tmp_path, {"near.md": NEAR_DOC, "number.md": "Data is replicated across 3 regions."})
    review = tmp_path / "review.csv"
    argv = ["generate", "--corpus", str(docs), "--n", "5", "--base-url", url, "--model", "scripted"]
    assert main([*argv, "--api-key-env", "", "--out", str(review)]) == 0
    cap = capsys.readouterr()
    assert "2 generator calls, 1 kept (1 near-miss quotes" in cap.out and "quote_not_found: 1" in cap.out
    (row,) = _rows(review)
    assert row["quote"] == "Exports are **compressed** with `gzip` before they are uploaded to the bucket."
    assert row["generated_quote"] == json.loads(REPLIES["near.md"])["quote"]
    assert 0.85 <= float(row["similarity"]) < 1 and row["tags"].endswith(";near_miss")
    # progress on stderr (not a TTY): started, a line with the ETA, done
    assert "[evalset generate] started: 2 passages" in cap.err and "ETA" in cap.err
    assert "[evalset generate] done: 2 passages" in cap.err
    # the kept span loads: accept validates it like any row
    row["keep"] = "yes"
    _write(review, [row])
    assert main(["accept", str(review), "--corpus", str(docs), "--out", str(tmp_path / "e.jsonl")]) == 0
    # --near-miss above 1: exact quotes only, so nothing is kept
    assert main([*argv, "--api-key-env", "", "--out", str(review), "--near-miss", "1.01"]) == 0
    assert "0 kept" in capsys.readouterr().out


def test_nothing_kept_says_why_and_what_to_do(scripted_llm, tmp_path, capsys):
    url, _ = scripted_llm
    docs = _corpus(tmp_path, {k: DOCS[k] for k in ("notfound.md", "nojson.md")})
    review = tmp_path / "review.csv"
    argv = ["generate", "--corpus", str(docs), "--n", "5", "--base-url", url, "--model", "scripted"]
    assert main([*argv, "--api-key-env", "", "--no-progress", "--out", str(review)]) == 0
    cap = capsys.readouterr()
    assert "set keep=yes" not in cap.out and cap.err == ""
    assert (
        "nothing kept: 1 no_json, 1 quote_not_found" in cap.out
        or "nothing kept: 1 quote_not_found, 1 no_json" in cap.out
    )
    assert "quote_not_found: the model did not copy a sentence of the passage verbatim" in cap.out
    assert f"Use a more capable --model at {url}" in cap.out
    assert "no_json: replies held no JSON object: raise --max-tokens (now 200)" in cap.out
    assert _rows(review) == []
    # with the packaged local model the advice names the exact flags of a capable endpoint
    from types import SimpleNamespace

    from rag_experiments.evalset.generate import GenerationReport, empty_advice

    rep = GenerationReport(calls=20)
    rep.rejected.update({"quote_not_found": 17, "no_json": 3})
    args = SimpleNamespace(base_url=None, max_tokens=200, dedup_threshold=0.9)
    advice = empty_advice(rep, args)
    assert advice[0] == "nothing kept: 17 quote_not_found, 3 no_json"
    assert "--base-url http://localhost:8000/v1 --model qwen2.5-7b-instruct" in advice[1]


def test_rejected_replies_are_written_with_their_reason(corpus, scripted_llm, tmp_path, capsys):
    """Issue 37: "keeps 0 of 5" and the replies were nowhere. ``--rejected FILE``: one JSON line per
    rejected reply (the reply, the reason, where it came from), and the output says where."""
    url, _ = scripted_llm
    review, rejected = tmp_path / "review.csv", tmp_path / "out" / "rejects.jsonl"
    argv = ["generate", "--corpus", str(corpus), "--n", "20", "--base-url", url, "--model", "scripted"]
    assert main([*argv, "--api-key-env", "", "--no-progress", "--out", str(review), "--rejected", str(rejected)]) == 0
    out = capsys.readouterr().out
    recs = [json.loads(line) for line in rejected.read_text(encoding="utf-8").splitlines()]
    by_reason = {r["reason"]: r for r in recs}
    assert sorted(by_reason) == sorted(
        ["generation_error", "no_json", "missing_field", "quote_not_found", "quote_ambiguous", "near_duplicate"]
    ) and len(recs) == 6
    for reason, doc in [("no_json", "nojson.md"), ("missing_field", "field.md"), ("quote_not_found", "notfound.md"),
                        ("quote_ambiguous", "ambig.md"), ("near_duplicate", "zdup.md")]:
        assert by_reason[reason]["doc_id"] == doc and by_reason[reason]["reply"] == REPLIES[doc], reason
    assert by_reason["generation_error"]["doc_id"] == "err.md" and "400" in by_reason["generation_error"]["error"]
    assert by_reason["near_duplicate"]["question"] == json.loads(REPLIES["zdup.md"])["question"]
    start, end = by_reason["no_json"]["passage_start"], by_reason["no_json"]["passage_end"]
    assert (corpus / "nojson.md").read_text()[start:end] == DOCS["nojson.md"]
    line = next(ln for ln in out.splitlines() if ln.startswith("wrote 6 rejected replies to "))
    assert line.startswith(f"wrote 6 rejected replies to {rejected} (")
    for reason in by_reason:
        assert f"1 {reason}" in line, reason
    # without the flag they go beside the review CSV, and a second run leaves no stale lines
    (tmp_path / "one").mkdir()
    docs = _corpus(tmp_path / "one", {"good.md": DOCS["good.md"]})
    argv = ["generate", "--corpus", str(docs), "--n", "5", "--base-url", url, "--model", "scripted"]
    assert main([*argv, "--api-key-env", "", "--no-progress", "--out", str(review)]) == 0
    default = tmp_path / "review.rejected.jsonl"
    assert default.read_text() == "" and f"wrote 0 rejected replies to {default}\n" in capsys.readouterr().out
