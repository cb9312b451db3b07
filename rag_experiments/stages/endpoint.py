"""The one client every remote call goes through (docs/reliability.md, "One endpoint client").

Chat completions (generator, LLM judge, query transforms, LLM reranker), the rerank API and the
llama.cpp tokenizer all POST JSON through :meth:`Endpoint.post`, so each duty is written once:

- **deadline**: ``timeout_s`` bounds a whole attempt, headers and body (a body trickling one byte
  every second is given up at the deadline, not when the bytes stop);
- **retries**: up to ``max_retries`` after the first attempt on HTTP 5xx/408/409/429, timeouts,
  connection errors and malformed replies, never on other 4xx; the wait before attempt a is
  ``backoff_s * 2**(a-1) * U(0.5, 1.5)``, or the ``Retry-After`` seconds a 429/503 asks for when
  longer; a ``Retry-After`` beyond ``timeout_s`` fails at once (waiting less only earns another 429);
- **size cap**: a reply over ``max_reply_bytes`` is refused, not stored;
- **secrets**: the key is read from the variable ``api_key_env`` names, sent only as a header and
  redacted from every error (``core.redaction``);
- **signals**: :func:`abort_all` (called by ``core.parallel`` on Ctrl-C/SIGTERM) closes every
  client, so in-flight requests fail now, and refuses every attempt not yet sent;
- **limits per endpoint** (base URL + model), shared by every step and every config of a multirun
  in one process (:class:`_Shared`): ``max_concurrency`` (the largest any client declared), ``rpm``
  and ``tpm`` (the smallest declared); requests are paced (one every ``60·1.02/rpm`` s: 2 % headroom, and
  ``60*n/tpm`` s after a reply of n tokens), never bursted past a limit;
- **adaptive concurrency**: a 429 halves the requests allowed in flight (once per round: the 429s
  of requests sent before the cut do not cut again), and each run of as many successes as are
  allowed adds one back, up to ``max_concurrency``; a 429 is retried after its ``Retry-After``
  without spending ``max_retries`` (the server said "later", not "no") for up to
  ``rate_limited_s`` seconds per call;
- **usage per endpoint**: calls, attempts, retries, 429s, seconds waited and throttled, tokens,
  cost and the achieved requests per minute (:func:`usage`), logged on the run;
- **budget**: a call that would pass ``budget.max_calls`` / ``budget.max_usd`` is never sent
  (``stages.call_budget``; docs/endpoints.md);
- **dry run**: in ``stages.dry_calls``' dry mode nothing is sent: the request is recorded and the
  parser gets a placeholder reply of its path's shape (``dry``: the caller's own placeholder).

A call never raises for a remote failure: :class:`Reply` carries the parsed body or the error.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from rag_experiments.core.parallel import on_interrupt
from rag_experiments.core.redaction import error_text, redact, register_secret_env
from rag_experiments.stages import call_budget, dry_calls
from rag_experiments.stages.endpoint_settings import EndpointSettings

#: The largest reply body read (bytes): a chat answer is capped far below this; a larger body is a
#: misbehaving endpoint, refused rather than held in memory and stored.
MAX_REPLY_BYTES = 8 << 20
_POLL_S = 0.2  # the longest wait for a concurrency slot before the abort flag is looked at again


class Retryable(Exception):
    """A failure worth retrying: 5xx, 429, timeout, connection error, malformed or empty reply."""


class GiveUp(Exception):
    """A failure that retrying cannot fix (a Retry-After beyond the deadline, an oversized reply,
    a reply the caller's parser rejects for good)."""


class HTTPStatus(Exception):
    """A reply with status >= 400; ``retry_after`` is the seconds it asked for (or None)."""

    def __init__(self, status: int, text: str, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}: {redact(text)[:200]}")
        self.status, self.retry_after = status, retry_after

    @property
    def retryable(self) -> bool:
        return self.status >= 500 or self.status in (408, 409, 429)


def retry_after_s(value: str | None) -> float | None:
    """The seconds a ``Retry-After: <seconds>`` header asks for, else None (the HTTP-date form is
    not read: the backoff applies)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


@dataclass
class Reply:
    """One call's outcome: ``data`` (the parser's result) or ``error`` (redacted), never both."""

    data: Any = None
    error: str | None = None
    attempts: int = 0
    seconds: float = 0.0
    status: int | None = None
    gave_up: bool = False  # failed without retrying (a 4xx, a Retry-After beyond the deadline, …)


@dataclass
class Usage:
    """What one endpoint was asked and how it answered, summed over every step that called it."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    http_429: int = 0
    failed: int = 0
    budget_refused: int = 0  # calls not sent: the budget would be passed (stages.call_budget)
    waited_s: float = 0.0  # backoff and Retry-After sleeps
    seconds: float = 0.0  # wall time of the calls, waits included
    throttled_s: float = 0.0  # thread-seconds waiting for a slot (concurrency, rpm, tpm, 429 cuts)
    tokens: float = 0.0  # tokens the replies reported (:meth:`Endpoint.record_tokens`)
    usd: float = 0.0  # their cost at the caller's prices
    first_sent: float = 0.0  # monotonic time of the first and last attempt sent (achieved rpm)
    last_sent: float = 0.0


