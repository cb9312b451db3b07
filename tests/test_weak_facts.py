"""Key-fact correctness that cannot be gamed: whole-token matching, numbers as numbers, and weak key
facts (evalset.weak_facts) flagged by ``evalset validate`` and left out of correctness."""

import json
import math
from pathlib import Path

import pytest

from rag_experiments.cli.evalset import main
from rag_experiments.core.types import EvalItem, Span
from rag_experiments.evalset.corpus import Corpus, load_corpus
from rag_experiments.evalset.load import EvalSet, load_evalset, sample_dir
from rag_experiments.evalset.weak_facts import WEAK_SHARE, chunk_shares, weak_key_facts, weak_reason
from rag_experiments.evaluation.answer_metrics import judge_free_columns, run_aggregates
from rag_experiments.evaluation.answer_scores import correctness, key_fact_recall
from rag_experiments.stages.text import normalise_text

# A small framework-docs corpus, as in the second corpus: "environment variable" is on every
# page (so in far more than WEAK_SHARE of the chunks), "GET" is a three-letter method name.
PAGES = {
    "routing.md": "# Routing\n\nA function route answers GET requests unless you list other methods. "
    "Set the port with the PORT environment variable.\n",
    "config.md": "# Configuration\n\nEvery setting can come from an environment variable. "
    "Settings are read once at startup.\n",
    "deploy.md": "# Deploying\n\nBehind a proxy, set the FORWARDED_ALLOW_IPS environment variable "
    "so client addresses are right.\n",
    "testing.md": "# Testing\n\nThe test client sends requests without a server. Use an environment "
    "variable to point tests at a database.\n",
    "static.md": "# Static files\n\nStatic files are served from a directory you mount at a path.\n",
}


#: 100 more short pages, every fourth mentioning an environment variable: the corpus rule needs a
#: corpus of at least WEAK_MIN_CORPUS chunks.
MORE = {
    f"topic-{i:03d}.md": f"# Topic {i}\n\nFeature {i} is described here."
    + (" Configure it with an environment variable." if i % 4 == 0 else "")
    for i in range(100)
}


@pytest.fixture
def framework(tmp_path: Path) -> tuple[Path, Path]:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in (PAGES | MORE).items():
        (docs / name).write_text(text)
    rows = [
        {"id": "m1", "query": "which http method does a plain function route accept",
         "gold_evidence": [{"doc_id": "routing.md", "quote": "A function route answers GET requests"}],
         "key_facts": ["GET"], "tags": ["exact"]},
        {"id": "m2", "query": "how do i choose the socket the server listens on",
         "gold_evidence": [{"doc_id": "routing.md", "quote": "Set the port with the PORT environment variable."}],
         "key_facts": ["environment variable", "PORT"], "tags": ["exact"]},
        {"id": "m3", "query": "where are static files served from",
         "gold_evidence": [{"doc_id": "static.md", "quote": "served from a directory you mount at a path"}],
         "key_facts": ["directory you mount", "static files"], "tags": ["exact"]},
        {"id": "m4", "query": "are settings read once", "gold_evidence": [
            {"doc_id": "config.md", "quote": "Settings are read once at startup."}],
         "key_facts": ["not", "startup", "15"], "tags": ["exact"]},
    ]  # fmt: skip
    ev = tmp_path / "evalset.jsonl"
    ev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return docs, ev


def test_validate_reports_get_and_every_weak_reason_with_item_and_line(framework, capsys):
    docs, ev = framework
    assert main(["validate", "--corpus", str(docs), "--evalset", str(ev)]) == 0  # a warning, not an error
    out = capsys.readouterr().out
    assert f"{ev}:1: m1: key fact 'GET': 3 characters or fewer" in out
    assert f"{ev}:2: m2: key fact 'environment variable': in 28% of the corpus's chunks (29 of 105" in out
    assert f"{ev}:3: m3: key fact 'static files': found in the question" in out
    assert f"{ev}:4: m4: key fact 'not': 3 characters or fewer" in out
    assert "'PORT'" not in out and "'directory you mount'" not in out and "'15'" not in out  # strong
    assert "weak key facts: 4 in 4 items" in out
    assert "weak-only items: m1" in out  # m2, m3, m4 keep a strong fact


def test_each_rule_alone():
    assert weak_reason("GET", "which method", 0, 100) == "3 characters or fewer"
    assert weak_reason("15", "max attempts", 0, 100) is None  # a number: length says nothing
    assert weak_reason("$1,791", "refund", 0, 100) is None
    assert weak_reason("do not", "x", 0, 100) == "a stop word"
    assert weak_reason("Sev-2", "why is my sev-1 treated as sev-2", 0, 100) == "found in the question"
    assert weak_reason("Webhook", "webhooks?", 0, 100) == "found in the question"  # after normalisation
    assert weak_reason("30 days", "q", 11, 100).startswith("in 11% of the corpus's chunks (11 of 100")
    assert weak_reason("30 days", "q", 10, 100) is None  # more than the share, not equal
    assert weak_reason("30 days", "q", 2, 100) is None  # fewer than 3 chunks
    assert weak_reason("30 days", "q", 40, 99) is None  # 40 %, but the corpus has fewer than 100 chunks
    assert WEAK_SHARE == 0.10


def test_chunk_share_counts_whole_tokens_only(framework):
    docs = load_corpus(framework[0])
    shares = chunk_shares(["environment variable", "GET", "get", "static", "stat"], docs)
    assert shares["environment variable"] == pytest.approx(29 / 105)
    assert shares["GET"] == shares["get"] == pytest.approx(1 / 105)
    assert shares["static"] == pytest.approx(1 / 105) and shares["stat"] == 0.0


