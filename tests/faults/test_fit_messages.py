"""Issue 31 item 12: "`judge fit` dies with no message". Probed through the CLI with missing, empty,
malformed and binary label files, labels of one class, a directory, a bad corpus or ``--out``,
out of memory and a killed fit: every path prints what happened. The three that did not: a
SIGTERM (exit 143, nothing printed), a label file that is not UTF-8 (a traceback, exit 3) and
running out of memory (a traceback called a bug, exit 3)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rag_experiments.cli.judge_fit import main

ROOT = Path(__file__).resolve().parents[2]


def _args(tmp_path, *extra: str) -> list[str]:
    return [
        "--no-mlflow",
        "--no-progress",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--synthetic-max",
        "20",
        *extra,
    ]


def test_a_label_file_that_is_not_utf8_exits_2_naming_file_and_line(tmp_path, capsys):
    labels = tmp_path / "exported.jsonl"
    labels.write_bytes(b'{"id": "a"}\n\xff\xfe\x00binary\n')
    rc = main(_args(tmp_path, "--labels", str(labels)))
    err = capsys.readouterr().err
    assert rc == 2 and f"{labels}:2: file: not valid UTF-8" in err, err
    assert "Traceback" not in err


def test_out_of_memory_while_fitting_exits_2_with_a_message(tmp_path, capsys, monkeypatch):
    import rag_experiments.judge.verifier_fit as vf

    def no_memory(*a, **kw):  # the fault: torch's CPU allocator giving up
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(vf, "fit_verifier", no_memory)
    rc = main(_args(tmp_path))
    err = capsys.readouterr().err
    assert (
        rc == 2 and "out of memory while fitting the verifier" in err and "--synthetic-max (now 20)" in err
    ), err
    assert "Traceback" not in err
    monkeypatch.setattr(vf, "fit_verifier", lambda *a, **kw: (_ for _ in ()).throw(MemoryError()))
    assert main(_args(tmp_path)) == 2 and "out of memory" in capsys.readouterr().err


def test_a_killed_fit_says_so_in_one_line(tmp_path):
    """SIGTERM (a CI timeout) while the verifier is being fitted: one line naming the signal and
    what was written, exit 143, no traceback; no verifier directory is left behind."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "rag_experiments.judge", "fit", "--no-mlflow", "--cache-dir", str(cache)]
    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    seen = []
    deadline = time.time() + 240
    for line in p.stderr:  # wait until it is fitting (its progress line)
        seen.append(line)
        if line.startswith("[verifier fit]") or time.time() > deadline:
            break
    assert seen and seen[-1].startswith("[verifier fit]"), "".join(seen)
    p.send_signal(signal.SIGTERM)
    _, rest = p.communicate(timeout=120)
    lines = [x for x in rest.splitlines() if x.strip() and "it/s]" not in x and "s/it]" not in x]
    assert p.returncode == 128 + signal.SIGTERM, rest
    assert lines[-1].startswith(
        "[interrupted] SIGTERM: judge fit stopped while fitting the verifier; nothing written"
    )
    assert "Traceback" not in rest
    assert not list(cache.rglob("manifest.json"))
