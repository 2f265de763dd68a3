"""How certify keeps talking to an endpoint that fails quietly: deadlines, hedges, a breaker.

Real inference APIs do not only fail loudly. A connection that is accepted and never answered
costs a fixed read timeout every time; a sequential attack waits for it with all its samples.
This module holds the parts of :class:`certify.models.http.HttpModel`'s transport that decide
*when to give up on an attempt* and *when to ask twice*:

- :class:`Latency`: a running distribution of answered requests' latency per image. A
  request's read deadline is ``multiplier ×`` its high percentile for the request's size,
  between a floor and ``--timeout``; each timeout of the same request doubles it, so a hang
  costs seconds while a slow but valid request still gets its answer.
- hedging (Dean & Barroso, "The Tail at Scale", 2013): an attempt that has not answered by the
  observed p95 (never before ``HEDGE_FLOOR``) gets a duplicate; the first valid answer wins
  and the other attempt's socket is shut down (:class:`Attempt`). Hedges are capped at
  ``HEDGE_SHARE`` of requests and never sent for a request that got 429 or 503, nor for any
  request while such answers are ``OVERLOAD_SHARE`` of the recent ones (that would add load
  to an overloaded server).
- :class:`Breaker`: a burst of consecutive failures beyond the retry policy pauses every
  request, probes the endpoint's health and resumes, or ends the run (exit 3, records kept
  for ``--resume``).

Nothing here changes what the model is asked: a hedge repeats the same images, and the model
query count (budgets, metrics) is the runner's, not the transport's.
"""

from __future__ import annotations

import bisect
import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import urllib3.connection
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from certify.errors import ModelError

#: Answered requests kept in the latency window.
WINDOW = 512
#: Answered inference requests before deadlines and hedges use the distribution.
WARMUP = 8
#: The deadline of an attempt during warm-up (at most ``--timeout``; doubled per timeout of the
#: same request, so a slow first answer, e.g. a cold start, still arrives).
WARMUP_DEADLINE = 5.0
#: Hedges may be at most this share of the requests sent.
HEDGE_SHARE = 0.05
#: While at least this share of the last ``OVERLOAD_WINDOW`` answers are 429 or 503, the
#: server is overloaded and nothing is hedged (an occasional 429 stops its own request's hedges
#: only).
OVERLOAD_SHARE = 0.1
OVERLOAD_WINDOW = 100
#: No hedge before this many seconds (or half the attempt's deadline, if shorter): on a fast
#: endpoint p95 is milliseconds, and a scheduling hiccup is not a straggler worth a duplicate.
HEDGE_FLOOR = 0.1
#: Endpoint-wide consecutive failed attempts that open the breaker even before one request
#: has spent its retries.
BURST = 12
#: Times one request may pass through an open breaker and resume before the run gives up.
BREAKER_CYCLES = 2


class Latency:
    """Latency per image of answered inference requests, with deadlines and hedge delays."""

    def __init__(self, timeout: float, floor: float, multiplier: float) -> None:
        self.timeout, self.floor, self.multiplier = timeout, floor, multiplier
        self._window: deque[float] = deque(maxlen=WINDOW)
        self._sorted: list[float] = []
        self._lock = threading.Lock()
        self.chosen: list[float] = []  # every deadline an attempt was given after warm-up
        self.expired: list[float] = []  # deadlines that ran out (first 100)
        self.warmup_attempts = 0

    def observe(self, seconds: float, images: int) -> None:
        """Add one answered request of ``images`` images that took ``seconds``."""
        u = seconds / max(1, images)
        with self._lock:
            if len(self._window) == WINDOW:
                old = self._window.popleft()
                del self._sorted[bisect.bisect_left(self._sorted, old)]
            self._window.append(u)
            bisect.insort(self._sorted, u)

    def quantile(self, q: float, images: int) -> float | None:
        """The ``q`` quantile of the latency of a request of ``images`` images, or ``None``
        during warm-up."""
        with self._lock:
            n = len(self._sorted)
            if n < WARMUP:
                return None
            return self._sorted[min(n - 1, int(q * n))] * max(1, images)

    def hedge_delay(self, images: int, deadline: float) -> float | None:
        """Seconds after which an attempt of ``images`` images gets a hedge: the observed
        p95, at least :data:`HEDGE_FLOOR` (or half of ``deadline``); ``None`` in warm-up."""
        p95 = self.quantile(0.95, images)
        return None if p95 is None else max(p95, min(HEDGE_FLOOR, deadline / 2))

    def deadline(self, images: int, timeouts: int) -> float:
        """The read deadline of an attempt at a request that already timed out ``timeouts``
        times: ``multiplier × p99`` for its size, at least ``floor``, doubled per timeout,
        at most ``--timeout``."""
        p99 = self.quantile(0.99, images)
        if p99 is None:
            with self._lock:
                self.warmup_attempts += 1
            return min(self.timeout, WARMUP_DEADLINE * 2.0 ** timeouts)
        d = min(self.timeout, max(self.floor, self.multiplier * p99) * 2.0 ** timeouts)
        with self._lock:
            self.chosen.append(d)
        return d

    def record_expired(self, deadline: float) -> None:
        """Note a deadline that ran out."""
        with self._lock:
            if len(self.expired) < 100:
                self.expired.append(round(deadline, 3))

    def describe(self) -> dict[str, Any]:
        """What the card states about deadlines (seconds)."""
        with self._lock:
            chosen = sorted(self.chosen)
            per_image = list(self._sorted)

        def q(values: list[float], p: float) -> float | None:
            return round(values[min(len(values) - 1, int(p * len(values)))], 4) if values \
                else None

        return {
            "rule": f"{self.multiplier:g} × p99 of observed latency per image × images, at "
                    f"least {self.floor:g} s, doubled per timeout of the same request, at most "
                    f"--timeout {self.timeout:g} s; until {WARMUP} answers "
                    f"{min(self.timeout, WARMUP_DEADLINE):g} s, doubled per timeout",
            "warmup_attempts": self.warmup_attempts,
            "chosen_s": {"count": len(chosen), "min": q(chosen, 0.0),
                         "median": q(chosen, 0.5), "max": q(chosen, 1.0)},
            "expired_s": list(self.expired),
            "latency_per_image_ms": {k: None if v is None else round(v * 1000, 4) for k, v in
                                     (("p50", q(per_image, 0.5)), ("p95", q(per_image, 0.95)),
                                      ("p99", q(per_image, 0.99)))},
        }


