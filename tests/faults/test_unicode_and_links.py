"""Small input faults: an NFD document against an NFC quote, and a symlink in a corpus directory
that points outside it."""

from __future__ import annotations

import json
import unicodedata

from rag_experiments.evalset.corpus import Corpus, load_directory
from rag_experiments.evalset.load import EvalSet


def test_nfd_document_matches_an_nfc_quote(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    text = unicodedata.normalize("NFD", "Le café ferme à 18 h. Réouverture lundi.")
    (docs / "cafe.md").write_text(text, encoding="utf-8")
    quote = unicodedata.normalize("NFC", "café ferme à 18 h")
    ev = tmp_path / "evalset.jsonl"
    ev.write_text(
        json.dumps({"id": "q1", "query": "Quand?", "gold_evidence": [{"doc_id": "cafe.md", "quote": quote}]})
        + "\n"
    )
    (item,) = EvalSet(str(ev), Corpus(str(docs))).items
    (span,) = item.gold_spans
    assert unicodedata.normalize("NFC", text[span.start : span.end]) == quote  # the whole NFD text


def test_a_symlink_out_of_the_corpus_is_skipped_with_a_message(tmp_path, capsys):
    outside = tmp_path / "secret.md"
    outside.write_text("# Private\nnot part of the corpus\n")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A\nreal document\n")
    (docs / "inside.md").symlink_to(docs / "a.md")  # inside the corpus: still read
    (docs / "leak.md").symlink_to(outside)
    ids = [d.doc_id for d in load_directory(docs)]
    assert ids == ["a.md", "inside.md"], ids
    err = capsys.readouterr().err
    assert "leak.md" in err and "outside" in err, err
