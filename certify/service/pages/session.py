"""Logging in and out of the web UI (a session row; the cookie holds only its random id), the
home page and the stylesheet."""

from __future__ import annotations

import importlib.resources

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from certify.service import auth
from certify.service.pages.render import form_with_csrf, page, secure
from certify.service.routes.deps import Svc
from certify.service.sessions import SESSION_S, end_session, new_session
from certify.service.shared import SESSION_COOKIE, principal_from

router = APIRouter(include_in_schema=False)


@router.get("/ui.css")
def css() -> Response:
    """The pages' stylesheet."""
    text = (importlib.resources.files("certify._templates") / "service" / "ui.css")
    return Response(text.read_text(encoding="utf-8"), media_type="text/css")


@router.get("/")
def home(request: Request, svc: Svc) -> RedirectResponse:
    """The runs for a caller with a session, else the login page."""
    return RedirectResponse("/runs" if principal_from(request, svc) else "/login", 303)


@router.get("/login")
def login_page(request: Request, svc: Svc) -> HTMLResponse:
    """The login form (an API token)."""
    return page(request, svc, "login.html.j2", error=None)


@router.post("/login")
async def login(request: Request, svc: Svc) -> Response:
    """A session for a valid token (its cookie: HTTP-only, same-site strict)."""
    form = await request.form()
    token = str(form.get("token") or "").strip()
    with svc.factory() as s:
        who = auth.authenticate(s, token)
    if who is None:
        return page(request, svc, "login.html.j2", 401,
                    error="That token is unknown, revoked or expired.")
    resp = RedirectResponse("/runs", 303)
    resp.set_cookie(SESSION_COOKIE, new_session(svc.factory, who.token_id),
                    max_age=SESSION_S, httponly=True, samesite="strict",
                    secure=secure(request))
    return resp


@router.post("/logout")
async def logout(request: Request, svc: Svc) -> Response:
    """End the session (a copy of its cookie ends too)."""
    await (await form_with_csrf(request, svc)).close()
    end_session(svc.factory, request.cookies.get(SESSION_COOKIE))
    resp = RedirectResponse("/login", 303)
    resp.delete_cookie(SESSION_COOKIE)
    return resp
