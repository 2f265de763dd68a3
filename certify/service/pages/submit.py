"""Submitting a model from the web UI: the same static checks as ``POST /api/v1/runs``
(:func:`certify.service.submit_checks.accept_submission`), refusals shown on the form."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.datastructures import FormData, UploadFile

from certify.model_card import FIELDS as MODEL_CARD_FIELDS
from certify.service import auth
from certify.service.pages.render import form_with_csrf, page
from certify.service.routes.deps import Svc
from certify.service.shared import Services, principal_from

router = APIRouter(include_in_schema=False)


def submit_page(request: Request, svc: Services, status: int = 200,
                error: str | None = None) -> HTMLResponse:
    """The submission form (with a refusal's ``error``)."""
    from certify.suite import packaged_suites

    return page(request, svc, "submit.html.j2", status, error=error,
                suites=sorted(packaged_suites()), datasets=sorted(svc.cfg.datasets))


@router.get("/submit")
def submit_form(request: Request, svc: Svc) -> Response:
    """The submission form, for a caller with a session."""
    if principal_from(request, svc) is None:
        return RedirectResponse("/login", 303)
    return submit_page(request, svc)


@router.post("/submit")
async def submit(request: Request, svc: Svc) -> Response:
    """Submit the form's model: the run's page once its static checks pass."""
    who = principal_from(request, svc)
    if who is None:
        return RedirectResponse("/login", 303)
    form = await form_with_csrf(request, svc)
    try:
        return await _submit_form(request, svc, who, form)
    finally:
        await form.close()  # its spooled files


async def _submit_form(request: Request, svc: Services, who: auth.Principal, form: FormData
                       ) -> Response:
    from certify.service.submit_checks import RunRequest, accept_submission

    if not who.allows("submit"):
        return submit_page(request, svc, 403,
                           f"this token's role {who.role!r} may not submit")
    try:
        models = [f for f in form.getlist("model")
                  if isinstance(f, UploadFile) and f.filename]
        run = await accept_submission(svc, who, RunRequest(
            model=models, endpoint=_text(form, "endpoint"), endpoint_secret=None,
            endpoint_header="Authorization", model_version=_text(form, "model_version"),
            suite=None if _file(form, "suite_file") else _text(form, "suite"),
            suite_file=_file(form, "suite_file"),
            dataset=None if _file(form, "dataset_file") else _text(form, "dataset"),
            dataset_file=_file(form, "dataset_file"), reference=_file(form, "reference"),
            surrogate=_file(form, "surrogate"), samples=_number(form, "samples"),
            seed=_number(form, "seed"),
            card={k: _text(form, k) for k in MODEL_CARD_FIELDS}, device=_text(form, "device")))
    except HTTPException as exc:
        return submit_page(request, svc, exc.status_code, str(exc.detail))
    return RedirectResponse(f"/runs/{run.id}", 303)


def _file(form: FormData, name: str) -> UploadFile | None:
    """The form's file ``name`` (None where no file was chosen)."""
    f = form.get(name)
    return f if isinstance(f, UploadFile) and f.filename else None


def _text(form: FormData, name: str) -> str | None:
    """The form's text field ``name``, stripped (None where empty or missing)."""
    v = form.get(name)
    return str(v).strip() or None if isinstance(v, str) else None


def _number(form: FormData, name: str) -> int | None:
    """The form's whole number ``name`` (None where empty; 422 where not a number)."""
    v = _text(form, name)
    if v is None:
        return None
    if not v.isdigit():
        raise HTTPException(422, f"{name} must be a whole number")
    return int(v)
