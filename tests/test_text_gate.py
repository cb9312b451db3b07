"""The one text gate (core/text_gate.py) and the app's duties it carries (issue 42, items 2-3):
every text a step returns is redacted, capped and type-checked before anything stores it, and
whatever a user's ``app=python`` target raises is that question's error."""

from __future__ import annotations

import os
import sys

import pytest

from rag_experiments.core.redaction import register_secret_env
from rag_experiments.core.text_gate import TextTypeError, gate_list, gate_text, gate_texts
from rag_experiments.stages.app import APP_ANSWER_CAP, AppReply, AppShapeError, PythonApp, reply_of

APP_KEY = "app-secret-0123456789-DoNotStore"


def test_the_gate_redacts_caps_and_counts():
    register_secret_env("RAG_GATE_KEY")
    os.environ["RAG_GATE_KEY"] = APP_KEY
    try:
        g = gate_text(f"the key is {APP_KEY} and sk-live0123456789abcdefXYZ", "answer")
        assert APP_KEY not in g.text and "sk-live" not in g.text and "[REDACTED $RAG_GATE_KEY]" in g.text
        assert not g.truncated
        big = gate_text("a" * 99 + APP_KEY + "b" * 10_000, "answer", cap=100)
        assert big.truncated and len(big.text) == 100 and APP_KEY[:4] not in big.text  # redacted, then cut
        assert gate_text("short", "answer", cap=100) == gate_text("short", "answer")
        # shapes=False: the corpus's own examples of keys stay (they must map onto it), values never
        kept = gate_text(f"use sk-example0123456789abc or {APP_KEY}", "context", shapes=False).text
        assert "sk-example0123456789abc" in kept and APP_KEY not in kept
    finally:
        del os.environ["RAG_GATE_KEY"]


def test_the_gate_refuses_wrong_types_and_never_splits_a_string():
    for bad in (None, 3, b"bytes", ["a"]):
        with pytest.raises(TextTypeError, match="answer: expected a string"):
            gate_text(bad, "answer")
    with pytest.raises(TextTypeError, match="contexts: expected a list, got str"):
        gate_list("one passage", "contexts")
    with pytest.raises(TextTypeError, match=r"rewrites\[1\]: expected a string"):
        gate_texts(["ok", 2], "rewrites")
    assert gate_texts(("a", "sk-live0123456789abcdefXYZ"), "rewrites") == ["a", "sk-[REDACTED]"]


def test_an_app_reply_passes_the_gate_where_it_is_made():
    with pytest.raises(AppShapeError, match="contexts: expected a list, got str"):
        reply_of(
            {"answer": "a", "contexts": "Failed deliveries are retried."}
        )  # never 30 one-letter contexts
    with pytest.raises(AppShapeError, match="answer: expected a string"):
        reply_of({"answer": 42, "contexts": []})
    with pytest.raises(AppShapeError, match=r"contexts\[0\]"):
        reply_of(("a", [None]))
    r = reply_of(("x" * 50 + " sk-live0123456789abcdefXYZ", ["ctx"]), cap=20)
    assert r.truncated and r.answer == "x" * 20
    assert "sk-live" not in reply_of(("say sk-live0123456789abcdefXYZ", [])).answer
    # a reply built from the cache (made before the gate existed) is gated too
    assert "sk-live" not in AppReply("old sk-live0123456789abcdefXYZ").answer
    assert reply_of(("a", None)).contexts == []


@pytest.mark.parametrize(
    ("target", "error", "exited"),
    [
        ("exits", "SystemExit: app.target tests.app_fixture:exits called sys.exit", True),
        (
            "interrupts",
            "KeyboardInterrupt: app.target tests.app_fixture:interrupts raised KeyboardInterrupt",
            True,
        ),
        ("generator_exit", "GeneratorExit", True),
        ("broken", "RuntimeError: the app is down", False),
        ("bare_string_contexts", "contexts: expected a list, got str", False),
        ("wrong_types", "answer: expected a string, got int", False),
    ],
)
def test_whatever_a_python_app_raises_is_that_questions_error(target, error, exited):
    reply = PythonApp(f"tests.app_fixture:{target}").ask("How long are webhooks retried?")
    assert error in reply.error and reply.exited is exited and reply.answer == ""


def test_a_huge_answer_is_cut_at_the_cap_and_a_secret_never_kept(monkeypatch):
    r = PythonApp("tests.app_fixture:huge", {"size": 3 * APP_ANSWER_CAP}).ask(
        "How long are webhooks retried?"
    )
    assert r.truncated and len(r.answer) == APP_ANSWER_CAP and not r.error
    small = PythonApp("tests.app_fixture:huge", {"size": 500}, max_answer_chars=100)
    assert len(small.ask("q?").answer) == 100 and "max_answer_chars" in small.identity
    assert "max_answer_chars" not in PythonApp("tests.app_fixture:huge").identity  # earlier identities kept
    monkeypatch.setenv("RAG_APP_KEY", APP_KEY)
    register_secret_env("RAG_APP_KEY")
    leaked = PythonApp("tests.app_fixture:leaks").ask("How long are webhooks retried?")
    assert APP_KEY not in leaked.answer and "sk-live" not in leaked.answer and not leaked.error


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("def answer(q:\n", "SyntaxError"),
        ("import sys\nsys.exit(0)\n", "called sys.exit"),
        ("raise KeyboardInterrupt\n", "raised KeyboardInterrupt"),
    ],
    ids=["syntax-error", "sys-exit-at-import", "interrupt-at-import"],
)
def test_an_app_module_that_cannot_be_imported_is_a_bad_target(tmp_path, monkeypatch, source, why):
    name = f"bad_app_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"app.target: cannot import .*{why}"):
        PythonApp(f"{name}:answer")
    sys.modules.pop(name, None)


@pytest.mark.slow  # forks a process
def test_a_forking_app_is_contained(tmp_path):
    """The child of a bare ``os.fork()`` returns into our code: it is ended there, so it never runs
    the sweep (two runs, two exits); the parent's reply counts."""
    reply = PythonApp("tests.app_fixture:forks").ask("How long are webhooks retried?")
    assert not reply.error and reply.answer  # we are the parent (the child never got here)