@dataclass
class _Shared:
    """Per endpoint key: the limits, the adaptive cap and the usage, shared by every client of it.

    ``limit``: the largest ``max_concurrency`` declared (0: none); ``cap``: the requests allowed
    in flight now (0: ``limit``), halved on a 429 and grown back one per ``cap`` successes;
    ``rpm``/``tpm``: 0 none; ``next_rpm``/``next_tpm``: the earliest monotonic time the pacing
    allows the next attempt."""

    limit: int
    cap: int = 0
    rpm: float = 0.0
    tpm: float = 0.0
    in_flight: int = 0
    next_rpm: float = 0.0
    next_tpm: float = 0.0
    ok_streak: int = 0
    cut_at: float = 0.0  # when the cap was last halved
    ceiling: int = 0  # the allowed count a 429 last came at: probed again only slowly
    usage: Usage = field(default_factory=Usage)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def allowed(self) -> int:
        """Requests allowed in flight now (0: no limit)."""
        return min(x for x in (self.cap, self.limit) if x) if (self.cap or self.limit) else 0

    def on_429(self, sent_at: float) -> None:
        """Halve the cap, once per round (a 429 of a request sent before the last cut is that
        round's); caller holds ``cond``."""
        if sent_at < self.cut_at:
            return
        self.ceiling = self.allowed() or self.in_flight + 1
        self.cap = max(1, self.ceiling // 2)
        self.cut_at, self.ok_streak = time.monotonic(), 0

    def on_success(self) -> None:
        """One more allowed after ``cap`` successes in a row, up to ``limit``; reaching the count a
        429 last came at takes ``8 * ceiling`` (probing the server's limit rarely, not every round
        trip); caller holds ``cond``."""
        if not self.cap:
            return
        self.ok_streak += 1
        if self.ok_streak >= (self.cap if self.cap + 1 < self.ceiling else 8 * self.ceiling):
            self.cap, self.ok_streak = self.cap + 1, 0
            if self.limit and self.cap >= self.limit:
                self.cap = 0  # back at the declared limit
        self.cond.notify_all()


_SHARED: dict[str, _Shared] = {}
_RPM_HEADROOM = 1.02  # requests are paced at rpm / 1.02
_LOCK = threading.Lock()
_EPOCH = [0]  # abort_all's count: an endpoint built before the latest abort refuses every call
_WAKE = threading.Condition()  # wakes backoff sleeps at an abort
_CLIENTS: weakref.WeakSet = weakref.WeakSet()  # the open httpx clients, closed by abort_all


def reply_usage(raw: bytes) -> dict[str, float]:
    """The numeric ``usage`` fields of a JSON reply (OpenAI's chat, embeddings), else {}."""
    if b'"usage"' not in raw:
        return {}
    try:
        usage = json.loads(raw).get("usage") or {}
        return {k: float(v) for k, v in usage.items() if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0}
    except (ValueError, AttributeError):
        return {}


def endpoint_key(base_url: str, model: str = "") -> str:
    """The endpoint's name in limits and usage records: ``base_url`` (+ ``#model``)."""
    return f"{base_url}#{model}" if model else base_url


def abort_all() -> None:
    """Ctrl-C/SIGTERM: every endpoint built so far refuses every attempt not yet sent, and every
    client is closed, so the requests in flight fail now instead of at their deadline. Endpoints
    built afterwards (the next run's stages) work: a caller that catches the interrupt and goes on
    is not left with every later call refused."""
    with _WAKE:
        _EPOCH[0] += 1
        _WAKE.notify_all()
    with _LOCK:
        clients = list(_CLIENTS)
    for c in clients:
        try:
            c.close()
        except Exception:  # noqa: BLE001 - a client closing under a request may complain; it is closed
            pass


on_interrupt(abort_all)


def usage() -> dict[str, dict[str, float]]:
    """Usage of every endpoint called in this process so far, by :func:`endpoint_key`."""
    with _LOCK:
        return {k: asdict(s.usage) for k, s in _SHARED.items()}


def limits() -> dict[str, tuple[int, float, float]]:
    """Per endpoint key: the ``(max_concurrency, rpm, tpm)`` declared so far (0: none)."""
    with _LOCK:
        return {k: (s.limit, s.rpm, s.tpm) for k, s in _SHARED.items()}


def usage_since(before: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The usage added since the snapshot ``before`` (endpoints not called since are left out),
    with ``rpm``: the achieved attempts per minute, ``60 * attempts / (last sent - first sent)``
    over the attempts sent since (0 with fewer than two)."""
    out = {}
    for key, now in usage().items():
        was = before.get(key, {})
        stamps = ("first_sent", "last_sent")
        delta = {f: round(v - was.get(f, 0), 6 if f == "usd" else 3) for f, v in now.items() if f not in stamps}
        if delta["calls"] or delta["budget_refused"]:
            start = was.get("last_sent") or now["first_sent"]  # the first attempt sent since is after it
            span = now["last_sent"] - start
            delta["rpm"] = round(60 * (delta["attempts"] - (1 if not was.get("last_sent") else 0)) / span, 2) if span > 0 else 0.0
            out[key] = delta
    return out


class Endpoint:
    """A JSON-over-HTTP endpoint: ``post(path, body)`` with the duties of the module docstring.

    ``settings``: the keys of :class:`~rag_experiments.stages.endpoint_settings.EndpointSettings`
    it reads (``api_key_env``, ``timeout_s``, ``max_retries``, ``backoff_s``, ``max_concurrency``,
    ``rpm``, ``tpm``); ``max_concurrency`` None: no limit of its own (the step's thread count
    bounds it); ``rpm``, ``tpm`` None: none of their own. ``rate_limited_s``: how long one call
    keeps retrying 429s; ``what``: the config key named when the deadline is hit.
    """

    def __init__(
        self,
        base_url: str,
        model: str = "",
        *,
        what: str = "timeout_s",
        max_reply_bytes: int = MAX_REPLY_BYTES,
        rate_limited_s: float = 300.0,
        **settings: Any,
    ) -> None:
        s = self.settings = EndpointSettings(base_url=base_url, model=model, **settings)
        register_secret_env(s.api_key_env)  # its value is redacted from every error
        self.base_url, self.model = s.base_url, s.model
        self.key = endpoint_key(self.base_url, self.model)
        self.timeout_s, self.backoff_s, self.max_retries = s.timeout_s, s.backoff_s, s.max_retries
        self.max_reply_bytes = int(max_reply_bytes)
        self.rate_limited_s = float(rate_limited_s)
        self._timeout_key = what
        key = os.environ.get(s.api_key_env) if s.api_key_env else None
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._epoch = _EPOCH[0]
        self._client = self._new_client()
        with _LOCK:
            sh = _SHARED.setdefault(self.key, _Shared(limit=0))
            if s.max_concurrency:
                sh.limit = max(sh.limit, s.max_concurrency)
            if s.rpm:
                sh.rpm = min(sh.rpm or s.rpm, s.rpm)
            if s.tpm:
                sh.tpm = min(sh.tpm or s.tpm, s.tpm)
        self._shared = sh

    @classmethod
    def of(cls, settings: EndpointSettings, what: str, in_flight: bool = True) -> Endpoint:
        """The client of a user's settings; ``in_flight``: its ``concurrency`` is the endpoint's
        ``max_concurrency`` when that is not set (a step that sends one request at a time: False)."""
        limit = settings.max_concurrency or (settings.concurrency if in_flight else None)
        return cls(what=what, **{**settings.keywords(), "max_concurrency": limit})

    def record_tokens(self, tokens: float, usd: float = 0.0) -> None:
        """A reply's token count (and cost): summed in the usage, and paced against ``tpm``.
        :meth:`post` records every reply's ``usage.total_tokens``; callers add the cost."""
        sh = self._shared
        with _LOCK:
            sh.usage.tokens += tokens
            sh.usage.usd += usd
        with sh.cond:
            if sh.tpm and tokens:
                sh.next_tpm = max(sh.next_tpm, time.monotonic()) + 60.0 * tokens / sh.tpm

    def aborted(self) -> bool:
        """True once :func:`abort_all` ran after this endpoint was built."""
        return self._epoch != _EPOCH[0]

    # -- the call ---------------------------------------------------------------------------------
    def post(
        self, path: str, body: dict, parse: Callable[[bytes], Any] = json.loads,
        dry: Callable[[dict], bytes] | None = None,
    ) -> Reply:  # fmt: skip
        """POST ``body`` to ``base_url + path``; ``parse`` turns the body into ``Reply.data`` and
        may raise :class:`Retryable` (or ValueError/KeyError/TypeError: malformed, retried) or
        :class:`GiveUp`. Never raises for a remote failure. ``dry(body)``: the placeholder reply
        in dry mode (default ``dry_calls.placeholder``)."""
        if dry_calls.active():
            return self._dry(path, body, parse, dry)
        t0, sh = time.perf_counter(), self._shared
        u = sh.usage
        last, retry_after, status = "no attempt made", None, None
        attempt = errors = throttles = 0  # attempts made; failures that spend max_retries; 429s
        bound, refused = call_budget.reserve(self.key, body)
        if refused:  # never sent: the budget would be passed (stages.call_budget)
            with _LOCK:
                u.budget_refused += 1
            return Reply(None, refused, 0, 0.0, None, gave_up=True)
        usage_reply: dict = {}
        with _LOCK:
            u.calls += 1
        try:
            while True:
                if attempt:
                    # the backoff doubles per failure and per 429 in a row (capped at 64x: a 429 without
                    # Retry-After is not answered by hammering)
                    delay = self.backoff_s * (2 ** min(max(errors, throttles, 1) - 1, 6)) * (0.5 + random.random())
                    wait = max(delay, retry_after or 0.0)
                    with _WAKE:
                        _WAKE.wait_for(self.aborted, timeout=wait)
                    with _LOCK:
                        u.retries += 1
                        u.waited_s += wait
                if self.aborted():
                    return self._fail("aborted (interrupted)", attempt, t0, status, gave_up=True)
                sent_at = time.monotonic()
                try:
                    with self._slot():
                        sent_at = time.monotonic()
                        with _LOCK:
                            u.attempts += 1
                            u.first_sent = u.first_sent or sent_at
                            u.last_sent = sent_at
                        attempt += 1
                        raw, status = self._attempt(path, body)
                    data = parse(raw)
                    with sh.cond:
                        sh.on_success()
                    usage_reply = reply_usage(raw)
                    tokens = usage_reply.get("total_tokens", usage_reply.get("prompt_tokens", 0) + usage_reply.get("completion_tokens", 0))
                    self.record_tokens(tokens)
                    return Reply(data, None, attempt, time.perf_counter() - t0, status)
                except Exception as exc:  # noqa: BLE001 - classified below; never escapes
                    last, retry_after, retry = self._classify(exc)
                    throttled = isinstance(exc, HTTPStatus) and exc.status == 429
                    if isinstance(exc, HTTPStatus):
                        status = exc.status
                    if throttled:
                        with _LOCK:
                            u.http_429 += 1
                        with sh.cond:
                            sh.on_429(sent_at)
                    if not retry:
                        return self._fail(last, attempt, t0, status, gave_up=True)
                    if throttled and time.perf_counter() - t0 < self.rate_limited_s:
                        throttles += 1
                        continue  # "later", not "no": retried without spending max_retries
                    errors += 1
                    if errors > self.max_retries:
                        what = f"still rate-limited after {self.rate_limited_s:g} s" if throttled else f"failed after {attempt} attempts"
                        return self._fail(f"{what}: {last}", attempt, t0, status)
        finally:
            usd = call_budget.settle(self.key, bound, usage_reply)
            with _LOCK:
                u.seconds += time.perf_counter() - t0
                u.usd += usd

    def _dry(self, path: str, body: dict, parse: Callable[[bytes], Any], dry: Callable[[dict], bytes] | None) -> Reply:
        """Dry mode: the request recorded, nothing sent, the placeholder parsed as a reply would be."""
        dry_calls.record(self.key, path, body)
        try:
            return Reply(parse(dry(body) if dry is not None else dry_calls.placeholder(path, body)), None, 1, 0.0, 200)
        except Exception as exc:  # noqa: BLE001 - a placeholder the caller cannot read fails like a reply
            return Reply(None, f"dry run: placeholder reply not readable: {error_text(exc, 200)}", 1, 0.0, 200, gave_up=True)

    def _fail(self, error: str, attempts: int, t0: float, status: int | None, gave_up: bool = False) -> Reply:
        with _LOCK:
            self._shared.usage.failed += 1
        return Reply(None, redact(error), attempts, time.perf_counter() - t0, status, gave_up)

    def _classify(self, exc: Exception) -> tuple[str, float | None, bool]:
        """(error text, Retry-After seconds, retry?) of one failed attempt."""
        import httpx

        if isinstance(exc, HTTPStatus):
            wait, text = exc.retry_after, str(exc)
            if wait is not None and wait > self.timeout_s:
                return f"{text} (Retry-After {wait:g} s is beyond {self._timeout_key}={self.timeout_s:g} s)", wait, False
            return text, wait, exc.retryable
        if isinstance(exc, GiveUp):
            return error_text(exc, 300), None, False
        if self.aborted():
            return "aborted (interrupted)", None, False
        # timeouts, refused connections, resets, malformed bodies: transient
        retry = isinstance(exc, Retryable | httpx.HTTPError | ValueError | KeyError | TypeError | AttributeError)
        return error_text(exc, 300), None, retry

    def _attempt(self, path: str, body: dict) -> tuple[bytes, int]:
        """One HTTP attempt within the deadline: (body bytes, status), or raises."""
        deadline = time.monotonic() + self.timeout_s
        buf = bytearray()
        with self._client.stream("POST", self.base_url + path, json=body, headers=self._headers) as r:
            for chunk in r.iter_bytes():
                buf += chunk
                if len(buf) > self.max_reply_bytes:
                    raise GiveUp(f"reply larger than {self.max_reply_bytes} bytes: refused")
                if time.monotonic() > deadline:
                    raise Retryable(
                        f"no complete reply within {self._timeout_key}={self.timeout_s:g} s "
                        f"(body still arriving after {len(buf)} bytes)"
                    )
            if r.status_code >= 400:
                text = bytes(buf[:2000]).decode("utf-8", "replace")
                raise HTTPStatus(r.status_code, text, retry_after_s(r.headers.get("retry-after")))
            return bytes(buf), r.status_code

    # -- the shared concurrency limit -------------------------------------------------------------
    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        """Hold one of the endpoint's allowed slots for the attempt, once the pacing allows it."""
        sh = self._shared
        with sh.cond:
            t_wait = time.monotonic()
            while True:
                if self.aborted():
                    raise GiveUp("aborted (interrupted)")
                now = time.monotonic()
                allowed = sh.allowed()
                wait = _POLL_S if allowed and sh.in_flight >= allowed else max(sh.next_rpm, sh.next_tpm) - now
                if wait <= 0:
                    break
                sh.cond.wait(min(wait, _POLL_S))
            sh.in_flight += 1
            if sh.rpm:
                # 2 % headroom: paced exactly at the limit, jitter between here and the server
                # let 121 of rpm=120 land in one minute (a 429 in the peer benchmark)
                sh.next_rpm = max(sh.next_rpm, now) + 60.0 / sh.rpm * _RPM_HEADROOM
            with _LOCK:
                sh.usage.throttled_s += now - t_wait
        try:
            yield
        finally:
            with sh.cond:
                sh.in_flight -= 1
                sh.cond.notify()

    def _new_client(self):
        import httpx

        client = httpx.Client(timeout=self.timeout_s)
        with _LOCK:
            _CLIENTS.add(client)
        return client

    def close(self) -> None:
        with _LOCK:
            _CLIENTS.discard(self._client)
        self._client.close()
