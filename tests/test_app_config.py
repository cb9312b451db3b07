"""Bad app configs are bad input (issue 42, item 3): exit 2 naming the key, never a traceback.

Every config group with a ``_target_`` is checked against its constructor (keys and types), so
``app`` needs no list of its keys in ``run/config_schema.py``, only its ranges."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from rag_experiments.run.assemble import input_problems
from tests.sweep_helpers import REPO, make_tiny


def _problems(tmp_path, *overrides: str) -> list[str]:
    docs, ev = make_tiny(tmp_path, n_items=2)
    base = [f"corpus.path={docs}", "corpus=dir", "evalset=file", f"evalset.path={ev}", "retriever=bm25",
            f"cache_dir={tmp_path}/cache", "progress=false", "judge=heuristic"]  # fmt: skip
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "rag_experiments" / "conf")):
        cfg = compose("config", overrides=[*base, *overrides])
    problems, _ = input_problems(cfg)
    return problems


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["app=python", "app.target=tests.app_fixture:quick", "app.params=5"], "conf/app: params: must be"),
        (["app=python", "app.target=tests.app_fixture:quick", "app.concurrency=0"], "conf/app: concurrency: must be an integer >= 1"),
        (["app=http", "app.url=http://127.0.0.1:9/ask", "app.concurrency=-3"], "conf/app: concurrency: must be an integer >= 1"),
        (["app=python", "app.target=tests.app_fixture:quick", "+app.colour=red"], "conf/app: colour: unknown option for PythonApp"),
        (["app=python", "app.target=no_colon"], "app.target: cannot import 'no_colon'"),
        (["app=python", "app.target=tests.app_fixture:exits"], "app.target: the first question failed: SystemExit"),
        (["app=python", "app.target=tests.app_fixture:bare_string_contexts"], "contexts: expected a list, got str"),
    ],
    ids=["params-5", "concurrency-0", "concurrency-neg", "unknown-key", "no-colon", "sys-exit-at-probe", "bare-string"],
)
def test_a_bad_app_config_is_a_problem_naming_its_key(tmp_path, overrides, expected):
    problems = _problems(tmp_path, *overrides)
    assert any(expected in p for p in problems), problems


def test_an_app_module_with_a_syntax_error_is_a_problem(tmp_path, monkeypatch):
    (tmp_path / "broken_syntax_app.py").write_text("def answer(q:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    problems = _problems(tmp_path, "app=python", "app.target=broken_syntax_app:answer")
    assert any("app.target: cannot import" in p and "SyntaxError" in p for p in problems), problems
