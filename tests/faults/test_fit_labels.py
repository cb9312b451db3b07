"""`judge fit --labels` with labels a verifier cannot learn from: one class, or the same claim and
context labelled both ways. Exit 2 naming the file, before anything is trained."""

from __future__ import annotations

import json

import pytest

from rag_experiments.cli.judge_fit import main

CTX = "Refunds are issued within 5 business days."


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "rows,message",
    [
        (
            [
                {"id": f"p{i}", "claim": f"Refunds take {i} days.", "context": CTX, "label": "supported"}
                for i in range(4)
            ],
            "one class",
        ),
        (
            [
                {"id": "a", "claim": "Refunds take 5 days.", "context": CTX, "label": "supported"},
                {"id": "b", "claim": "Refunds take 9 days.", "context": CTX, "label": "unsupported"},
                {"id": "c", "claim": "refunds take 5  days.", "context": CTX, "label": "unsupported"},
            ],
            "opposite labels",
        ),
    ],
)
def test_unusable_labels_exit_2_naming_the_file(tmp_path, capsys, rows, message):
    labels = _write(tmp_path / "my_labels.jsonl", rows)
    rc = main(
        [
            "--labels",
            str(labels),
            "--no-mlflow",
            "--no-progress",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--synthetic-max",
            "20",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "my_labels.jsonl" in err and message in err, err
    assert not (tmp_path / "cache").exists() or not any(
        (tmp_path / "cache").rglob("*.json")
    )  # nothing trained
