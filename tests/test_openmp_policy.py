"""OpenMP threads wait passively unless the user says otherwise (issue 42, item 13: spinning
threads doubled MiniLM's CPU on a shared 2-core machine, with bit-identical vectors)."""

from __future__ import annotations

import os

import rag_experiments


def test_importing_the_package_sets_a_passive_wait_policy_a_user_value_wins(monkeypatch):
    assert os.environ.get("OMP_WAIT_POLICY"), "set on import, before any OpenMP runtime loads"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    import importlib

    importlib.reload(rag_experiments)
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    importlib.reload(rag_experiments)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
