"""Verifying a card from the web UI (no session needed): the API's verification
(:func:`certify.service.shared.verify_upload`), its answer shown on the page."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse
from starlette.datastructures import FormData, UploadFile

from certify.service.pages.render import page
from certify.service.routes.deps import Svc
from certify.service.shared import Services, verify_upload

router = APIRouter(include_in_schema=False)


@router.get("/verify")
def verify_form(request: Request, svc: Svc) -> HTMLResponse:
    """The verification form."""
    return page(request, svc, "verify.html.j2", result=None, error=None)


@router.post("/verify")
async def verify(request: Request, svc: Svc) -> HTMLResponse:
    """Verify the uploaded card; the answer on the page."""
    async with request.form() as form:  # its spooled files are closed on the way out
        return await _verify_form(request, svc, form)


async def _verify_form(request: Request, svc: Services, form: FormData) -> HTMLResponse:
    card = form.get("file")
    if not isinstance(card, UploadFile) or not card.filename:
        return page(request, svc, "verify.html.j2", 422, result=None,
                    error="Choose a card.html, card.pdf or results.json to verify.")
    try:
        result = await verify_upload(svc, card, None)
    except HTTPException as exc:
        return page(request, svc, "verify.html.j2", exc.status_code, result=None,
                    error=str(exc.detail))
    return page(request, svc, "verify.html.j2", result=result, error=None)
