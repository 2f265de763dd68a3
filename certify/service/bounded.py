"""An HTTP request whose answer is read within a byte cap and a total deadline.

The client of a certify service (``certify submit``, ``certify runs``, ``certify verify
--log``) faces servers it does not control: an answer may be endless, huge or trickled a byte
at a time. ``requests``' own timeout bounds each socket read, not the request, and its
``.content`` reads whatever arrives into memory. :func:`bounded_request` instead

- gives the whole request one deadline: a watchdog shuts the request's connection down when it
  passes, whatever the request is doing (connecting, sending, waiting for headers that arrive
  a byte at a time, reading the body), and each read of the body also has the socket's timeout
  set to what is left of it;
- reads the body in pieces, refusing it as soon as it passes ``max_bytes`` (a ``Content-Length``
  above it is refused before any of the body is read), into memory or straight into a file;
- asks for the body uncompressed, and counts decoded bytes where a server compresses anyway.

Use a :func:`session` (its connection pools let the watchdog reach the request's connection);
with another ``requests.Session`` the deadline still bounds the body, not the headers.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from certify.errors import CertifyError

if TYPE_CHECKING:
    import requests

#: The most seconds one request may take, answer included (``--request-timeout``'s default).
DEFAULT_DEADLINE_S = 120.0
#: The most bytes one downloaded file may have (``--max-download-mb``'s default, in MiB).
DEFAULT_MAX_DOWNLOAD_MB = 256
#: The most bytes of a JSON answer, whatever the download cap (a run's state, a log proof).
MAX_JSON_BYTES = 8 * 2**20
#: Seconds a connection may take to open (within the deadline).
CONNECT_S = 10.0
_PIECE = 64 * 1024

#: Makes the caller's error from a message and a hint.
ErrorFactory = Callable[[str, "str | None"], CertifyError]


@dataclass(frozen=True)
class Bounds:
    """How long one request may take in all, and how many bytes its answer may have."""

    deadline_s: float = DEFAULT_DEADLINE_S
    max_bytes: int = DEFAULT_MAX_DOWNLOAD_MB * 2**20


@dataclass
class Answer:
    """A read answer: its status, headers, and body (``None`` where it went to a file)."""

    status: int
    headers: dict[str, str]
    body: bytes | None
    size: int
    url: str

    def json(self) -> Any:
        """The body as JSON (``ValueError`` where it is not)."""
        import json

        return json.loads(self.body or b"")


class _Watch:
    """The connections one request used, shut down when its deadline passes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conns: list[Any] = []
        self.fired = False

    def add(self, conn: Any) -> None:
        with self.lock:
            self.conns.append(conn)
            if self.fired:
                _shut(conn)

    def fire(self) -> None:
        with self.lock:
            self.fired = True
            for conn in self.conns:
                _shut(conn)


def _shut(conn: Any) -> None:
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv or send at once
        except OSError:
            pass


#: The watch of the request this thread is making (set by :func:`bounded_request`).
_current = threading.local()


def session() -> requests.Session:
    """A ``requests.Session`` whose connections :func:`bounded_request`'s watchdog can shut
    down at the deadline (its pools register each connection a request uses)."""
    import requests
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class Watched:
        def _make_request(self, conn: Any, *args: Any, **kw: Any) -> Any:
            watch = getattr(_current, "watch", None)
            if watch is not None:
                watch.add(conn)
            return super()._make_request(conn, *args, **kw)  # type: ignore[misc]

    class WatchedHTTP(Watched, HTTPConnectionPool):
        pass

    class WatchedHTTPS(Watched, HTTPSConnectionPool):
        pass

    s = requests.Session()
    for prefix in ("http://", "https://"):
        adapter = s.get_adapter(prefix)
        manager = getattr(adapter, "poolmanager", None)
        if manager is not None:
            manager.pool_classes_by_scheme = {"http": WatchedHTTP, "https": WatchedHTTPS}
    return s


def _socket_of(r: requests.Response) -> socket.socket | None:  # noqa: D103
    conn = getattr(r.raw, "connection", None)
    sock = getattr(conn, "sock", None)
    return sock if isinstance(sock, socket.socket) else None


