"""Bad eval sets and corpora: exit 2, a message naming file and line, nothing else on stderr.

Run in-process through ``python -m rag_experiments.evalset validate``'s ``main``: the sweep
loads data through the same loaders (``test_bad_config`` runs one case through the sweep CLI
to show the path end to end creates no MLflow run).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from rag_experiments.cli import evalset as evalset_cli
from tests.sweep_helpers import make_tiny

MB10 = 10 * 1024 * 1024


def _items(ev: Path) -> list[dict]:
    return [json.loads(line) for line in ev.read_text().splitlines()]


def _write_items(ev: Path, items: list, raw_lines: dict[int, bytes] | None = None) -> None:
    lines = [json.dumps(it).encode() for it in items]
    for i, raw in (raw_lines or {}).items():
        lines.insert(i, raw)
    ev.write_bytes(b"\n".join(lines) + b"\n")


def _mutate(i: int, **changes) -> Callable[[Path, Path], tuple[Path, Path]]:
    """Eval-set case: item ``i`` (line i+1) with ``changes`` (None deletes a field)."""

    def build(docs: Path, ev: Path) -> tuple[Path, Path]:
        items = _items(ev)
        for k, v in changes.items():
            if v is None:
                items[i].pop(k, None)
            else:
                items[i][k] = v(items[i]) if callable(v) else v
        _write_items(ev, items)
        return docs, ev

    return build


def _evidence(**fields):
    return lambda it: [{**it["gold_evidence"][0], **fields}]


def _raw_line(at: int, raw: bytes):
    def build(docs: Path, ev: Path):
        _write_items(ev, _items(ev), {at: raw})
        return docs, ev

    return build


def _ev_file(content: bytes):
    def build(docs: Path, ev: Path):
        ev.write_bytes(content)
        return docs, ev

    return build


def _doc(name: str, content: bytes):
    def build(docs: Path, ev: Path):
        (docs / name).write_bytes(content)
        return docs, ev

    return build


def _only_empty_docs(docs: Path, ev: Path):
    for p in docs.iterdir():
        p.write_bytes(b"")
    return docs, ev


def _empty_dir(docs: Path, ev: Path):
    for p in docs.iterdir():
        p.unlink()
    return docs, ev


def _jsonl_corpus(lines: list[bytes]):
    def build(docs: Path, ev: Path):
        rows = [
            json.dumps({"doc_id": p.name, "title": p.stem, "text": p.read_text()}).encode()
            for p in sorted(docs.iterdir())
        ]
        out = docs.parent / "corpus.jsonl"
        out.write_bytes(b"\n".join(rows + lines) + b"\n")
        return out, ev

    return build


def _other_corpus(name: str, content: bytes | None):
    def build(docs: Path, ev: Path):
        p = docs.parent / name
        if content is not None:
            p.write_bytes(content)
        return p, ev

    return build


_rng = random.Random(0)
BINARY = bytes(_rng.randrange(256) for _ in range(8192))

# (case id, builder, what the message must contain: file and line, or the key)
EVALSET_CASES = [
    (
        "evalset-non-utf8",
        _raw_line(2, b'{"id": "x\xff\xfe", "query": "q"}'),
        "evalset.jsonl:3: encoding: not valid UTF-8",
    ),
    ("evalset-latin1-file", _ev_file("caf\u00e9 ol\u00e9\n".encode("latin-1")), "evalset.jsonl:1: encoding"),
    ("evalset-binary", _ev_file(BINARY), "evalset.jsonl:"),
    (
        "evalset-array-line",
        _raw_line(1, b'["q1", "query"]'),
        "evalset.jsonl:2: item: expected a JSON object, got array",
    ),
    (
        "evalset-scalar-line",
        _raw_line(0, b"42"),
        "evalset.jsonl:1: item: expected a JSON object, got integer",
    ),
    ("evalset-truncated-json", _raw_line(1, b'{"id": "q", "query": '), "evalset.jsonl:2: json: invalid JSON"),
    ("evalset-10mb-garbage-line", _raw_line(1, b"{" + b"x" * MB10), "evalset.jsonl:2: json"),
    (
        "evalset-10mb-quote",
        _mutate(0, gold_evidence=_evidence(quote="zq" * (MB10 // 2))),
        "evalset.jsonl:1: gold_evidence[0].quote: not found",
    ),
    (
        "evalset-nul-in-json",
        _raw_line(1, b'{"id": "n\x00", "query": "q", "gold_evidence": []}'),
        "evalset.jsonl:2: json",
    ),
    ("evalset-id-int", _mutate(0, id=7), "evalset.jsonl:1: id: expected str, got integer"),
    ("evalset-query-list", _mutate(1, query=["a"]), "evalset.jsonl:2: query: expected str, got array"),
    ("evalset-missing-query", _mutate(0, query=None), "evalset.jsonl:1: query: missing"),
    ("evalset-empty-query", _mutate(0, query="   "), "evalset.jsonl:1: query: empty"),
    (
        "evalset-evidence-not-list",
        _mutate(0, gold_evidence="doc.md"),
        "evalset.jsonl:1: gold_evidence: expected list",
    ),
    (
        "evalset-evidence-item-string",
        _mutate(0, gold_evidence=["refunds.md"]),
        "evalset.jsonl:1: gold_evidence[0]: expected an object",
    ),
    ("evalset-duplicate-id", _mutate(1, id=lambda it: "DUP"), None),  # replaced below
    (
        "evalset-unknown-doc",
        _mutate(0, gold_evidence=_evidence(doc_id="nope.md")),
        "evalset.jsonl:1: gold_evidence[0].doc_id: unknown document",
    ),
    (
        "evalset-offsets-out-of-range",
        _mutate(0, gold_evidence=_evidence(quote=None, start=10, end=10**9)),
        "evalset.jsonl:1: gold_evidence[0].start/end: offsets 10-1000000000 outside",
    ),
    (
        "evalset-offsets-reversed",
        _mutate(0, gold_evidence=_evidence(quote=None, start=50, end=10)),
        "evalset.jsonl:1: gold_evidence[0].start/end: offsets 50-10",
    ),
    (
        "evalset-offsets-negative",
        _mutate(0, gold_evidence=_evidence(quote=None, start=-5, end=10)),
        "evalset.jsonl:1: gold_evidence[0].start/end",
    ),
    (
        "evalset-offset-float",
        _mutate(0, gold_evidence=_evidence(quote=None, start=1.5, end=10)),
        "evalset.jsonl:1: gold_evidence[0].start: must be an integer",
    ),
    (
        "evalset-offset-bool",
        _mutate(0, gold_evidence=_evidence(quote=None, start=True, end=10)),
        "evalset.jsonl:1: gold_evidence[0].start: must be an integer",
    ),
    (
        "evalset-start-without-end",
        _mutate(0, gold_evidence=_evidence(start=3)),
        "evalset.jsonl:1: gold_evidence[0]: give both start and end",
    ),
    (
        "evalset-stale-quote",
        _mutate(0, gold_evidence=_evidence(quote="this sentence is in no document")),
        "evalset.jsonl:1: gold_evidence[0].quote: not found",
    ),
    (
        "evalset-ambiguous-quote",
        _mutate(0, gold_evidence=_evidence(quote="the")),
        "evalset.jsonl:1: gold_evidence[0].quote: found",
    ),
    (
        "evalset-unanswerable-untagged",
        _mutate(0, gold_evidence=[], tags=[]),
        "evalset.jsonl:1: gold_evidence: empty, but the item is not tagged",
    ),
    (
        "evalset-tagged-unanswerable-with-evidence",
        _mutate(0, tags=["unanswerable"]),
        "evalset.jsonl:1: tags: tagged 'unanswerable'",
    ),
    (
        "evalset-key-fact-number",
        _mutate(0, key_facts=[24]),
        "evalset.jsonl:1: key_facts[0]: must be a non-empty string",
    ),
    # MLflow rejects by_tag/<tag>/... keys with these; found at load, not after the run's work
    ("evalset-tag-angle-brackets", _mutate(0, tags=["a<b>=c"]), "evalset.jsonl:1: tags[0]: 'a<b>=c'"),
    ("evalset-tag-emoji", _mutate(1, tags=["fast\U0001f680"]), "evalset.jsonl:2: tags[0]: 'fast"),
    ("evalset-tag-dot-dot", _mutate(0, tags=["../up"]), "evalset.jsonl:1: tags[0]: '../up' cannot name"),
    (
        "evalset-id-nul-escape",
        _raw_line(
            1,
            rb'{"id": "n\u0000", "query": "q", "gold_evidence": [], '
            rb'"tags": ["unanswerable"]}',
        ),
        "evalset.jsonl:2: id: contains control characters (U+0000)",
    ),
    (
        "evalset-id-escape-char",
        _mutate(0, id="q\x1b[31m"),
        "evalset.jsonl:1: id: contains control characters (U+001B)",
    ),
    ("evalset-query-nul", _mutate(0, query="what\u0000"), "evalset.jsonl:1: query: contains a NUL"),
    ("evalset-empty-file", _ev_file(b""), "evalset.jsonl: eval set is empty"),
    ("evalset-blank-lines-only", _ev_file(b"\n\n  \n"), "evalset.jsonl: eval set is empty"),
]
EVALSET_CASES[15] = (
    "evalset-duplicate-id",
    lambda docs, ev: (_write_items(ev, [*_items(ev)[:2], _items(ev)[0]]), (docs, ev))[1],
    "evalset.jsonl:3: id: duplicate",
)

CORPUS_CASES = [
    ("corpus-md-non-utf8", _doc("bad.md", b"# Title\n\nline two\ncaf\xe9\n"), "bad.md:4: not valid UTF-8"),
    ("corpus-binary-named-md", _doc("image.md", BINARY), "image.md:"),
    ("corpus-md-nul-bytes", _doc("nul.md", b"# T\n\nok\x00\x01\x02"), "nul.md:3: contains NUL bytes"),
    ("corpus-only-empty-files", _only_empty_docs, "every document is empty"),
    ("corpus-empty-dir", _empty_dir, "no .md or .txt files found"),
    ("corpus-missing-path", _other_corpus("nowhere", None), "nowhere: corpus not found"),
    ("corpus-csv-file", _other_corpus("corpus.csv", b"a,b\n"), "corpus.csv: expected a directory"),
    (
        "corpus-jsonl-array-line",
        _jsonl_corpus([b'["doc", "text"]']),
        "corpus.jsonl:5: expected a JSON object, got list",
    ),
    (
        "corpus-jsonl-non-utf8",
        _jsonl_corpus([b'{"doc_id": "x.md", "text": "caf\xe9"}']),
        "corpus.jsonl:5: not valid UTF-8",
    ),
    (
        "corpus-jsonl-duplicate-id",
        _jsonl_corpus([b'{"doc_id": "refunds.md", "text": "again"}']),
        "corpus.jsonl:5: doc_id: duplicate 'refunds.md'",
    ),
    (
        "corpus-jsonl-text-number",
        _jsonl_corpus([b'{"doc_id": "n.md", "text": 5}']),
        "corpus.jsonl:5: text: missing or not a string",
    ),
    ("corpus-jsonl-no-id", _jsonl_corpus([b'{"text": "x"}']), "corpus.jsonl:5: doc_id: missing"),
    (
        "corpus-jsonl-bad-json",
        _jsonl_corpus([b'{"doc_id": "x.md", "text": ']),
        "corpus.jsonl:5: invalid JSON",
    ),
    ("corpus-jsonl-empty-file", _other_corpus("empty.jsonl", b""), "empty.jsonl: no documents"),
]

TOLERATED = [
    ("evalset-bom", lambda docs, ev: (ev.write_bytes(b"\xef\xbb\xbf" + ev.read_bytes()), (docs, ev))[1]),
    (
        "evalset-crlf",
        lambda docs, ev: (ev.write_bytes(ev.read_bytes().replace(b"\n", b"\r\n")), (docs, ev))[1],
    ),
    ("corpus-md-bom-crlf", lambda docs, ev: (_bom_crlf(docs), (docs, ev))[1]),
    ("corpus-jsonl-bom-crlf", lambda docs, ev: _crlf_jsonl(docs, ev)),
]


def _bom_crlf(docs: Path) -> None:
    for p in docs.iterdir():
        p.write_bytes(b"\xef\xbb\xbf" + p.read_bytes().replace(b"\n", b"\r\n"))


def _crlf_jsonl(docs: Path, ev: Path):
    out, ev = _jsonl_corpus([])(docs, ev)
    out.write_bytes(b"\xef\xbb\xbf" + out.read_bytes().replace(b"\n", b"\r\n"))
    return out, ev


@pytest.fixture
def tiny(tmp_path) -> tuple[Path, Path]:
    return make_tiny(tmp_path)


def _validate(corpus: Path, ev: Path, capsys) -> tuple[int, str, str]:
    rc = evalset_cli.main(["validate", "--corpus", str(corpus), "--evalset", str(ev)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    "case,build,message", [pytest.param(*c, id=c[0]) for c in EVALSET_CASES + CORPUS_CASES]
)
def test_bad_input_exits_2_naming_file_and_line(case, build, message, tiny, capsys):
    corpus, ev = build(*tiny)
    rc, out, err = _validate(corpus, ev, capsys)
    assert rc == 2, (case, out, err)
    assert message in err, (case, err[:2000])
    assert "Traceback" not in err
    assert len(err) < 8000, f"{case}: {len(err)} bytes on stderr"  # raw input is never echoed
    assert "OK" not in out


@pytest.mark.parametrize("case,build", TOLERATED, ids=[c for c, _ in TOLERATED])
def test_bom_and_crlf_are_read_not_rejected(case, build, tiny, capsys):
    corpus, ev = build(*tiny)
    rc, out, err = _validate(corpus, ev, capsys)
    assert rc == 0, (case, err)
    assert "OK" in out


def test_crlf_and_bom_do_not_change_the_corpus_digest(tiny, tmp_path):
    from rag_experiments.evalset.corpus import corpus_digest, load_corpus

    docs, _ = tiny
    before = corpus_digest(load_corpus(docs))
    _bom_crlf(docs)
    assert corpus_digest(load_corpus(docs)) == before


def test_case_count():
    assert len(EVALSET_CASES) + len(CORPUS_CASES) >= 30
    assert len({c for c, *_ in EVALSET_CASES + CORPUS_CASES}) == len(EVALSET_CASES) + len(CORPUS_CASES)


@pytest.mark.parametrize("limit", [-1, 0])
def test_evalset_limit_below_one_is_an_error_not_a_slice(limit, tiny):
    from rag_experiments.evalset.corpus import load_corpus
    from rag_experiments.evalset.load import EvalSetError, load_evalset

    docs, ev = tiny
    with pytest.raises(EvalSetError, match="limit: must be a positive number of items"):
        load_evalset(ev, load_corpus(docs), limit=limit)


@pytest.fixture(scope="module")
def keys_store(tmp_path_factory):
    """One real sqlite store for every tag below (creating its schema takes seconds; each tag gets
    its own run)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path_factory.mktemp('keys')}/mlflow.db")
    return client, client.create_experiment("keys")


@pytest.mark.parametrize(
    "tag", ["ok tag", "a<b", "x=y", "fast\U0001f680", "a//b", "../x", "é-ü", "a\nb", "t/"]
)
def test_tag_rule_is_mlflows_rule(tag, keys_store):
    """``tracking.keys.tag_problem`` accepts a tag exactly when MLflow accepts its by_tag key."""
    from mlflow.exceptions import MlflowException

    from rag_experiments.core.keys import tag_problem

    client, exp = keys_store
    run = client.create_run(exp)
    try:
        client.log_metric(run.info.run_id, f"by_tag/{tag}/hit_at_5", 1.0)
        accepted = True
    except MlflowException:
        accepted = False
    assert (tag_problem(tag) is None) == accepted, (tag, tag_problem(tag))
