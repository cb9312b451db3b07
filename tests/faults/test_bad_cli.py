"""Bad CLI arguments and spot-check label files: exit 2 with a message naming run, file/line."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from rag_experiments import spotcheck
from rag_experiments.cli import compare, gate
from rag_experiments.report import cli as report
from tests.test_spotcheck import store  # noqa: F401 - the module's hand-logged judged run

UNKNOWN = "0123456789abcdef0123456789abcdef"


def _cli_cases(uri: str, rid: str) -> list[tuple[str, object, list[str], str]]:
    return [
        ("compare-unknown-runs", compare.main, [UNKNOWN, "nope", "--tracking-uri", uri], "unknown run"),
        ("compare-one-run", compare.main, [rid, "--tracking-uri", uri], "give exactly two runs"),
        (
            "compare-unknown-sweep",
            compare.main,
            ["--sweep", "nosweep", "--baseline", rid, "--tracking-uri", uri],
            "no child runs with sweep_id 'nosweep'",
        ),
        (
            "compare-unknown-experiment",
            compare.main,
            ["gen-run", "retr", "--experiment", "nope", "--tracking-uri", uri],
            "unknown experiment 'nope'",
        ),
        (
            "gate-unknown-candidate",
            gate.main,
            ["--baseline", rid, "--candidate", UNKNOWN, "--tracking-uri", uri],
            "unknown run",
        ),
        (
            "report-unknown-target",
            report.main,
            ["no-such-sweep", "--tracking-uri", uri, "--no-log"],
            "unknown run 'no-such-sweep'",
        ),
        (
            "spotcheck-unknown-run",
            spotcheck.main,
            ["--tracking-uri", uri, "sample", UNKNOWN, "-n", "2"],
            "unknown run",
        ),
        (
            "spotcheck-n-zero",
            spotcheck.main,
            ["--tracking-uri", uri, "sample", rid, "-n", "0"],
            "-n must be >= 1",
        ),
        (
            "spotcheck-retrieval-only-run",
            spotcheck.main,
            ["--tracking-uri", uri, "sample", "retr", "-n", "2"],
            "no judged claims",
        ),
    ]


@pytest.mark.parametrize("case", range(9), ids=[c[0] for c in _cli_cases("", "")])
def test_bad_cli_argument_exits_2(case, store, capsys):  # noqa: F811
    uri, _, rid = store
    name, fn, argv, message = _cli_cases(uri, rid)[case]
    rc = fn(argv)
    err = capsys.readouterr().err
    assert rc == 2, (name, err)
    assert message in err, (name, err)
    assert "Traceback" not in err


def _labels(tmp_path: Path, uri: str, rid: str, capsys) -> tuple[Path, list[dict]]:
    out = tmp_path / "labels.csv"
    assert (
        spotcheck.main(["--tracking-uri", uri, "sample", rid, "-n", "4", "--seed", "0", "--out", str(out)])
        == 0
    )
    capsys.readouterr()
    with open(out, newline="", encoding="utf-8") as f:
        return out, list(csv.DictReader(f))


def _csv(rows: list[dict], fields: list[str] | None = None) -> bytes:
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields or list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue().encode()


def _label_all(rows, verdict="supported"):
    return [{**r, "human_verdict": verdict} for r in rows]


LABEL_CASES = {
    "labels-non-utf8": (
        lambda rows: _csv(_label_all(rows)).replace(b"supported", b"supp\xe9rted", 1),
        ": file: not valid UTF-8 (",
    ),
    "labels-binary": (lambda rows: bytes(range(256)) * 8, ": file: not valid UTF-8"),
    "labels-empty-file": (lambda rows: b"", ":1: item_id: missing column"),
    "labels-none-labelled": (lambda rows: _csv(rows), ": human_verdict: no claim labelled (4 blank rows)"),
    "labels-unclosed-quote": (
        lambda rows: _csv(_label_all(rows)) + b'q9#0,"open quote\n',
        "row: not valid CSV",
    ),
    "labels-too-many-fields": (
        lambda rows: _csv(_label_all(rows)) + b"a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p\n",
        "fields, the header has",
    ),
    "labels-duplicate-item": (lambda rows: _csv(_label_all(rows + rows[:1])), "already labelled on line"),
    "labels-bad-verdict": (lambda rows: _csv(_label_all(rows, "yes")), "human_verdict: 'yes' is not one of"),
}


@pytest.mark.parametrize("case", list(LABEL_CASES))
def test_malformed_label_file_exits_2_naming_file_and_line(case, store, tmp_path, capsys):  # noqa: F811
    uri, _, rid = store
    out, rows = _labels(tmp_path, uri, rid, capsys)
    build, message = LABEL_CASES[case]
    out.write_bytes(build(rows))
    rc = spotcheck.main(["--tracking-uri", uri, "score", rid, str(out), "--no-log"])
    err = capsys.readouterr().err
    assert rc == 2, (case, err)
    assert re.search(rf"{re.escape(str(out))}(:\d+)?: ", err) and message in err, (case, err[:2000])
    assert "Traceback" not in err and len(err) < 8000
