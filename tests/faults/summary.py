"""Fault-injection suite: a table of the cases and their outcomes at the end of the test output.

Called from ``tests/conftest.py``'s ``pytest_terminal_summary``: under pytest-xdist the controller
process, which prints the summary, never collects and so never loads a conftest below ``tests/``."""

from __future__ import annotations

from collections import defaultdict

SUITE = "tests/faults/"


def fault_table(terminalreporter) -> None:
    rows: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for outcome in ("passed", "failed", "error", "skipped"):
        for rep in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(rep, "nodeid", "")
            if SUITE not in nodeid or (outcome == "passed" and rep.when != "call"):
                continue
            module = nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
            rows[module][outcome] += 1
            rows[module]["seconds"] += getattr(rep, "duration", 0.0)
    if not rows:
        return
    tw = terminalreporter
    tw.section("fault-injection cases")
    tw.line(f"{'suite':<22} {'cases':>6} {'passed':>7} {'failed':>7} {'seconds':>8}")
    total = defaultdict(float)
    for module in sorted(rows):
        r = rows[module]
        n = r["passed"] + r["failed"] + r["error"] + r["skipped"]
        tw.line(
            f"{module:<22} {n:>6.0f} {r['passed']:>7.0f} {r['failed'] + r['error']:>7.0f} {r['seconds']:>8.1f}"
        )
        for key in ("passed", "failed", "error", "skipped", "seconds"):
            total[key] += r[key]
        total["cases"] += n
    tw.line(
        f"{'total':<22} {total['cases']:>6.0f} {total['passed']:>7.0f} "
        f"{total['failed'] + total['error']:>7.0f} {total['seconds']:>8.1f}"
    )
