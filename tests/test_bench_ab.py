"""scripts/bench_ab.py reads a run's output: its timing table and the CPU of its progress blocks
(canned output; the benchmark itself asserts no time)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from tests.sweep_helpers import REPO

_spec = importlib.util.spec_from_file_location("bench_ab", REPO / "scripts" / "bench_ab.py")
bench_ab = importlib.util.module_from_spec(_spec)
sys.modules["bench_ab"] = bench_ab  # its dataclass looks its module up
_spec.loader.exec_module(bench_ab)

OUTPUT = """\
[generation] done: 6 answers, 44.8 s
rate_ok                          0.000  [ 0.000,  0.000]  6
stage           seconds  share
chunking            0.0   0.0%
retrieval           0.3   0.3%
generation         50.3  51.7%
judging            21.2  21.8%
judge_card          9.1   9.4%
total              97.3
model calls {'retrieval': 1, 'generation': 6}
"""


def test_timing_table_is_read_to_its_total_row():
    assert bench_ab.parse_timing_table(OUTPUT) == {
        "chunking": 0.0,
        "retrieval": 0.3,
        "generation": 50.3,
        "judging": 21.2,
        "judge_card": 9.1,
        "total": 97.3,
    }


def test_the_last_table_wins_and_no_table_is_empty():
    later = OUTPUT.replace("50.3  51.7%", "60.0  55.0%")
    assert bench_ab.parse_timing_table(OUTPUT + later)["generation"] == 60.0
    assert bench_ab.parse_timing_table("[retrieval] done: 0.3 s\nno table here\n") == {}


def test_cpu_is_charged_to_the_open_block():
    events = [
        ("", 0.0),
        ("[generation] started: 6 answers", 5.0),  # 5 s before it: other
        ("[generation] 3/6 (50%) 27 s elapsed", 9.0),  # not a block line: still generation
        ("[generation] done: 6 answers, 50.3 s", 12.0),
        ("[judging] started: 6 answers", 13.0),
        ("[judging] interrupted: 3/6 answers, 2.0 s", 20.0),
        ("", 21.5),
    ]
    assert bench_ab.block_cpu(events) == {"other": 7.5, "generation": 7.0, "judging": 7.0}


def test_summary_gives_ratios_and_the_load():
    def run(cpu, judging, rc=0):
        return bench_ab.Run(
            "x", cpu, cpu + 10, {"judging": judging}, {"judging": judging / 2}, (1.0, 2.0), rc
        )

    text = bench_ab.summary(
        [run(80.0, 20.0), run(70.0, 16.0)], [run(60.0, 10.0), run(70.0, 8.0, rc=1)], "old", "new"
    )
    lines = {line.split("  ")[0].strip(): line for line in text.splitlines()}
    assert lines["CPU, whole tree"].split()[3:6] == ["75.0", "65.0", "0.87"]
    assert "0.50" in lines["wall judging"] and "20.0/10.0" in lines["wall judging"]
    assert "1.0-2.0/1.0-2.0" in text and "FAILED runs" in text


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")
def test_tree_cpu_counts_this_process():
    assert bench_ab.tree_cpu(os.getpid()) > 0.0
