"""Sharing a run: public to every token (``POST /runs/{id}/share``), or through share links
that need no token (``/runs/{id}/links``). Only the run's owner (or an admin) shares it."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel

from certify.service.routes.deps import MAX_INT, RunId, Submitter, Svc
from certify.service.shared import (
    API,
    find_run,
    new_share_link,
    revoke_share_links,
    run_json,
    set_public,
    share_links,
)

router = APIRouter(tags=["sharing"])


class ShareBody(BaseModel):
    """``POST /runs/{id}/share``: whether every token may read the run."""

    public: bool


@router.post(f"{API}/runs/{{run_id}}/share")
def share(svc: Svc, run_id: RunId, body: ShareBody, who: Submitter) -> dict[str, object]:
    """Make your run public (readable by every token) or private again (admins: any
    run)."""
    find_run(svc, run_id, who, own=True)
    return run_json(set_public(svc, run_id, body.public))


@router.post(f"{API}/runs/{{run_id}}/links", status_code=201)
def create_link(svc: Svc, run_id: RunId, request: Request, who: Submitter
                ) -> dict[str, object]:
    """A share link of your run: whoever holds the URL reads its card and results without
    a token, until the link is revoked. The URL is shown only here."""
    find_run(svc, run_id, who, own=True)
    link = new_share_link(svc, run_id, who)
    return {**link, "url": str(request.base_url).rstrip("/") + link["path"]}


@router.get(f"{API}/runs/{{run_id}}/links")
def list_links(svc: Svc, run_id: RunId, who: Submitter) -> dict[str, object]:
    """Your run's share links (ids and dates: their URLs are not kept)."""
    find_run(svc, run_id, who, own=True)
    return {"links": share_links(svc, run_id)}


@router.delete(f"{API}/runs/{{run_id}}/links")
def revoke_links(svc: Svc, run_id: RunId, who: Submitter) -> dict[str, object]:
    """Revoke every share link of your run."""
    find_run(svc, run_id, who, own=True)
    return {"revoked": revoke_share_links(svc, run_id)}


@router.delete(f"{API}/runs/{{run_id}}/links/{{link_id}}")
def revoke_link(svc: Svc, run_id: RunId, link_id: int, who: Submitter) -> dict[str, object]:
    """Revoke one share link of your run."""
    find_run(svc, run_id, who, own=True)
    if not 1 <= link_id <= MAX_INT or not revoke_share_links(svc, run_id, link_id):
        raise HTTPException(404, f"no share link {link_id} of run {run_id}")
    return {"revoked": 1}
