"""The default heuristic judge against human labels (SciFact pairs in ../shared; skipped if absent)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "judge_agreement.py"


def _script():
    spec = importlib.util.spec_from_file_location("judge_agreement", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_heuristic_judge_rejects_contradicting_evidence_far_more_than_similarity(shared_datasets):
    pairs_path = shared_datasets / "judge_pairs" / "pairs.jsonl"
    if not pairs_path.is_file():
        pytest.skip("judge_pairs not present")
    ja = _script()
    pairs = ja.load_pairs(pairs_path, split="test")
    pairs = [p for p in pairs if p["type"] == "contradict_evidence"] + [
        p for p in pairs if p["type"] == "support_evidence"
    ][:60]
    preds, _ = ja.run(ja.build_judge("heuristic", []), pairs)
    contra = [pr for p, pr in zip(pairs, preds, strict=True) if p["type"] == "contradict_evidence"]
    support = [pr for p, pr in zip(pairs, preds, strict=True) if p["type"] == "support_evidence"]
    accept_contra = sum(v == "supported" for v in contra) / len(contra)
    accept_support = sum(v == "supported" for v in support) / len(support)
    # reference: an embedding-similarity judge accepts 84 % of contradicting evidence
    assert accept_contra < 0.65, accept_contra
    assert accept_support > accept_contra, (accept_support, accept_contra)
    assert all(v in ("supported", "unsupported", "unparseable") for v in preds)
