"""Which endpoint URLs a submitted run may reach.

The service must not become a way to reach hosts on its own network. A URL is accepted when its
``HOST`` or ``HOST:PORT`` is on the operator's allow-list (``--allow-endpoint``); otherwise only
when every address its host resolves to is a global one: private, loopback, link-local,
multicast, reserved and unspecified addresses are refused unless allowed, and so is an IPv6
address that embeds one of them (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``,
NAT64 ``64:ff9b::a.b.c.d``, 6to4, Teredo). A URL with a control character or whitespace (a CR or
LF smuggles headers into a request) is refused whatever its host.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


class EndpointRefused(Exception):
    """A URL the service will not reach; the message says why."""


def _allowed(host: str, port: int, allow: tuple[str, ...]) -> bool:
    host = host.lower().strip("[]")
    for entry in allow:
        e = entry.lower()
        if e.startswith("["):  # [v6]:port
            h, _, p = e[1:].partition("]")
            p = p.removeprefix(":")
        elif e.count(":") == 1:
            h, p = e.split(":")
        else:
            h, p = e, ""
        if h.strip("[]") == host and (not p or p == str(port)):
            return True
    return False


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_COMPAT = ipaddress.ip_network("::/96")


def why_not_global(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why a run may not reach ``addr`` (its kind), or ``None`` for a global unicast address."""
    for flag in ("is_loopback", "is_private", "is_link_local", "is_multicast", "is_reserved",
                 "is_unspecified", "is_site_local"):
        if getattr(addr, flag, False):
            return flag.removeprefix("is_").replace("_", "-")
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = [addr.ipv4_mapped, addr.sixtofour, addr.teredo[1] if addr.teredo else None]
        if addr in _NAT64 or addr in _COMPAT:
            embedded.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
        if addr in _NAT64_LOCAL:
            return "local NAT64"
        for v4 in embedded:
            if v4 is not None and (inner := why_not_global(v4)) is not None:
                return f"{inner} (embedded in {addr})"
    if not addr.is_global:
        return "not global"
    return None


def check_endpoint(url: str, allow: tuple[str, ...],
                   resolve: bool = True) -> str:
    """Return ``url`` if a run may reach it; raise :class:`EndpointRefused` otherwise."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise EndpointRefused("the URL holds a control character or whitespace")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise EndpointRefused(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EndpointRefused("the endpoint must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise EndpointRefused("the URL carries credentials; send them as the endpoint secret")
    host = parts.hostname
    port = port or (443 if parts.scheme == "https" else 80)
    if _allowed(host, port, allow):
        return url
    if not resolve:
        raise EndpointRefused(f"{host}:{port} is not on the service's endpoint allow-list")
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise EndpointRefused(f"cannot resolve {host}: {exc}") from None
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        kind = why_not_global(addr)
        if kind is not None:
            raise EndpointRefused(
                f"{host} resolves to {addr}, a {kind} address (not a global one); the "
                f"operator must allow it with --allow-endpoint "
                f"{f'[{host}]' if ':' in host else host}:{port}")
    return url
