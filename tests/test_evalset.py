"""Eval-set loading, validation (every corruption → FILE:LINE: field, exit 2) and importers."""

import json
import shutil
from pathlib import Path

import pytest

from rag_experiments.cli.evalset import main
from rag_experiments.evalset.corpus import Corpus, corpus_digest, load_corpus
from rag_experiments.evalset.load import EvalSetError, load_evalset, sample_dir

DOC = "# Webhooks\n\nFailed deliveries retry with exponential backoff for 24 hours.\n\nSee retries. See retries.\n"


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "webhooks.md").write_text(DOC)
    ev = tmp_path / "evalset.jsonl"
    ev.write_text(
        json.dumps(
            {
                "id": "q1",
                "query": "how long do webhooks retry",
                "gold_evidence": [{"doc_id": "webhooks.md", "quote": "exponential  backoff\nfor 24 hours"}],
                "gold_answer": "24 hours",
                "key_facts": ["24 hours"],
                "tags": ["paraphrase"],
            }
        )
        + "\n"
    )
    return docs, ev


def _write(ev: Path, rows: list) -> None:
    ev.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_quote_resolves_to_exact_span_with_whitespace_normalised(tiny):
    docs, ev = tiny
    items, digest = load_evalset(ev, load_corpus(docs))
    (span,) = items[0].gold_spans
    assert DOC[span.start : span.end] == "exponential backoff for 24 hours"
    assert len(digest) == 64


GOOD = {
    "id": "q1",
    "query": "q",
    "gold_evidence": [{"doc_id": "webhooks.md", "quote": "24 hours"}],
    "tags": [],
}

CORRUPTIONS = [
    ("bad json", ['{"id": "q1", "query": '], "json: invalid JSON"),
    ("missing field", [{"query": "q", "gold_evidence": []}], "id: missing required field"),
    ("mistyped field", [{**GOOD, "tags": "boundary"}], "tags: expected list, got string"),
    ("duplicate id", [GOOD, GOOD], "id: duplicate 'q1' (first on line 1)"),
    (
        "unknown doc",
        [{**GOOD, "gold_evidence": [{"doc_id": "nope.md", "quote": "x"}]}],
        "gold_evidence[0].doc_id: unknown document 'nope.md'",
    ),
    (
        "stale quote",
        [{**GOOD, "gold_evidence": [{"doc_id": "webhooks.md", "quote": "48 hours"}]}],
        "gold_evidence[0].quote: not found in webhooks.md",
    ),
    (
        "ambiguous quote",
        [{**GOOD, "gold_evidence": [{"doc_id": "webhooks.md", "quote": "See retries."}]}],
        "gold_evidence[0].quote: found 2 times",
    ),
    (
        "offsets outside",
        [{**GOOD, "gold_evidence": [{"doc_id": "webhooks.md", "start": 10, "end": 10_000}]}],
        "gold_evidence[0].start/end: offsets 10-10000 outside",
    ),
    ("empty query", [{**GOOD, "query": "   "}], "query: empty"),
]


