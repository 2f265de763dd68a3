"""The service's connections: no request body before its caller is known, none beyond the
service's limits, and a deadline for every connection (issue 38, item 3).

The gates a request passes before its body is read are here, in the order
:func:`certify.service.app.create_app` stacks them (outermost first): :class:`AuthBeforeBody`
(the caller), :class:`BodyLimit` (the body's stated size), :class:`VerifyGate` (card
verifications without a token, per address).

Two layers, because they see different things:

* :class:`AuthBeforeBody` (ASGI middleware) sees requests. A request that carries a body to an
  operation that needs a caller is authenticated from its headers, by the functions the routes
  use (:func:`certify.service.shared.require` and ``principal_from``), and refused (401, 403;
  the UI's forms: a redirect to the login page, 403) before any of its body is received:
  FastAPI parses ``File``/``Form`` parameters, spooling uploads to disk, before a route's
  dependencies run, so an anonymous upload used to be written to disk before its 401. The
  routes keep their own dependency (defence in depth).
* :func:`protocol_class` (uvicorn's h11 protocol, subclassed) sees connections, which uvicorn
  does not bound: it has no deadline for a request's headers, none for a body, and no limit per
  client. See :class:`Deadlines`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import h11
from fastapi import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from certify.service.ratelimit import RateLimiter, client_address, retry_after
from certify.service.shared import API, Services, principal_from, require

log = logging.getLogger("certify.service")

#: Methods whose requests may carry a body that changes something.
CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Operations under /api/v1 that change nothing the caller owns and need no token.
PUBLIC = frozenset({("POST", f"{API}/verify")})
#: The web UI's forms that need a session (its cookie), and the role each needs.
UI_FORMS = {"/submit": "submit", "/logout": "read"}
#: The name of the role a ``require(role)`` dependency carries (see :func:`declared_role`).
ROLE_ATTRIBUTE = "required_role"


# --- no body before the caller ------------------------------------------------------------

class AuthBeforeBody:
    """Authenticate a request that carries a body from its headers, before any of the body is
    read.

    The check runs when the application first asks for the body (its first ``receive()``),
    before that call goes through: by then the router has chosen the operation (``scope
    ["route"]``), whose ``require(role)`` dependency says the role needed (``read``, that is
    any valid token, where it declares none), whatever the nesting of routers. An operation
    that reads no body is left to its own dependency. A refusal is sent at once; the
    application is then told the client left, and what it would still send is dropped. The
    connection's protocol (:class:`DeadlineProtocol`) then closes the connection, since the
    body will not be read (a client which sends it anyway costs nothing more).
    """

    def __init__(self, app: ASGIApp, svc: Services) -> None:
        self.app, self.svc = app, svc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: D102
        if not (scope["type"] == "http" and scope["method"] in CHANGES and _has_body(scope)):
            await self.app(scope, receive, send)
            return
        state = {"checked": False, "refused": False}

        async def checked_receive() -> Message:
            if not state["checked"]:
                state["checked"] = True
                refusal = await asyncio.to_thread(self.refusal, scope)
                if refusal is not None:
                    state["refused"] = True
                    await refusal(scope, _left, send)  # it reads nothing of the request
            if state["refused"]:
                return {"type": "http.disconnect"}
            return await receive()

        async def checked_send(message: Message) -> None:
            if not state["refused"]:
                await send(message)

        try:
            await self.app(scope, checked_receive, checked_send)
        except Exception:
            if not state["refused"]:
                raise
            # the application's reaction to a client that left: nothing to report

    def refusal(self, scope: Scope) -> Response | None:
        """The answer to a request whose caller may not send it (None: it may)."""
        path, method = scope.get("path", ""), scope["method"]
        request = Request(scope)
        if method == "POST" and path in UI_FORMS:
            who = principal_from(request, self.svc)
            if who is None:
                return RedirectResponse("/login", 303)
            if not who.allows(UI_FORMS[path]):
                return HTMLResponse(f"<!doctype html><title>Not allowed</title><p>This "
                                    f"token's role ({who.role}) may not do this. <a href="
                                    f"\"/runs\">Runs</a></p>", status_code=403,
                                    headers={"Cache-Control": "no-store"})
            return None
        if not path.startswith(f"{API}/") or (method, path) in PUBLIC:
            return None
        try:
            require(declared_role(scope.get("route")) or "read")(request)
        except HTTPException as exc:
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code,
                                headers=dict(exc.headers or {}))
        return None


def declared_role(route: BaseRoute | None) -> str | None:
    """The role a route's ``require(role)`` dependency asks for (the highest, if several), or
    None for a route without one (or no route)."""
    from certify.service.auth import ROLES

    found: list[str] = []
    stack = [getattr(route, "dependant", None)]
    while stack:
        dependant = stack.pop()
        if dependant is None:
            continue
        role = getattr(dependant.call, ROLE_ATTRIBUTE, None)
        if role in ROLES:
            found.append(role)
        stack.extend(dependant.dependencies)
    return max(found, key=ROLES.index) if found else None


async def _left() -> Message:
    return {"type": "http.disconnect"}


def _has_body(scope: Scope) -> bool:
    for name, value in scope.get("headers") or ():
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip(b" 0")):
            return True
    return False


# --- what a body may be, before it is read ----------------------------------------------

class BodyLimit:
    """Refuse request bodies over ``limit`` bytes before reading them (413), and bodies of
    unstated length (411): uploads are spooled to disk as they arrive, so a limit checked only
    afterwards would let one request fill the disk."""

    def __init__(self, app: ASGIApp, limit: int, paths: dict[str, int] | None = None
                 ) -> None:
        self.app, self.limit, self.paths = app, limit, paths or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: D102
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = dict(scope.get("headers") or [])
            length = headers.get(b"content-length")
            limit = self.paths.get(scope.get("path", ""), self.limit)
            status, detail = 0, ""
            if length is None:
                if b"chunked" in headers.get(b"transfer-encoding", b""):
                    status, detail = 411, "send the request with a Content-Length"
            elif not length.isdigit() or len(length) > 15 or int(length) > limit:
                status, detail = 413, (f"the request is larger than this service's limit of "
                                       f"{limit // 2**20} MB")
            if status:
                await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class VerifyGate:
    """Rate-limit card verification (API and UI) for callers without a valid token, per
    client address (:mod:`certify.service.ratelimit`), before the upload is read (429 with
    ``Retry-After``)."""

    PATHS = frozenset({f"{API}/verify", "/verify"})

    def __init__(self, app: ASGIApp, svc: Services, limiter: RateLimiter) -> None:
        self.app, self.svc, self.limiter = app, svc, limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:  # noqa: D102
        if scope["type"] == "http" and scope["method"] == "POST" and \
                scope.get("path") in self.PATHS:
            request = Request(scope)
            if await asyncio.to_thread(principal_from, request, self.svc) is None:
                peer = scope["client"][0] if scope.get("client") else None
                who = client_address(peer, request.headers.get("x-forwarded-for"),
                                     self.svc.cfg.trusted_proxies)
                wait = self.limiter.take(who)
                if wait:
                    await JSONResponse(
                        {"detail": f"too many verifications from {who} without a token: at "
                                   f"most {self.limiter.per_minute} a minute"},
                        status_code=429, headers={"Retry-After": retry_after(wait)},
                    )(scope, receive, send)
                    return
        await self.app(scope, receive, send)


# --- deadlines for every connection -------------------------------------------------------

@dataclass(frozen=True)
class Deadlines:
    """What a connection may take (``certify serve`` options of the same meaning).

    * ``header_timeout_s``: a request's headers must be complete this many seconds after the
      connection was accepted, or after the previous response on a kept-alive connection. So a
      connection that sends nothing, sends its headers a byte at a time (slowloris), or stays
      idle between requests is closed then.
    * ``min_body_rate``: bytes a second a request body must arrive at, on average, once
      ``body_grace_s`` have passed (the grace is credit: a body of ``n`` bytes may take
      ``body_grace_s + n / min_body_rate`` seconds). Time in which the service itself was not
      reading (the application busy with what it had) does not count. 0: no minimum.
    * ``max_per_client``: connections open at once from one peer address; the next one is
      closed as soon as it is accepted. Peers in ``exempt`` (the ``--trusted-proxy``
      addresses) are not limited: every client of a reverse proxy shares its address, and the
      proxy limits its own clients.
    """

    header_timeout_s: float = 10.0
    min_body_rate: float = 64 * 1024
    body_grace_s: float = 5.0
    max_per_client: int = 32
    exempt: frozenset[str] = frozenset()

    @classmethod
    def of(cls, header_timeout_s: float, min_body_rate_kb: int, body_grace_s: float,
           max_per_client: int, trusted_proxies: Iterable[str] = ()) -> Deadlines:
        """From the service's settings (a rate in KB/s; proxies in any spelling)."""
        return cls(header_timeout_s, min_body_rate_kb * 1024.0, body_grace_s, max_per_client,
                   frozenset(client_address(p, None, ()) for p in trusted_proxies))