def bounded_request(session: requests.Session, method: str, url: str, bounds: Bounds,
                    error: ErrorFactory, *, what: str, dest: Path | None = None,
                    cap: int | None = None, redirects: int = 0,
                    where: str = "the server", unreachable_hint: str | None = None,
                    **kw: Any) -> Answer:
    """``method url`` with ``session``, its answer read within ``bounds``; the body into
    ``dest`` (a file created 0600, replaced only when the whole body arrived) or into memory.
    ``cap``: a smaller byte cap for this answer. ``what`` names the request in errors, which
    ``error(message, hint)`` makes (a refused body, a passed deadline, a connection that
    failed). ``redirects``: how many redirects of a GET to follow (within the same deadline;
    none is read, and the session's Authorization header goes only to the same origin).
    ``where`` names the server in "cannot reach WHERE", with ``unreachable_hint``."""
    limit = bounds.max_bytes if cap is None else min(cap, bounds.max_bytes)
    too_big = ("a certify service's answers are far smaller: is this a certify service?"
               if cap is not None and cap < bounds.max_bytes else
               f"--max-download-mb MB allows larger files (now {limit / 2**20:g} MiB)")
    start = time.monotonic()
    deadline = start + bounds.deadline_s

    def late() -> CertifyError:
        return error(f"{what} did not complete within {bounds.deadline_s:g} s",
                     "the server is slow or stalling; --request-timeout SECONDS allows more")

    headers = {"Accept-Encoding": "identity", **kw.pop("headers", {})}
    watch = _Watch()

    def unreachable(exc: Exception) -> CertifyError:
        if watch.fired:
            return late()
        return error(f"cannot reach {where}: {type(exc).__name__}",
                     unreachable_hint or "check the server's address and that it is running")

    timer = threading.Timer(bounds.deadline_s, watch.fire)
    timer.daemon = True
    _current.watch = watch
    timer.start()
    try:
        return _read(session, method, url, deadline, headers, error, late, unreachable, what,
                     redirects, kw, dest, limit, too_big, watch)
    finally:
        timer.cancel()
        _current.watch = None


def _read(session: requests.Session, method: str, url: str, deadline: float,
          headers: dict[str, str], error: ErrorFactory, late: Callable[[], CertifyError],
          unreachable: Callable[[Exception], CertifyError], what: str, redirects: int,
          kw: dict[str, Any], dest: Path | None, limit: int, too_big: str,
          watch: _Watch) -> Answer:
    r = _open(session, method, url, deadline, headers, error, late, unreachable, what,
              redirects, kw)
    try:
        declared = r.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > limit:
            raise error(f"{what}: the answer is {int(declared):,} bytes, more than the "
                        f"{limit:,} allowed", too_big)
        sock = _socket_of(r)
        body = bytearray()
        size = 0
        tmp = None if dest is None else dest.with_name(f".{dest.name}.part")
        out = None
        if tmp is not None:
            out = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise late()
                if sock is not None:
                    sock.settimeout(left)
                try:
                    piece = r.raw.read1(_PIECE)
                except Exception as exc:  # noqa: BLE001 - urllib3 wraps a timeout its own way
                    if (watch.fired or time.monotonic() >= deadline
                            or "timed out" in str(exc).lower()):
                        raise late() from None
                    raise error(f"{what}: the connection failed while reading the answer "
                                f"({type(exc).__name__})", "try again") from None
                if not piece:
                    if watch.fired:  # the watchdog's shutdown reads as an end of the body
                        raise late()
                    break
                size += len(piece)
                if size > limit:
                    raise error(f"{what}: the answer passed {limit:,} bytes",
                                too_big)
                if out is not None:
                    out.write(piece)
                else:
                    body += piece
            if out is not None and dest is not None and tmp is not None:
                out.close()
                out = None
                os.replace(tmp, dest)
                tmp = None
        finally:
            if out is not None:
                out.close()
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        return Answer(r.status_code, dict(r.headers), None if dest is not None else bytes(body),
                      size, r.url)
    finally:
        r.close()


def _origin(url: str) -> tuple[str, str, int | None]:
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return u.scheme, (u.hostname or ""), u.port


def _open(http: requests.Session, method: str, url: str, deadline: float,
          headers: dict[str, str], error: ErrorFactory, late: Callable[[], CertifyError],
          unreachable: Callable[[Exception], CertifyError], what: str, redirects: int,
          kw: dict[str, Any]) -> requests.Response:
    """The response to ``method url`` (its headers read, its body not), following at most
    ``redirects`` redirects by hand: requests' own following reads each redirect's body into
    memory, unbounded, before it moves on."""
    import requests

    first = _origin(url)
    for hop in range(redirects + 1):
        left = deadline - time.monotonic()
        if left <= 0:
            raise late()
        sender = http
        if hop and _origin(url) != first:  # the token stays with the service
            sender = session()
        try:
            r = sender.request(method, url, timeout=(min(CONNECT_S, left), left), stream=True,
                               headers=headers, allow_redirects=False, **kw)
        except requests.Timeout:
            raise late() from None
        except requests.RequestException as exc:
            raise unreachable(exc) from None
        location = r.headers.get("Location")
        if not (r.is_redirect and location and method == "GET" and hop < redirects):
            return r
        from urllib.parse import urljoin

        r.close()  # unread: a redirect's body is never needed
        url = urljoin(url, location)
        if not url.startswith(("https://", "http://")):
            raise error(f"{what}: redirected to a URL that is not http(s)", None)
    raise AssertionError("unreachable")  # pragma: no cover
