"""The thread pool the model-calling stages share: ``concurrency`` requests in flight, and on
Ctrl-C/SIGTERM no wait for the queued ones (a killed run loses only what was in flight).

Once a map is interrupted (its own stop flag, set by the consumer's KeyboardInterrupt), no worker
of that map starts another call: an item a worker had already taken raises :class:`Aborted`
instead of sending a request after the signal. The calls still in flight are abandoned, not
awaited: ``run.sweep.cli`` ends the process without joining the worker threads once the run is
marked KILLED. The flag is per map, so a library caller that catches the interrupt and goes on
(a notebook, a test) is not left with every later call refused.

The consumer waits in slices of :data:`POLL_S`, never in one blocking wait: the kernel may hand a
process-directed SIGINT/SIGTERM to any thread, and a main thread blocked on a lock is only woken
(and runs Python's handler) when the signal lands on it. Polling bounds the delay to a slice
whichever thread took the signal (seen as a test that waited out every timeout once, under load).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from rag_experiments.core.progress import Progress

T = TypeVar("T")
R = TypeVar("R")

#: Longest uninterrupted wait of a consumer for its workers, seconds (a pending signal is handled
#: at the end of a slice at the latest).
POLL_S = 0.2

_ON_INTERRUPT: list[Callable[[], None]] = []


def on_interrupt(fn: Callable[[], None]) -> None:
    """Run ``fn`` whenever a consumer of this module is interrupted (Ctrl-C/SIGTERM): the endpoint
    client registers its ``abort_all`` here, so no request leaves after the signal and the ones in
    flight fail now, whichever stage's pool was waiting."""
    if fn not in _ON_INTERRUPT:
        _ON_INTERRUPT.append(fn)


def _interrupted() -> None:
    for fn in _ON_INTERRUPT:
        fn()


@contextlib.contextmanager
def _signal_seen(stop: threading.Event) -> Iterator[threading.Event]:
    """A flag set by SIGINT/SIGTERM while the block runs (main thread only; the previous handler
    still runs). Python drops a ``KeyboardInterrupt`` its handler raised inside a finalizer run by
    the garbage collector ("Exception ignored in …"); the flag is not dropped, so the consumer's
    poll loop raises it (seen as runs that waited out every timeout in a large test process).
    The handler also sets the map's ``stop`` flag at once: a worker taking its next item between
    the signal and the consumer's next poll starts no call (requests did, up to 17 ms after it)."""
    seen = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old = signal.getsignal(sig)
            if callable(old):
                def note(signum, frame, old=old):
                    stop.set()
                    seen.set()
                    return old(signum, frame)

                previous[sig] = old
                signal.signal(sig, note)
    try:
        yield seen
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def signal_seen() -> contextlib.AbstractContextManager[threading.Event]:
    """A flag set by SIGINT/SIGTERM while the block runs (main thread only), for callers that
    contain the user's code (``stages.app.contained``: only our own process's signal is re-raised)."""
    return _signal_seen(threading.Event())


def _workers_ignore_signals() -> None:
    """A worker thread's initializer: SIGINT and SIGTERM blocked in it, so the kernel delivers a
    process-directed signal to the main thread, whose wait is then interrupted at once (a signal
    landing on a worker waited for the consumer's next poll, and calls kept starting meanwhile)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def _pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, initializer=_workers_ignore_signals)


def _check(seen: threading.Event) -> None:
    if seen.is_set():
        raise KeyboardInterrupt("signal received (its handler's exception was lost in a finalizer)")


class Aborted(Exception):
    """A call not started because the run was interrupted."""


def _guarded(fn: Callable[[T], R], stop: threading.Event) -> Callable[[T], R]:
    def call(x: T) -> R:
        if stop.is_set():
            raise Aborted("interrupted: call not started")
        return fn(x)

    return call


def thread_map(
    fn: Callable[[T], R], items: Sequence[T], workers: int, on_abort: Callable[[], None] | None = None
) -> list[R]:
    """``[fn(x) for x in items]``, ``workers`` at a time, order kept; in this thread when one
    worker or one item suffices. ``on_abort`` runs before re-raising (e.g. closing a client)."""
    stop = threading.Event()
    try:
        if workers <= 1 or len(items) <= 1:
            return [fn(x) for x in items]
        pool = _pool(min(workers, len(items)))
        try:
            futures = [pool.submit(_guarded(fn, stop), x) for x in items]
            out = []
            with _signal_seen(stop) as seen:
                for fut in futures:  # in order, as pool.map: the first failure in order is raised
                    while not fut.done():
                        wait([fut], timeout=POLL_S)
                        _check(seen)
                    out.append(fut.result())
            return out
        finally:  # on an exception the queued calls are cancelled, in-flight ones not awaited
            pool.shutdown(wait=False, cancel_futures=True)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            stop.set()
            _interrupted()
        if on_abort is not None:
            on_abort()
        raise


def as_they_complete(fn: Callable[[T], R], items: Sequence[T], workers: int) -> Iterator[tuple[int, R]]:
    """``(index, fn(items[index]))`` in completion order, ``workers`` at a time, so a caller can
    commit each result as it arrives."""
    pool = _pool(max(1, workers))
    stop = threading.Event()
    guarded = _guarded(fn, stop)
    try:
        futures: dict[Future, int] = {pool.submit(guarded, x): i for i, x in enumerate(items)}
        pending = set(futures)
        with _signal_seen(stop) as seen:
            while pending:
                done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
                _check(seen)
                for fut in sorted(done, key=futures.__getitem__):
                    yield futures[fut], fut.result()
    except KeyboardInterrupt:
        stop.set()
        _interrupted()
        raise
    finally:  # on Ctrl-C / SIGTERM do not wait for the queued requests
        pool.shutdown(wait=False, cancel_futures=True)


def ask_missing(
    cache,
    stage: str,
    keys: Sequence[str],
    ask: Callable[[int], R],
    store: Callable[[R], Any],
    workers: int,
    bar: tuple[str, str],
    progress: bool = True,
) -> tuple[dict[str, Any], dict[str, R]]:
    """The model-calling stages' cache shape (a ``core.cache.StageCache``), written once: each distinct key of ``keys`` missing
    from ``stage`` is asked once (``ask(i)``, ``i`` a position of that key), ``workers`` in flight,
    with a progress bar ``bar = (label, unit)``. Each result is committed as it completes:
    ``store(result)`` is the JSON value to cache, or None for a failure (not cached, so a re-run
    asks again). A killed run loses only the calls in flight.

    Returns ``(found, fresh)``: key → cached JSON value, key → result of this run."""
    found = cache.get_json_many(stage, list(keys))
    todo = list({k: i for i, k in enumerate(keys) if k not in found}.items())
    fresh: dict[str, R] = {}
    with Progress(bar[0], len(todo), enabled=progress and bool(todo), unit=bar[1]) as b:
        for j, r in as_they_complete(ask, [i for _, i in todo], max(1, int(workers or 1))):
            k = todo[j][0]
            fresh[k] = r
            if (value := store(r)) is not None:
                cache.put_json_many(stage, {k: value})
            b.update()
    return found, fresh
