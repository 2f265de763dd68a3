"""The web UI: server-rendered Jinja2 pages over the same logic as the API, no build step.

Log in with an API token (a session row in the database; the cookie holds only its random id),
list your runs with verdict badges and filters, submit a model, watch a run's progress live
(server-sent events from the API), open its card, share it (public to every token, or a share
link that needs no token), and verify a card. Every page but login, verify and share links needs
a session; every POST but login and verify carries the session's CSRF token. Another token's
private run answers 404, as a missing one does.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

import jinja2
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from certify.model_card import FIELDS as MODEL_CARD_FIELDS
from certify.service import auth
from certify.service.db import Run
from certify.service.sessions import (
    SESSION_S,
    check_csrf,
    csrf_token,
    end_session,
    new_session,
)
from certify.service.shared import (
    SESSION_COOKIE,
    artefact_response,
    find_run,
    new_share_link,
    owns,
    principal_from,
    revoke_share_links,
    run_json,
    runs_query,
    set_public,
    share_links,
    shared_run,
    verify_upload,
)

VERDICTS = ("PASS", "FAIL", "INCONCLUSIVE", "WARN", "ERROR")


def _environment() -> jinja2.Environment:
    root = importlib.resources.files("certify._templates")
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: root.joinpath("service").joinpath(name).read_text(encoding="utf-8")),
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
        lstrip_blocks=True)


def _secure(request: Request) -> bool:
    return (request.url.scheme == "https"
            or request.headers.get("x-forwarded-proto", "").lower() == "https")


def ui_router(svc: Any) -> APIRouter:  # noqa: C901 - the pages, in one place
    """The UI's routes (mounted at the root)."""
    env = _environment()
    r = APIRouter(include_in_schema=False)

    def page(request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        who = principal_from(request, svc)
        cookie = request.cookies.get(SESSION_COOKIE)
        csrf = csrf_token(cookie, svc.session_key) if (who and cookie) else ""
        html = env.get_template(name).render(who=who, csrf=csrf, **ctx)
        return HTMLResponse(html, status_code=status,
                            headers={"Cache-Control": "no-store",
                                     "Content-Security-Policy":
                                         "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                         "script-src 'self' 'unsafe-inline'; frame-ancestors "
                                         "'self'; form-action 'self'"})

    def login_needed(request: Request) -> auth.Principal | None:
        return principal_from(request, svc)

    async def form_with_csrf(request: Request) -> Any:
        form = await request.form()
        if not check_csrf(request.cookies.get(SESSION_COOKIE), str(form.get("csrf") or ""),
                          svc.session_key):
            await form.close()
            raise HTTPException(403, "missing or wrong CSRF token: reload the page and retry")
        return form

    @r.get("/ui.css")
    def css() -> Response:
        text = (importlib.resources.files("certify._templates") / "service" / "ui.css")
        return Response(text.read_text(encoding="utf-8"), media_type="text/css")

    @r.get("/")
    def home(request: Request) -> RedirectResponse:
        return RedirectResponse("/runs" if login_needed(request) else "/login", 303)

    @r.get("/login")
    def login_page(request: Request) -> HTMLResponse:
        return page(request, "login.html.j2", error=None)

    @r.post("/login")
    async def login(request: Request) -> Response:
        form = await request.form()
        token = str(form.get("token") or "").strip()
        with svc.factory() as s:
            who = auth.authenticate(s, token)
        if who is None:
            return page(request, "login.html.j2", 401,
                        error="That token is unknown, revoked or expired.")
        resp = RedirectResponse("/runs", 303)
        resp.set_cookie(SESSION_COOKIE, new_session(svc.factory, who.token_id),
                        max_age=SESSION_S, httponly=True, samesite="strict",
                        secure=_secure(request))
        return resp

    @r.post("/logout")
    async def logout(request: Request) -> Response:
        await (await form_with_csrf(request)).close()
        end_session(svc.factory, request.cookies.get(SESSION_COOKIE))  # a copy ends too
        resp = RedirectResponse("/login", 303)
        resp.delete_cookie(SESSION_COOKIE)
        return resp

    @r.get("/runs")
    def runs(request: Request, model: str = "", suite: str = "", verdict: str = ""
             ) -> Response:
        who = login_needed(request)
        if who is None:
            return RedirectResponse("/login", 303)
        q = runs_query(who, model, suite, verdict)
        with svc.factory() as s:
            rows = [run_json(x) for x in s.scalars(q.order_by(Run.seq.desc()).limit(200))]
        return page(request, "runs.html.j2", runs=rows, verdicts=VERDICTS,
                    filters={"model": model, "suite": suite, "verdict": verdict})

    def run_view(request: Request, who: auth.Principal, run_id: str,
                 new_link: str | None = None) -> HTMLResponse:
        try:
            run = find_run(svc, run_id, who)
        except HTTPException as exc:  # another token's private run: as a missing one
            return page(request, "error.html.j2", 404, message=str(exc.detail))
        mine = owns(who, run)
        return page(request, "run.html.j2", run=run_json(run), owner=mine,
                    share_links=share_links(svc, run.id) if mine else [], new_link=new_link)

    @r.get("/runs/{run_id}")
    def run_page(request: Request, run_id: str) -> Response:
        who = login_needed(request)
        if who is None:
            return RedirectResponse("/login", 303)
        return run_view(request, who, run_id)

    async def sharing(request: Request, run_id: str) -> tuple[auth.Principal | None, Any]:
        """The caller of a sharing form, and the form (CSRF checked); None for a caller who
        may not change the run (404 page) or has no session (the login page)."""
        who = login_needed(request)
        if who is None:
            return None, RedirectResponse("/login", 303)
        form = await form_with_csrf(request)
        try:
            find_run(svc, run_id, who, own=True)
        except HTTPException as exc:
            await form.close()
            return None, page(request, "error.html.j2", 404, message=str(exc.detail))
        return who, form

    @r.post("/runs/{run_id}/share")
    async def share(request: Request, run_id: str) -> Response:
        who, form = await sharing(request, run_id)
        if who is None:
            return form
        set_public(svc, run_id, str(form.get("public") or "") == "1")
        await form.close()
        return RedirectResponse(f"/runs/{run_id}", 303)

    @r.post("/runs/{run_id}/links")
    async def create_link(request: Request, run_id: str) -> Response:
        who, form = await sharing(request, run_id)
        if who is None:
            return form
        await form.close()
        link = new_share_link(svc, run_id, who)
        # shown once: only the secret's sha256 is kept
        return run_view(request, who, run_id,
                        new_link=str(request.base_url).rstrip("/") + link["path"])

    @r.post("/runs/{run_id}/links/revoke")
    async def revoke_links(request: Request, run_id: str) -> Response:
        who, form = await sharing(request, run_id)
        if who is None:
            return form
        link = str(form.get("link") or "")  # a link's id, or "all"
        await form.close()
        if link == "all":
            revoke_share_links(svc, run_id)
        elif link.isdigit() and len(link) < 18:
            revoke_share_links(svc, run_id, int(link))
        return RedirectResponse(f"/runs/{run_id}", 303)

    @r.get("/shared/{secret}")
    def shared_card(secret: str) -> Response:
        """A share link: the run's card, without a token."""
        return shared_file(secret, "card.html")

    @r.get("/shared/{secret}/{name}")
    def shared_file(secret: str, name: str) -> Response:
        """A share link's files: card.html, card.pdf, results.json, results.json.sig."""
        run = shared_run(svc, secret)
        if run is None:
            raise HTTPException(404, "no such share link (it may have been revoked)")
        return artefact_response(svc, run, name)

    def submit_page(request: Request, status: int = 200, error: str | None = None
                    ) -> HTMLResponse:
        from certify.suite import packaged_suites

        return page(request, "submit.html.j2", status, error=error,
                    suites=sorted(packaged_suites()), datasets=sorted(svc.cfg.datasets))

    @r.get("/submit")
    def submit_form(request: Request) -> Response:
        who = login_needed(request)
        if who is None:
            return RedirectResponse("/login", 303)
        return submit_page(request)

    @r.post("/submit")
    async def submit(request: Request) -> Response:


        who = login_needed(request)
        if who is None:
            return RedirectResponse("/login", 303)
        form = await form_with_csrf(request)
        try:
            return await _submit_form(request, who, form)
        finally:
            await form.close()  # its spooled files

    async def _submit_form(request: Request, who: auth.Principal, form: Any) -> Response:
        from starlette.datastructures import UploadFile

        from certify.service.submit_checks import accept_submission

        if not who.allows("submit"):
            return submit_page(request, 403, f"this token's role {who.role!r} may not submit")

        def file(name: str) -> Any:
            f = form.get(name)
            return f if isinstance(f, UploadFile) and f.filename else None

        def text(name: str) -> str | None:
            v = form.get(name)
            return str(v).strip() or None if isinstance(v, str) else None

        def number(name: str) -> int | None:
            v = text(name)
            if v is None:
                return None
            if not v.isdigit():
                raise HTTPException(422, f"{name} must be a whole number")
            return int(v)

        try:
            models = [f for f in form.getlist("model")
                      if isinstance(f, UploadFile) and f.filename]
            run = await accept_submission(
                svc, who, model=models, endpoint=text("endpoint"), endpoint_secret=None,
                endpoint_header="Authorization", model_version=text("model_version"),
                suite=None if file("suite_file") else text("suite"),
                suite_file=file("suite_file"),
                dataset=None if file("dataset_file") else text("dataset"),
                dataset_file=file("dataset_file"), reference=file("reference"),
                surrogate=file("surrogate"), samples=number("samples"), seed=number("seed"),
                card={k: text(k) for k in MODEL_CARD_FIELDS}, device=text("device"))
        except HTTPException as exc:
            return submit_page(request, exc.status_code, str(exc.detail))
        return RedirectResponse(f"/runs/{run.id}", 303)

    @r.get("/verify")
    def verify_form(request: Request) -> HTMLResponse:
        return page(request, "verify.html.j2", result=None, error=None)

    @r.post("/verify")
    async def verify(request: Request) -> HTMLResponse:
        async with request.form() as form:  # its spooled files are closed on the way out
            return await _verify_form(request, form)

    async def _verify_form(request: Request, form: Any) -> HTMLResponse:
        from starlette.datastructures import UploadFile

        card = form.get("file")
        if not isinstance(card, UploadFile) or not card.filename:
            return page(request, "verify.html.j2", 422, result=None,
                        error="Choose a card.html, card.pdf or results.json to verify.")
        try:
            result = await verify_upload(svc, card, None)  # type: ignore[arg-type]
        except HTTPException as exc:
            return page(request, "verify.html.j2", exc.status_code, result=None,
                        error=str(exc.detail))
        return page(request, "verify.html.j2", result=result, error=None)

    return r
