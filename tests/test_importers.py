"""Importers repair what they can, drop what they cannot, say so, and write an eval set that loads."""

from __future__ import annotations

import json

from rag_experiments.cli.evalset import main
from rag_experiments.evalset.corpus import load_corpus
from rag_experiments.evalset.importers import import_squad, locate_answer
from rag_experiments.evalset.load import load_evalset

P1 = "Denver won the game. The Broncos beat Carolina 24 to 10 in Santa Clara. Denver celebrated."
P2 = "The halftime show featured Coldplay with   Beyonce and Bruno Mars."


def _squad(tmp_path):
    qas1 = [
        {"id": "ok", "question": "who won", "answers": [{"text": "Denver", "answer_start": 0}]},
        {  # off by three: moved to the text
            "id": "shifted",
            "question": "who lost",
            "answers": [{"text": "Carolina", "answer_start": P1.index("Carolina") + 3}],
        },
        {  # "Denver" occurs at 0 and near the end: the occurrence nearest answer_start wins
            "id": "nearest",
            "question": "who celebrated",
            "answers": [{"text": "Denver", "answer_start": len(P1) - 5}],
        },
        {  # offsets past the end of the document, and a second answer that is nowhere
            "id": "partly_missing",
            "question": "where",
            "answers": [
                {"text": "Santa Clara", "answer_start": 5000},
                {"text": "Levi's Stadium", "answer_start": 10},
            ],
        },
        {"id": "missing", "question": "when", "answers": [{"text": "February 7", "answer_start": 3}]},
    ]
    qas2 = [  # whitespace differs between the answer text and the paragraph
        {
            "id": "spaces",
            "question": "with whom",
            "answers": [{"text": "Coldplay with Beyonce", "answer_start": 0}],
        }
    ]
    data = {
        "data": [
            {
                "title": "Super Bowl 50",
                "paragraphs": [{"context": P1, "qas": qas1}, {"context": P2, "qas": qas2}],
            }
        ]
    }
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data))
    return path


def test_locate_answer_prefers_the_given_offset_then_the_nearest_occurrence():
    assert locate_answer("a b a b", "a", 4) == (4, 5)
    assert locate_answer("a b a b", "a", 3) == (4, 5)
    assert locate_answer("a b a b", "a", 1) == (0, 1)
    assert locate_answer("x  New\nYork y", "New York", 0) == (3, 11)
    assert locate_answer("abc", "zz", 0) is None


def test_import_squad_repairs_and_drops_and_the_result_validates(tmp_path, capsys):
    src = _squad(tmp_path)
    corpus, evals, rep = import_squad(src)
    assert (rep.kept, rep.repaired, rep.dropped, rep.dropped_items) == (1, 4, 2, 1)
    by_id = {e["id"]: e for e in evals}
    assert set(by_id) == {"ok", "shifted", "nearest", "partly_missing", "spaces"}
    text = corpus[0]["text"]
    for e in evals:
        for ev in e["gold_evidence"]:
            quote = text[ev["start"] : ev["end"]]
            assert " ".join(quote.split()) in {" ".join(k.split()) for k in e["key_facts"]}, (e["id"], quote)
    assert by_id["nearest"]["gold_evidence"][0]["start"] == P1.rindex("Denver")
    assert by_id["partly_missing"]["key_facts"] == ["Santa Clara"]

    out = tmp_path / "out"
    assert main(["import-squad", str(src), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "kept 1, repaired 4, dropped 2" in printed and "question missing" in printed
    items, _ = load_evalset(out / "evalset.jsonl", load_corpus(out / "corpus.jsonl"))
    assert len(items) == 5


def test_import_squad_strict_exits_2_naming_the_items(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["import-squad", str(_squad(tmp_path)), "--out", str(out), "--strict"]) == 2
    err = capsys.readouterr().err
    assert "question shifted: answers[0]: answer_start" in err and "question missing" in err
    assert not (out / "evalset.jsonl").exists()


def _beir(tmp_path):
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    docs = [
        {"_id": "1", "title": "a", "text": "ranking documents"},
        {"_id": "2", "title": "b", "text": "bm25"},
    ]
    (beir / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    qs = [{"_id": "q1", "text": "what ranks documents"}, {"_id": "q2", "text": "only missing docs"}]
    (beir / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in qs))
    (beir / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\t1\t1\nq1\t99\t1\nq2\t98\t1\nq3\t2\t1\nq1\t2\t0\n"
    )
    return beir


def test_import_beir_reports_and_drops_qrels_naming_missing_documents(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["import-beir", str(_beir(tmp_path)), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "kept 1, repaired 0, dropped 3" in printed
    assert "test.tsv:3: query q1: document '99' not in corpus.jsonl: dropped" in printed
    rows = [json.loads(x) for x in (out / "evalset.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1"] and [e["doc_id"] for e in rows[0]["gold_evidence"]] == ["1"]


def test_import_beir_strict_exits_2(tmp_path, capsys):
    assert main(["import-beir", str(_beir(tmp_path)), "--out", str(tmp_path / "o"), "--strict"]) == 2
    assert "document '99' not in corpus.jsonl" in capsys.readouterr().err


def test_import_squad_on_shared_xquad_keeps_every_answer_and_validates(shared_datasets, tmp_path, capsys):
    src = shared_datasets / "xquad_en" / "xquad.en.json"
    assert main(["import-squad", str(src), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "kept 1190, repaired 0, dropped 0" in out and out.rstrip().endswith("OK")
