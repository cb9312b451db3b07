"""Issue 31 item 3: SIGTERM / Ctrl-C abort in-flight generation at once. Against an endpoint that
trickles its body (1 byte every 2 s) the sweep used to wait for the request (alive 96 s after
SIGTERM) and sent a new request after the signal; a second signal during cleanup left the run
RUNNING. Now the run is marked KILLED, no request starts after the signal, and the process ends
without joining the calls in flight."""

from __future__ import annotations

import signal
import time

import pytest

from tests.faults.test_interrupts import _popen, _runs
from tests.http_fakes import FakeHTTP, Reply, Request
from tests.sweep_helpers import make_tiny, sweep_args


def _trickle(r: Request) -> Reply:
    """An OpenAI-compatible endpoint that answers 200 and then one byte every 2 s (20 minutes)."""
    return Reply(200, b" " * 600, trickle_s=2.0)


@pytest.fixture
def trickle():
    with FakeHTTP(_trickle) as t:
        yield t


@pytest.mark.parametrize("signals", [1, 2], ids=["once", "twice"])
def test_sigterm_aborts_in_flight_generation_at_once(tmp_path, trickle, signals):
    docs, ev = make_tiny(tmp_path, n_items=4)
    args = [*sweep_args(tmp_path, docs, ev), "generator=openai", f"generator.base_url={trickle.url}",
            "generator.api_key_env=null", "generator.timeout_s=600", "generator.max_retries=0",
            "generator.concurrency=2", "generation_subset=null", "judge=heuristic", "judge_card.enabled=false",
            "tracking.traces=false"]
    proc = _popen(tmp_path, args)
    t0 = time.monotonic()
    while not trickle.requests and time.monotonic() - t0 < 240 and proc.poll() is None:
        time.sleep(0.2)
    assert trickle.requests, "the sweep never reached generation"
    time.sleep(1.0)
    n_before = len(trickle.requests)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    if signals == 2:  # during the cleanup of the first
        time.sleep(0.3)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert took < 15, f"alive {took:.1f}s after SIGTERM\n{out[-2000:]}"
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:]
    assert "Traceback" not in out, out[-3000:]
    assert len(trickle.requests) == n_before  # no request started after the signal
    statuses = {r.info.status for r in _runs(tmp_path)}
    assert statuses == {"KILLED"}, statuses


def test_no_worker_starts_a_call_once_the_signal_is_handled():
    """Issue 42 (12): once the signal handler has run, no worker takes a new item: the handler sets
    the map's stop flag before the rest of the handling (here a slow one, 0.2 s) and the interrupt's
    unwinding; a worker can at most be the one already past its guard (one per worker)."""
    import os
    import signal
    import threading
    import time

    from rag_experiments.core.parallel import thread_map

    starts: list[float] = []
    handled: list[float] = []
    lock = threading.Lock()

    def on_sigint(signum, frame):
        handled.append(time.monotonic())
        time.sleep(0.2)  # the interrupt has not unwound yet: workers must already stop
        raise KeyboardInterrupt

    def call(i: int) -> int:
        with lock:
            starts.append(time.monotonic())
        if i == 3:
            os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        return i

    old = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            thread_map(call, list(range(400)), 4)
    finally:
        signal.signal(signal.SIGINT, old)
    assert handled, "the handler never ran"
    late = [t for t in starts if t > handled[0]]
    assert len(late) <= 3, f"{len(late)} calls started after the signal was handled"


def test_worker_threads_leave_the_signals_to_the_main_thread():
    """A process-directed SIGINT/SIGTERM that landed on a worker waited for the consumer's next
    poll (0.2 s); the workers block both, so the kernel hands them to the main thread at once."""
    import signal

    from rag_experiments.core.parallel import as_they_complete, thread_map

    def blocked(_):
        return signal.pthread_sigmask(signal.SIG_BLOCK, [])

    for masks in (thread_map(blocked, [1, 2], 2), [m for _, m in as_they_complete(blocked, [1, 2], 2)]):
        assert all({signal.SIGINT, signal.SIGTERM} <= set(m) for m in masks)
