"""The HTTP API's routes, one module per resource, each an :class:`fastapi.APIRouter` that
:func:`certify.service.app.create_app` includes (in the order of :data:`ROUTERS`):

- :mod:`~certify.service.routes.deps`: what routes take by dependency (the service's state,
  the caller with a role, run ids, integer bounds);
- :mod:`~certify.service.routes.service`: ``/health``, ``/ready``, ``/metrics``;
- :mod:`~certify.service.routes.runs`: ``/runs`` (submit, list), ``/runs/{id}``, its events,
  ``/runs/{id}/cancel``;
- :mod:`~certify.service.routes.sharing`: ``/runs/{id}/share``, ``/runs/{id}/links``;
- :mod:`~certify.service.routes.cards`: a run's card and results files, ``/runs/{a}/compare/{b}``;
- :mod:`~certify.service.routes.verify`: ``/verify``;
- :mod:`~certify.service.routes.uploads`: ``/uploads/{digest}``;
- :mod:`~certify.service.routes.log`: the transparency log, ``/key`` and ``/certificate``
  (a router made from the service's log and keys: :func:`~certify.service.routes.log.log_router`).

The order matters where two paths can match one request: a run's events and share links
come before ``/runs/{id}/{name}`` (its files), which would otherwise take them.
"""

from __future__ import annotations

from fastapi import APIRouter

from certify.service.routes import cards, runs, service, sharing, uploads, verify

#: The API's routers, in the order they are included.
ROUTERS: tuple[APIRouter, ...] = (service.router, runs.router, sharing.router, cards.router,
                                  verify.router, uploads.router)