@pytest.mark.parametrize("name,rows,expected", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_each_corruption_is_reported_with_file_line_field_and_exit_2(tiny, capsys, name, rows, expected):
    docs, ev = tiny
    _write(ev, rows)
    assert main(["validate", "--corpus", str(docs), "--evalset", str(ev)]) == 2
    err = capsys.readouterr().err
    line = len(rows)  # the problem sits on the last line written
    assert f"{ev}:{line}: {expected}" in err, err


def test_unknown_document_suggests_the_closest_id(tiny, capsys):
    """The validator names the document a mistyped doc_id most likely means (same file name in
    another folder first, then the closest spelling), and suggests nothing for a stranger."""
    from rag_experiments.evalset.load import closest_doc_id

    docs, ev = tiny
    (docs / "guide").mkdir()
    (docs / "guide" / "auth.md").write_text("# Auth\n\nKeys rotate yearly.\n")
    cases = {"webhook.md": "webhooks.md", "Webhooks.MD": "webhooks.md", "auth.md": "guide/auth.md"}
    for typo, meant in cases.items():
        _write(ev, [{**GOOD, "gold_evidence": [{"doc_id": typo, "quote": "24 hours"}]}])
        assert main(["validate", "--corpus", str(docs), "--evalset", str(ev)]) == 2
        err = capsys.readouterr().err
        assert f"unknown document {typo!r} (not in the corpus; did you mean {meant!r}?)" in err, err
    assert closest_doc_id("billing/invoices.md", ["webhooks.md", "guide/auth.md"]) is None
    _write(ev, [{**GOOD, "gold_evidence": [{"doc_id": "zzz.txt", "quote": "x"}]}])
    assert main(["validate", "--corpus", str(docs), "--evalset", str(ev)]) == 2
    assert "unknown document 'zzz.txt' (not in the corpus)" in capsys.readouterr().err


def test_every_problem_is_reported_not_just_the_first(tiny):
    docs, ev = tiny
    _write(ev, [c[1][-1] for c in CORRUPTIONS[1:]])
    with pytest.raises(EvalSetError) as e:
        load_evalset(ev, load_corpus(docs))
    assert len(e.value.problems) >= len(CORRUPTIONS) - 2


def test_ambiguous_quote_is_accepted_with_offsets(tiny):
    docs, ev = tiny
    start = DOC.rindex("See retries.")
    _write(
        ev,
        [
            {
                **GOOD,
                "gold_evidence": [
                    {"doc_id": "webhooks.md", "quote": "See retries.", "start": start, "end": start + 12}
                ],
            }
        ],
    )
    items, _ = load_evalset(ev, load_corpus(docs))
    assert items[0].gold_spans[0].start == start


def test_seed_format_gold_chunk_ids_resolve_under_reference_chunking(tiny):
    docs, ev = tiny
    _write(
        ev,
        [
            {
                "id": "q1",
                "query": "q",
                "gold_chunk_ids": ["webhooks.md#chunk_0", "webhooks.md#2-10"],
                "reference_chunking": "whole",
                "tags": [],
            }
        ],
    )
    items, _ = load_evalset(ev, load_corpus(docs))
    spans = items[0].gold_spans
    assert (spans[0].start, spans[0].end) == (0, len(DOC.rstrip()))
    assert (spans[1].start, spans[1].end) == (2, 10)


def test_unanswerable_must_be_tagged(tiny):
    docs, ev = tiny
    _write(ev, [{"id": "q1", "query": "q", "gold_evidence": [], "tags": []}])
    with pytest.raises(EvalSetError, match="not tagged 'unanswerable'"):
        load_evalset(ev, load_corpus(docs))


def test_bundled_sample_validates_with_tag_counts(capsys):
    assert main(["validate"]) == 0
    out = capsys.readouterr().out
    docs = load_corpus(sample_dir() / "docs")
    assert len(docs) >= 25 and sum(len(d.text.split()) for d in docs) >= 15_000
    items, _ = load_evalset(sample_dir() / "evalset.jsonl", docs)
    assert len(items) >= 100
    counts = {
        t: sum(t in it.tags for it in items)
        for t in ("paraphrase", "synonym", "multi_chunk", "boundary", "unanswerable")
    }
    assert min(counts[t] for t in ("paraphrase", "synonym", "multi_chunk", "boundary")) >= 15, counts
    assert counts["unanswerable"] >= 5
    assert all(not it.gold_spans for it in items if "unanswerable" in it.tags)
    assert all(len(it.gold_spans) >= 2 for it in items if "multi_chunk" in it.tags)
    for tag in counts:
        assert tag in out


def test_corpus_digest_is_order_independent_and_content_sensitive(tmp_path):
    shutil.copytree(sample_dir() / "docs", tmp_path / "a")
    a = Corpus(str(tmp_path / "a"))
    assert a.digest == corpus_digest(list(reversed(a.docs)))
    p = tmp_path / "a" / "webhooks.md"
    p.write_text(p.read_text() + "\nchanged")
    assert Corpus(str(tmp_path / "a")).digest != a.digest


def test_jsonl_and_beir_corpus_formats(tmp_path):
    (tmp_path / "c.jsonl").write_text(json.dumps({"doc_id": "d1", "title": "T", "text": "hello"}) + "\n")
    assert load_corpus(tmp_path / "c.jsonl")[0].doc_id == "d1"
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(
        json.dumps({"_id": "7", "title": "", "text": "BM25 ranks documents."}) + "\n"
    )
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "what ranks documents"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t7\t1\n")
    assert load_corpus(beir)[0].doc_id == "7"
    out = tmp_path / "out"
    assert main(["import-beir", str(beir), "--out", str(out)]) == 0
    items, _ = load_evalset(out / "evalset.jsonl", load_corpus(out / "corpus.jsonl"))
    assert items[0].gold_spans[0].end == len("BM25 ranks documents.")


def test_import_squad_on_xquad_resolves_every_answer_span(shared_datasets, tmp_path):
    src = shared_datasets / "xquad_en" / "xquad.en.json"
    if not src.is_file():
        pytest.skip("xquad_en not present")
    out = tmp_path / "xq"
    assert main(["import-squad", str(src), "--out", str(out)]) == 0
    docs = load_corpus(out / "corpus.jsonl")
    items, _ = load_evalset(out / "evalset.jsonl", docs)
    squad = json.loads(src.read_text())
    n_q = sum(len(p["qas"]) for a in squad["data"] for p in a["paragraphs"])
    assert len(docs) == len(squad["data"]) == 48 and len(items) == n_q == 1190
    by_id = {d.doc_id: d.text for d in docs}
    for it in items:
        assert it.gold_spans, it.id
        for s in it.gold_spans:  # the span holds an answer text exactly
            assert any(
                by_id[s.doc_id][s.start : s.end] == kf or kf in by_id[s.doc_id][s.start : s.end]
                for kf in it.key_facts
            )
