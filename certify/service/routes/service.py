"""The service itself: liveness (``/health``), readiness (``/ready``) and its metrics
(``/metrics``)."""

from __future__ import annotations

import ipaddress
import time

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy import select

from certify.service.ratelimit import client_address
from certify.service.routes.deps import Svc, workers_started_here
from certify.service.shared import API, principal_from
from certify.version import __version__

router = APIRouter(tags=["service"])


@router.get(f"{API}/health")
def health(svc: Svc) -> dict[str, str]:
    """Liveness: the database answers."""
    with svc.factory() as s:
        s.execute(select(1))
    return {"status": "ok", "version": __version__}


@router.get(f"{API}/ready")
def ready(request: Request, svc: Svc) -> JSONResponse:
    """Readiness (distinct from liveness): the database and the store answer, the
    service is not shutting down, and its workers run (when it has any). 503 otherwise."""
    why = None
    try:
        with svc.factory() as s:
            s.execute(select(1))
    except Exception:  # noqa: BLE001 - any database failure means not ready
        why = "the database does not answer"
    started = time.perf_counter()
    try:
        svc.store.ping()
    except Exception:  # noqa: BLE001 - any store failure means not ready
        why = why or "the store does not answer"
    else:
        if svc.counters is not None:
            svc.counters.store_latency(time.perf_counter() - started)
    if svc.stopping.is_set():
        why = "the service is shutting down"
    elif svc.cfg.workers > 0 and workers_started_here(request) and svc.workers is None:
        why = "the workers have not started"
    if why is not None:
        return JSONResponse({"detail": why}, status_code=503)
    return JSONResponse({"status": "ready", "workers": svc.cfg.workers,
                         "store": svc.store.description.split("://", 1)[0]})


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request, svc: Svc) -> PlainTextResponse:
    """The service's metrics (Prometheus text format): runs by state, queue depth, run
    durations, HTTP responses by status class, verifications, every worker's heartbeat
    age and slots, the store's latency. Needs an admin token, or a request from the
    loopback address (not through a --trusted-proxy)."""
    from certify.service.metrics import exposition

    who = principal_from(request, svc)
    assert svc.counters is not None  # made with the application
    if not _from_this_host(request, svc.cfg.trusted_proxies) and (
            who is None or not who.allows("admin")):
        raise HTTPException(401 if who is None else 403,
                            "metrics need an admin token, or a request from this host")
    return PlainTextResponse(exposition(svc.factory, svc.counters, svc.store),
                             media_type="text/plain; version=0.0.4")


def _from_this_host(request: Request, trusted_proxies: tuple[str, ...]) -> bool:
    """Whether the socket's peer is the loopback address. A peer that is a trusted proxy is
    never "this host", even on the loopback address (a local reverse proxy): its client is
    elsewhere, whatever X-Forwarded-For says."""
    # the socket's peer, in the spelling client_address gives addresses
    peer = client_address(request.client.host if request.client else None, None, ())
    via_proxy = peer in {client_address(p, None, ()) for p in trusted_proxies}
    try:
        return not via_proxy and ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return False
