"""The caller's runs (a list with verdict badges and filters), one run's page (its progress,
live, its card and files, sharing), and the sharing forms of its owner."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.datastructures import FormData

from certify.service import auth
from certify.service.db import Run
from certify.service.pages.render import error_page, form_with_csrf, page
from certify.service.routes.deps import Svc
from certify.service.shared import (
    Services,
    find_run,
    new_share_link,
    owns,
    principal_from,
    revoke_share_links,
    run_json,
    runs_query,
    set_public,
    share_links,
)

#: The verdicts the list filters by.
VERDICTS = ("PASS", "FAIL", "INCONCLUSIVE", "WARN", "ERROR")

router = APIRouter(include_in_schema=False)


@router.get("/runs")
def runs(request: Request, svc: Svc, model: str = "", suite: str = "", verdict: str = ""
         ) -> Response:
    """The caller's runs (an admin's: every run), newest first, filtered."""
    who = principal_from(request, svc)
    if who is None:
        return RedirectResponse("/login", 303)
    q = runs_query(who, model, suite, verdict)
    with svc.factory() as s:
        rows = [run_json(x) for x in s.scalars(q.order_by(Run.seq.desc()).limit(200))]
    return page(request, svc, "runs.html.j2", runs=rows, verdicts=VERDICTS,
                filters={"model": model, "suite": suite, "verdict": verdict})


def run_view(request: Request, svc: Services, who: auth.Principal, run_id: str,
             new_link: str | None = None) -> HTMLResponse:
    """A run's page (its owner sees its share links; ``new_link``: a link just made, shown
    once)."""
    try:
        run = find_run(svc, run_id, who)
    except HTTPException as exc:  # another token's private run: as a missing one
        return error_page(request, svc, 404, str(exc.detail))
    mine = owns(who, run)
    return page(request, svc, "run.html.j2", run=run_json(run), owner=mine,
                share_links=share_links(svc, run.id) if mine else [], new_link=new_link)


@router.get("/runs/{run_id}")
def run_page(request: Request, svc: Svc, run_id: str) -> Response:
    """One run's page."""
    who = principal_from(request, svc)
    if who is None:
        return RedirectResponse("/login", 303)
    return run_view(request, svc, who, run_id)


async def _sharing_form(request: Request, svc: Services, run_id: str
                        ) -> tuple[auth.Principal, FormData] | Response:
    """The caller of a sharing form and the form (CSRF checked; the caller closes it), or the
    answer to a caller who has no session (the login page) or may not change the run (404)."""
    who = principal_from(request, svc)
    if who is None:
        return RedirectResponse("/login", 303)
    form = await form_with_csrf(request, svc)
    try:
        find_run(svc, run_id, who, own=True)
    except HTTPException as exc:
        await form.close()
        return error_page(request, svc, 404, str(exc.detail))
    return who, form


@router.post("/runs/{run_id}/share")
async def share(request: Request, svc: Svc, run_id: str) -> Response:
    """Make the run public (``public=1``) or private."""
    got = await _sharing_form(request, svc, run_id)
    if isinstance(got, Response):
        return got
    _, form = got
    set_public(svc, run_id, str(form.get("public") or "") == "1")
    await form.close()
    return RedirectResponse(f"/runs/{run_id}", 303)


@router.post("/runs/{run_id}/links")
async def create_link(request: Request, svc: Svc, run_id: str) -> Response:
    """A new share link, shown once on the run's page (only its secret's sha256 is kept)."""
    got = await _sharing_form(request, svc, run_id)
    if isinstance(got, Response):
        return got
    who, form = got
    await form.close()
    link = new_share_link(svc, run_id, who)
    return run_view(request, svc, who, run_id,
                    new_link=str(request.base_url).rstrip("/") + link["path"])


@router.post("/runs/{run_id}/links/revoke")
async def revoke_links(request: Request, svc: Svc, run_id: str) -> Response:
    """Revoke one share link (``link``: its id) or every one (``link=all``)."""
    got = await _sharing_form(request, svc, run_id)
    if isinstance(got, Response):
        return got
    _, form = got
    link = str(form.get("link") or "")
    await form.close()
    if link == "all":
        revoke_share_links(svc, run_id)
    elif link.isdigit() and len(link) < 18:
        revoke_share_links(svc, run_id, int(link))
    return RedirectResponse(f"/runs/{run_id}", 303)