# -- sockets that another thread can shut down ---------------------------------------------
_tls = threading.local()


def _box() -> dict[str, Any]:
    """This thread's box: the socket of its current connection (set on connect)."""
    box = getattr(_tls, "box", None)
    if box is None:
        box = _tls.box = {}
    return box


class _TrackedHTTPConnection(urllib3.connection.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _box()["sock"] = self.sock


class _TrackedHTTPSConnection(urllib3.connection.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _box()["sock"] = self.sock


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _TrackedHTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _TrackedHTTPSConnection


class TrackedAdapter(HTTPAdapter):
    """A requests adapter without retries whose connections register their socket, so that a
    losing hedge (or an abandoned attempt) can be shut down from another thread."""

    def __init__(self) -> None:
        super().__init__(max_retries=0, pool_connections=1, pool_maxsize=1)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}


@dataclass
class Attempt:
    """One HTTP attempt running on a transport thread; :meth:`abort` shuts its socket."""

    hedge: bool
    started: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    outcome: Any = None
    aborted: bool = False
    _box: dict[str, Any] | None = None
    _io: bool = False
    _cancel: Callable[[], Any] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def begin_io(self) -> bool:
        """Called on the attempt's thread before sending; False if already aborted."""
        with self._lock:
            if self.aborted:
                return False
            self._box, self._io = _box(), True
            return True

    def end_io(self) -> None:
        """Called on the attempt's thread once the whole response is read."""
        with self._lock:
            self._io = False

    def abort(self) -> None:
        """Stop this attempt: shut its socket down if it is still waiting on it (or cancel
        its call, for a transport that gave one: :meth:`on_abort`)."""
        with self._lock:
            self.aborted = True
            sock = self._box.get("sock") if self._io and self._box is not None else None
            cancel = self._cancel
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if cancel is not None:
            cancel()

    def on_abort(self, cancel: Callable[[], Any]) -> None:
        """Call ``cancel`` when the attempt is aborted (at once if it already was): how a
        transport without a socket of its own (a gRPC call) is stopped."""
        with self._lock:
            self._cancel = cancel
            now = self.aborted
        if now:
            cancel()

    def finish(self, outcome: Any) -> None:
        """Record the attempt's outcome (on its thread)."""
        self.outcome = outcome
        self.done.set()


class Breaker:
    """Pauses all requests after a burst of failures, probes health, resumes or gives up.

    ``probe()`` returns ``None`` when the endpoint is healthy, else a short reason. While one
    thread probes, the others wait in :meth:`wait`. After ``wait_s`` of failed probes the
    breaker stays failed: every request raises :class:`ModelError` (exit 3).
    """

    def __init__(self, probe: Callable[[], str | None], wait_s: float, display: str) -> None:
        self._probe, self.wait_s, self.display = probe, wait_s, display
        self._cond = threading.Condition()
        self._open = False
        self._failed: str | None = None
        self.consecutive = 0
        self.trips = 0
        self.probes = 0
        self.paused_s = 0.0

    def success(self) -> None:
        """An attempt was answered."""
        with self._cond:
            self.consecutive = 0

    def failure(self) -> bool:
        """An attempt failed; True when this makes a burst that should open the breaker."""
        with self._cond:
            self.consecutive += 1
            return self.consecutive >= BURST

    def wait(self) -> None:
        """Block while the breaker is open; raise once it has failed."""
        with self._cond:
            while self._open:
                self._cond.wait()
            self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            raise ModelError(
                f"{self.display} is down: {self._failed}",
                hint="records are kept; rerun with --resume once the endpoint is back (or "
                     "wait longer with --breaker-wait)")

    def trip(self, why: str) -> None:
        """Open the breaker (or wait for the thread already probing) and return once the
        endpoint is healthy again; raise :class:`ModelError` if it does not recover."""
        with self._cond:
            if self._open:  # another thread is probing: wait for its verdict
                while self._open:
                    self._cond.wait()
                self._raise_if_failed()
                return
            self._raise_if_failed()
            self._open = True
            self.trips += 1
        t0 = time.monotonic()
        reason, pause = "", 0.5
        try:
            while True:
                self.probes += 1
                reason = self._probe() or ""
                if not reason or time.monotonic() - t0 + pause > self.wait_s:
                    break
                time.sleep(pause)
                pause = min(5.0, pause * 2)
        finally:
            with self._cond:
                self.paused_s += time.monotonic() - t0
                if reason:
                    self._failed = (f"{why}; its health probe still failed after "
                                    f"{time.monotonic() - t0:.0f} s ({reason})")
                self.consecutive = 0
                self._open = False
                self._cond.notify_all()
        with self._cond:
            self._raise_if_failed()
