"""Ctrl-C must not be lost when Python's handler runs inside a finalizer (issue 36, item 11).

Python raises ``KeyboardInterrupt`` in whatever Python code the main thread runs next; when that
is a finalizer (``__del__``, a weakref callback) run by the garbage collector, the exception is
printed as "Exception ignored in …" and dropped. ``core.parallel.thread_map``'s consumer then goes
on polling and the run waits out every request timeout: "DID NOT RAISE KeyboardInterrupt (the
requests timed out instead)", as ``test_healing.py::test_interrupt_aborts_in_flight_requests_promptly``
failed twice in a full suite at load 6-12 (a long-lived worker's large heap: more and longer
collections on the main thread). Here the collection is injected at the consumer's first poll, so
the signal lands in a finalizer every time.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from rag_experiments.core import parallel
from rag_experiments.stages.generation import OpenAICompatibleGenerator


class _SlowFinalizer:
    """Garbage whose finalizer runs bytecode until the signal was sent, and a little beyond."""

    def __init__(self, sent: list[float]) -> None:
        self.sent = sent

    def __del__(self) -> None:
        t0 = time.perf_counter()
        while (not self.sent or time.perf_counter() - self.sent[0] < 0.3) and time.perf_counter() - t0 < 10:
            pass  # bytecode: Python's pending-signal check runs here, on the main thread


def test_a_signal_handled_inside_a_finalizer_still_interrupts_generation(monkeypatch):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: [held.append(srv.accept()[0]) for _ in range(16)], daemon=True).start()
    gen = OpenAICompatibleGenerator(
        base_url=f"http://127.0.0.1:{srv.getsockname()[1]}/v1", model="m", api_key_env="X",
        timeout_s=4, max_retries=0, concurrency=4,
    )  # fmt: skip
    sent: list[float] = []
    real_wait = parallel.wait
    collected: list[bool] = []

    def wait_after_a_collection(*args, **kwargs):  # fault injection: a GC pass at the first poll
        if not collected and threading.current_thread() is threading.main_thread():
            collected.append(True)
            _SlowFinalizer(sent)  # dropped at once: its __del__ runs here, on the main thread
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(parallel, "wait", wait_after_a_collection)

    def ctrl_c():
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Timer(0.5, ctrl_c).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            gen.generate([[{"role": "user", "content": "hi"}]] * 8)
        assert collected and time.perf_counter() - sent[0] < 3.0
    finally:
        srv.close()
