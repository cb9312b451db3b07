"""The test tiers' rule by construction (tests/conftest.py): a test that starts a process, a server
or a model — itself, through a fixture or through a test helper — is slow; others are not."""

from __future__ import annotations

import subprocess

from tests.conftest import starts_something
from tests.sweep_helpers import run_sweep, tiny_pipeline


def _sweeps(tmp):
    return run_sweep(tmp, [])


def _indirect(tmp):
    return _sweeps(tmp)


def _shell():
    return subprocess.run(["true"], check=False)


def _pure(x):
    return sorted(x)


def _bm25_pipeline(inputs):
    return tiny_pipeline(inputs)


def _heuristic():
    from rag_experiments.judge.validity import build_judge

    return build_judge("heuristic")


def _no_model_judge():
    from rag_experiments.judge.validity import build_judge

    return build_judge("none")


#: by name, so that these tests do not themselves read (and so "call") the helpers that start things
HELPERS = {f.__name__: f for f in (_sweeps, _indirect, _shell, _pure, _bm25_pipeline, _heuristic, _no_model_judge)}


def test_a_sweep_a_subprocess_or_a_model_is_slow_even_through_a_helper():
    assert all(starts_something(HELPERS[n]) for n in ("_sweeps", "_indirect", "_shell", "_heuristic"))


def test_pure_code_a_bm25_pipeline_and_a_judge_without_a_model_are_not():
    assert not any(starts_something(HELPERS[n]) for n in ("_pure", "_bm25_pipeline", "_no_model_judge"))
