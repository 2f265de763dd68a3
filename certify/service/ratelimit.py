"""Rate limits for callers without a token, keyed on the client's address.

The service's public operations (verifying a card) cost CPU; a caller without a token may make
at most ``per_minute`` of them a minute (a token bucket per address, refilled continuously, so
bursts up to ``per_minute`` pass). Behind a reverse proxy every request comes from the proxy's
address: ``--trusted-proxy ADDRESS`` names the proxies whose ``X-Forwarded-For`` header is read
(its rightmost address that is not itself a trusted proxy is the client); from any other peer
the header is ignored, since a client can write it.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

#: Addresses remembered at once; the least recently seen are forgotten first (an attacker
#: with many addresses resets its own buckets, never another client's).
MAX_CLIENTS = 65_536


class RateLimiter:
    """A token bucket per key: ``per_minute`` requests a ``period`` (60 s unless given),
    bursts up to ``per_minute``."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic,
                 period: float = 60.0) -> None:
        if per_minute < 1:
            raise ValueError("per_minute must be at least 1")
        self.per_minute = per_minute
        self.period = period
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, key: str) -> float:
        """Spend one request of ``key``'s bucket: 0 when allowed, else the seconds until the
        next request would be (for ``Retry-After``)."""
        rate = self.per_minute / self.period
        now = self._clock()
        with self._lock:
            tokens, seen = self._buckets.pop(key, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - seen) * rate)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / rate
            self._buckets[key] = (tokens, now)
            while len(self._buckets) > MAX_CLIENTS:
                self._buckets.popitem(last=False)
        return wait


def client_address(peer: str | None, forwarded_for: str | None,
                   trusted: Iterable[str]) -> str:
    """The client's address: ``peer``, or, when ``peer`` is a trusted proxy, the rightmost
    address of ``forwarded_for`` (``X-Forwarded-For``) that is not a trusted proxy."""
    proxies = {_norm(t) for t in trusted}
    client = _norm(peer or "unknown")
    if client not in proxies or not forwarded_for:
        return client
    for hop in reversed([h.strip() for h in forwarded_for.split(",") if h.strip()]):
        hop = _norm(hop)
        if hop not in proxies:
            return hop
    return client


def _norm(address: str) -> str:
    """An address in one spelling (``::ffff:1.2.3.4`` is ``1.2.3.4``); anything else as given,
    lower-cased and cut to 64 characters (an unparsable header value is still one key)."""
    try:
        ip = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return address.strip().lower()[:64]
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def retry_after(wait: float) -> str:
    """``Retry-After`` seconds for a wait (at least 1)."""
    return str(max(1, math.ceil(wait)))