#: How often a body's rate is checked (seconds).
BODY_TICK_S = 0.25
#: How long what a client still sends after its answer is read and dropped (seconds).
LINGER_S = 2.0
#: A refused connection is logged at most this often (seconds), with the count since.
LOG_EVERY_S = 60.0


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with :class:`Deadlines` (make one with :func:`protocol_class`).

    It reads h11's view of the peer (``conn.their_state``: IDLE until a request's headers are
    complete, SEND_BODY while its body arrives) after each read, and arms its timers from that.
    Long responses (server-sent events) are not limited: no deadline runs while the service
    answers a request whose body has arrived. A request answered before its body arrived (a
    refusal) ends its connection (:meth:`_linger`).

    It relies on uvicorn's ``H11Protocol`` internals (``conn``, ``flow``, ``loop``,
    ``on_response_complete``), checked by ``tests/test_connections.py`` against a real server.
    """

    deadlines: ClassVar[Deadlines] = Deadlines()
    #: connections open per peer address, shared by the server's connections (one event loop)
    open_per_client: ClassVar[dict[str, int]] = {}
    refused: ClassVar[list[float]] = [0.0, 0.0]  # count since the last log line, its time

    def __init__(self, config: Config, server_state: ServerState,
                 app_state: dict[str, object], _loop: asyncio.AbstractEventLoop | None = None
                 ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._peer: str | None = None  # counted in open_per_client
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_bytes = 0
        self._body_active = 0.0
        self._body_seen = 0.0
        self._linger_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        d = self.deadlines
        peer = client_address(self.client[0], None, ()) if self.client else None
        if peer is not None and peer not in d.exempt:
            held = self.open_per_client.get(peer, 0)
            if held >= d.max_per_client:
                self._refuse(peer)
                transport.close()
                return
            self.open_per_client[peer] = held + 1
            self._peer = peer
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_deadline()
        self._stop_body_watch()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if self._peer is not None:
            left = self.open_per_client.get(self._peer, 1) - 1
            if left > 0:
                self.open_per_client[self._peer] = left
            else:
                self.open_per_client.pop(self._peer, None)
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._linger_timer is not None:
            return  # the rest of a body already answered: dropped
        if self.conn.their_state is h11.SEND_BODY:
            self._body_bytes += len(data)
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.SEND_BODY:
            self._linger()  # answered before its body came (a refusal): the rest is unwanted
        else:
            self._follow()  # a kept-alive connection: the next request's headers are due

    # what the peer is doing, after each read and each response
    def _follow(self) -> None:
        state = self.conn.their_state
        if state is h11.IDLE:  # between requests, or a request's headers part-way
            if self._header_timer is None:
                self._arm_header_deadline()
            return
        self._stop_header_deadline()
        if state is h11.SEND_BODY:
            if self._body_timer is None and self.deadlines.min_body_rate > 0:
                self._body_bytes, self._body_active = 0, 0.0
                self._body_seen = self.loop.time()
                self._body_timer = self.loop.call_later(BODY_TICK_S, self._body_tick)
        else:
            self._stop_body_watch()

    def _linger(self) -> None:
        """Close a connection whose request was answered before its body arrived: the answer,
        then the end of what the service sends, then what the client still sends is dropped
        for :data:`LINGER_S` before the close. Closing at once, with the client's bytes unread,
        would send a reset that can destroy the answer still on its way."""
        self._stop_header_deadline()
        self._stop_body_watch()
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger_timer = self.loop.call_later(LINGER_S, self._close, "linger")

    def _arm_header_deadline(self) -> None:
        self._stop_header_deadline()
        self._header_timer = self.loop.call_later(self.deadlines.header_timeout_s,
                                                  self._close, "header")

    def _stop_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _stop_body_watch(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_tick(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        now = self.loop.time()
        if not self.flow.read_paused:  # waiting on the client, not on the application
            self._body_active += now - self._body_seen
        self._body_seen = now
        d = self.deadlines
        if self._body_bytes < d.min_body_rate * (self._body_active - d.body_grace_s):
            self._close("body")
            return
        self._body_timer = self.loop.call_later(BODY_TICK_S, self._body_tick)

    def _close(self, why: str) -> None:
        """A deadline's end (``why``: header, body, linger): close, sending nothing."""
        if why == "header":
            self._header_timer = None
        if not self.transport.is_closing():
            # nothing is written: the request is not complete, and a response may have begun
            self.transport.close()

    @classmethod
    def _refuse(cls, peer: str) -> None:
        now = time.monotonic()
        cls.refused[0] += 1
        if now - cls.refused[1] >= LOG_EVERY_S:
            log.warning("closed %d connection(s) over the limit of %d per client address "
                        "(last from %s)", int(cls.refused[0]), cls.deadlines.max_per_client,
                        peer)
            cls.refused[:] = [0.0, now]


def protocol_class(deadlines: Deadlines) -> type[DeadlineProtocol]:
    """A :class:`DeadlineProtocol` class for one server (uvicorn's ``Config(http=...)``), with
    its own count of connections per client."""

    class ServerProtocol(DeadlineProtocol):
        pass

    ServerProtocol.deadlines = deadlines
    ServerProtocol.open_per_client = {}
    ServerProtocol.refused = [0.0, 0.0]
    return ServerProtocol
