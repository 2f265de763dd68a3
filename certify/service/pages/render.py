"""What every page of the web UI shares: its templates, the page frame (the caller, the CSRF
token, the security headers), and forms that carry the session's CSRF token."""

from __future__ import annotations

import functools
import importlib.resources

import jinja2
from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse
from starlette.datastructures import FormData

from certify.service.sessions import check_csrf, csrf_token
from certify.service.shared import SESSION_COOKIE, Services, principal_from

#: The headers of every page: nothing cached, nothing loaded from elsewhere.
PAGE_HEADERS = {"Cache-Control": "no-store",
                "Content-Security-Policy":
                    "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                    "script-src 'self' 'unsafe-inline'; frame-ancestors "
                    "'self'; form-action 'self'"}


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The pages' templates (``templates/service``, packaged as ``certify._templates``)."""
    root = importlib.resources.files("certify._templates")
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: root.joinpath("service").joinpath(name).read_text(encoding="utf-8")),
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
        lstrip_blocks=True)


def page(request: Request, svc: Services, name: str, status: int = 200,
         **ctx: object) -> HTMLResponse:
    """The template ``name`` rendered for the caller (``who``, and the CSRF token its forms
    carry)."""
    who = principal_from(request, svc)
    cookie = request.cookies.get(SESSION_COOKIE)
    csrf = csrf_token(cookie, svc.session_key) if (who and cookie) else ""
    html = environment().get_template(name).render(who=who, csrf=csrf, **ctx)
    return HTMLResponse(html, status_code=status, headers=PAGE_HEADERS)


def error_page(request: Request, svc: Services, status: int, message: str) -> HTMLResponse:
    """The error page (a run another token may not read is 404, as a missing one)."""
    return page(request, svc, "error.html.j2", status, message=message)


async def form_with_csrf(request: Request, svc: Services) -> FormData:
    """The request's form, whose CSRF token must be the session's (403 otherwise); the
    caller closes it (its spooled files)."""
    form = await request.form()
    if not check_csrf(request.cookies.get(SESSION_COOKIE), str(form.get("csrf") or ""),
                      svc.session_key):
        await form.close()
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and retry")
    return form


def secure(request: Request) -> bool:
    """Whether the browser reached the service over HTTPS (directly or through a proxy that
    says so): the session cookie is then marked ``Secure``."""
    return (request.url.scheme == "https"
            or request.headers.get("x-forwarded-proto", "").lower() == "https")