def test_the_corpus_rule_is_off_in_a_small_corpus(tmp_path, capsys):
    """Four topical pages of the sample: "24 hours" is in 5 of their 27 chunks, yet it is the
    answer, not noise; below WEAK_MIN_CORPUS chunks only length, stop words and the question apply."""
    from tests.sweep_helpers import make_tiny

    docs, ev = make_tiny(tmp_path, n_items=8)
    assert main(["validate", "--corpus", str(docs), "--evalset", str(ev)]) == 0
    out = capsys.readouterr().out
    assert "the corpus rule is off (27 chunks of 800 characters, fewer than 100)" in out
    assert "'24 hours'" not in out and "weak key facts: none" in out


# Real answers (the second corpus, answers read by hand and labelled wrong): both scored
# correctness 1.0 on their weak key fact.
WRONG_GET = (
    "Function routes accept GET requests, and function routes also take POST, PUT and DELETE by default."
)
NONSENSE = "You can use the environment variable to make the route a static route for the proxy."


def test_weak_facts_are_left_out_of_correctness(framework):
    docs, ev = framework
    es = EvalSet(str(ev), Corpus(str(docs)))
    by_id = {it.id: it for it in es.items}
    assert by_id["m1"].weak_key_facts == ["GET"] and by_id["m1"].strong_key_facts == []
    assert by_id["m2"].strong_key_facts == ["PORT"]
    assert [str(w) for w in es.weak][0] == "m1: key fact 'GET': 3 characters or fewer"
    # today's rule credits both wrong answers in full
    assert correctness(WRONG_GET, ["GET"], True) == 1.0
    assert correctness(NONSENSE, ["environment variable"], True) == 1.0
    items = [by_id["m1"], by_id["m2"]]
    rows = judge_free_columns(items, [WRONG_GET, NONSENSE], ["", ""], [[], []], cites=False)
    assert math.isnan(rows[0]["correctness"])  # no strong fact: not scored, not credited
    assert rows[1]["correctness"] == 0.0  # "PORT" is missing
    assert [r["n_weak_key_facts"] for r in rows] == [1, 1]
    right = judge_free_columns([by_id["m2"]], ["Set the PORT environment variable."], [""], [[]], cites=False)
    assert right[0]["correctness"] == 1.0
    import pandas as pd

    df = pd.DataFrame([{"id": it.id, **r} for it, r in zip(items, rows, strict=True)])
    df["gold_spans"] = [[{"doc_id": "routing.md", "start": 0, "end": 1}]] * 2
    assert run_aggregates(pd.concat([df, df]))["n_weak_key_facts"] == 2  # once per item, not per replicate


@pytest.mark.parametrize(
    "answer, fact, found",
    [
        ("Retries stop after 24 hours.", "24 hours", True),
        ("A 24-hour window.", "24 hours", True),
        ("Retries stop after 24 h.", "24 hours", False),  # no unit is declared equal to another
        ("Retries stop after 24 hrs.", "24 hours", False),
        ("At most 150 attempts.", "15", False),
        ("Retry after 1.5 seconds.", "15", False),
        ("On the 15th of the month.", "15", False),
        ("At most 15 attempts.", "15", True),
        ("It costs $1,000.", "1000", True),
        ("It costs 1000 dollars.", "1,000", True),
        ("500,000 messages every month.", "500000", True),
        ("Refund of $1791.", "$1,791", True),
        ("An uptime credit of 25 %.", "25%", True),
        ("An uptime credit of 25%.", "25", True),  # a bare number matches the number with a unit
        ("Requires Python 3.10.", "3.1", False),
        ("Requires Python 3.9 or later.", "3.9", True),
        ("Retries on days 3, 5 and 7.", "3, 5 and 7 days", False),  # order of words matters
        ("Retries after 3, 5 and 7 days.", "3, 5 and 7 days", True),
    ],
)
def test_numbers_match_as_numbers(answer, fact, found):
    assert key_fact_recall(answer, [fact]) == float(found), (normalise_text(answer), normalise_text(fact))


def test_bundled_sample_weak_facts(capsys):
    """The bundled sample: 41 weak key facts in 39 items (28 items keep no strong fact); the figure
    docs/metrics.md quotes. "5" (b030) is weak since "five" counts as the number: 20 of 184 chunks."""
    docs = load_corpus(sample_dir() / "docs")
    items, _ = load_evalset(sample_dir() / "evalset.jsonl", docs)
    weak = weak_key_facts(items, docs)
    assert (len(weak), len({w.item_id for w in weak})) == (41, 39)
    got = {(w.item_id, w.fact): w.reason for w in weak}
    assert got[("a029", "one")] == "3 characters or fewer"
    assert got[("a043", "workspace")] == "found in the question"
    assert ("a002", "15") not in got and ("a016", "429") not in got  # numbers are not weak by length
    assert got[("b030", "5")].startswith("in 11% of the corpus's chunks (20 of 184")
    assert main(["validate"]) == 0
    assert "weak key facts: 41 in 39 items" in capsys.readouterr().out


def test_items_built_without_a_corpus_have_no_weak_facts():
    it = EvalItem("x", "q", [Span("d", 0, 1)], key_facts=["GET", " "])
    assert it.weak_key_facts == [] and it.strong_key_facts == ["GET"]
