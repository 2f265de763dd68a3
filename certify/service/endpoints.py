"""Which endpoint URLs a submitted run may reach.

The service must not become a way to reach hosts on its own network. A URL is accepted when its
``HOST`` or ``HOST:PORT`` is on the operator's allow-list (``--allow-endpoint``); otherwise only
when every address its host resolves to is a global one: private, loopback, link-local,
multicast, reserved and unspecified addresses are refused unless allowed.
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


def check_endpoint(url: str, allow: tuple[str, ...],
                   resolve: bool = True) -> str:
    """Return ``url`` if a run may reach it; raise :class:`EndpointRefused` otherwise."""
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
        if not addr.is_global:
            raise EndpointRefused(
                f"{host} resolves to {addr}, a private, loopback or link-local address; the "
                f"operator must allow it with --allow-endpoint {host}:{port}")
    return url
