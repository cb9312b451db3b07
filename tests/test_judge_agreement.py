"""The default heuristic judge against human labels (SciFact pairs in ../shared; skipped if absent),
through the judge card (scripts/judge_agreement.py is a thin wrapper over it)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rag_experiments.cli.judge_card import main as card_main

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "judge_agreement.py"


def _script():
    spec = importlib.util.spec_from_file_location("judge_agreement", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_heuristic_judge_rejects_contradicting_evidence_far_more_than_similarity(
    shared_datasets, tmp_path, capsys
):
    pairs_path = shared_datasets / "judge_pairs" / "pairs.jsonl"
    if not pairs_path.is_file():
        pytest.skip("judge_pairs not present")
    ja = _script()
    test = ja.split_pairs(ja.load_pairs(pairs_path), "test")  # the half the calibration never saw
    chosen = [p for p in test if p.type == "contradict_evidence"] + [
        p for p in test if p.type == "support_evidence"
    ][:60]
    part = tmp_path / "part.jsonl"
    ja._write(chosen, part)
    argv = ["--judge", "heuristic", "--pairs", str(part), "--json", "--resamples", "200"]
    assert card_main([*argv, "--cache-dir", str(tmp_path / "cache")]) == 0
    card = json.loads(capsys.readouterr().out)
    accept = {t: c["value"] for t, c in card["accept_by_type"].items()}
    # reference: an embedding-similarity judge accepts 84 % of contradicting evidence
    assert accept["contradict_evidence"] < 0.65, accept
    assert accept["support_evidence"] > accept["contradict_evidence"], accept
    assert card["unparseable_rate"]["value"] == 0.0 and card["n"] == len(chosen)


def test_wrapper_needs_pairs_and_reports_bad_labels(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("JUDGE_PAIRS", raising=False)
    ja = _script()
    assert ja.main([]) == 2
    assert "give --pairs" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "a", "claim": "c", "context": "x", "label": "yes"}) + "\n")
    assert ja.main(["--pairs", str(bad)]) == 2
    assert f"{bad}:1: unknown label 'yes'" in capsys.readouterr().err
