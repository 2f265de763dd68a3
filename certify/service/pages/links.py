"""Share links: a run's card and files for whoever holds the link's URL, without a token,
until it is revoked."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from certify.service.routes.deps import Svc
from certify.service.shared import Services, artefact_response, shared_run

router = APIRouter(include_in_schema=False)


@router.get("/shared/{secret}")
def shared_card(svc: Svc, secret: str) -> Response:
    """A share link: the run's card, without a token."""
    return _shared(svc, secret, "card.html")


@router.get("/shared/{secret}/{name}")
def shared_file(svc: Svc, secret: str, name: str) -> Response:
    """A share link's files: card.html, card.pdf, results.json, results.json.sig."""
    return _shared(svc, secret, name)


def _shared(svc: Services, secret: str, name: str) -> Response:
    run = shared_run(svc, secret)
    if run is None:
        raise HTTPException(404, "no such share link (it may have been revoked)")
    return artefact_response(svc, run, name)
