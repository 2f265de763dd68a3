"""The HTTP API (``/api/v1``), mounted with the web UI and the transparency log's routes.

Only static validation happens before a submission's 202 (tokens and limits, suite parse, upload
sizes, the ONNX static checks, dataset name, endpoint allow-list); the model is loaded and
probed in the run's own process, whose refusals end the run ``error`` with the messages
``certify run`` prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from cryptography.hazmat.primitives import serialization
from fastapi import Depends, FastAPI, File, Form, HTTPException, Query, Request, UploadFile
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel
from sqlalchemy import func, select

from certify.errors import CertifyError
from certify.service import auth, queue
from certify.service.config import ServeConfig
from certify.service.db import FINAL_STATES, Run, Upload
from certify.service.ratelimit import RateLimiter, client_address, retry_after
from certify.service.runids import RUN_ID_FORMAT
from certify.service.shared import (
    API,
    ARTEFACTS,
    Services,
    artefact_response,
    find_run,
    new_share_link,
    principal_from,
    require,
    revoke_share_links,
    run_json,
    runs_query,
    set_public,
    share_links,
    verified_results,
    verify_upload,
)
from certify.version import __version__

log = logging.getLogger("certify.service")

def open_services(cfg: ServeConfig, rotate_identity: bool = False) -> Services:
    """Open (and migrate) the database, the store, the keys and the log.

    Every node of one service (API nodes and ``certify worker`` processes) calls this with
    the same database and store; its keys are checked against the service's recorded identity
    (:mod:`certify.service.identity`)."""
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from certify.errors import UsageError
    from certify.redact import redact
    from certify.service.db import make_engine, migrate, sessions
    from certify.service.identity import load_identity
    from certify.service.private import secure_home
    from certify.service.store import StoreError
    from certify.service.store_url import open_store
    from certify.service.tlog import TransparencyLog
    from certify.service.uploads import Limits

    try:
        secure_home(cfg.home)  # 0700; an existing home's files tightened, with a log line
    except OSError as exc:
        raise UsageError(f"cannot use --home {cfg.home}: {exc.strerror}",
                         hint="choose a folder the service may write") from None
    try:
        engine = make_engine(cfg.db_url)
        migrate(engine)
    except (ArgumentError, SQLAlchemyError, ImportError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        raise UsageError(f"cannot open the database {redact(cfg.db_url)}: {redact(reason)}",
                         hint="check --db (postgresql+psycopg://USER@HOST/DB) and that the "
                              "server is up") from None
    factory = sessions(engine)
    try:
        store = open_store(cfg.store, cfg.home)
        store.ping()
    except StoreError as exc:
        raise UsageError(f"cannot use the store {redact(cfg.store or str(cfg.store_root))}: "
                         f"{exc}", hint="check --store (s3://BUCKET[/PREFIX]?endpoint=URL, "
                                        "credentials in the environment) and that the "
                                        "server is up") from None
    passphrase = (os.environ.get(cfg.passphrase_env, "").encode() or None
                  if cfg.passphrase_env else None)
    box = None
    if cfg.secrets_key is not None or os.environ.get("CERTIFY_SECRETS_KEY"):
        from certify.service.secrets import load_secret_box

        box = load_secret_box(cfg.secrets_key, cfg.home)
    ident = load_identity(factory, cfg.home, cfg.sign_key, passphrase, cfg.session_secret,
                          None if box is None else box.fingerprint, rotate_identity)
    public_pem = ident.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    limits = Limits(max_model_bytes=cfg.max_upload_mb * 2**20,
                    max_total_bytes=cfg.max_upload_mb * 2**20,
                    max_dataset_bytes=cfg.max_dataset_mb * 2**20,
                    allowed_domains=Limits().allowed_domains + tuple(cfg.allow_domains))
    cfg2 = dataclasses.replace(cfg, sign_key=ident.sign_key)
    from certify.service.secrets import migrate_url_credentials

    migrate_url_credentials(factory, box, store)
    return Services(cfg2, factory, store, TransparencyLog(factory, ident.private),
                    box, public_pem, ident.session_secret, limits,
                    spool_dir=cfg.scratch / "uploads")


def create_app(cfg: ServeConfig, services: Services | None = None,
               start_workers: bool = True, rotate_identity: bool = False) -> FastAPI:
    """The service's ASGI application."""
    svc = services or open_services(cfg, rotate_identity)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if start_workers and svc.cfg.workers > 0:
            from certify.service.workers import WorkerPool

            svc.workers = WorkerPool(svc.cfg, svc.factory, svc.store, svc.tlog, svc.secrets)
            svc.workers.start()
        janitor = asyncio.create_task(_janitor(svc))
        try:
            yield
        finally:
            janitor.cancel()
            if svc.workers is not None:
                await asyncio.to_thread(svc.workers.stop)

    app = FastAPI(title="certify service", version=__version__, lifespan=lifespan,
                  description="Robustness certification: submit a model, get a signed card.",
                  docs_url=None, redoc_url=None,
                  redirect_slashes=False)  # a path that is not an operation is a 404
    app.state.services = svc
    if svc.upload_limiter is None:
        svc.upload_limiter = RateLimiter(svc.cfg.token_uploads_per_hour, period=3600.0)
    from certify.service.metrics import Counters, CountResponses

    if svc.counters is None:
        svc.counters = Counters()
    _docs(app)
    limit = (2 * svc.cfg.max_upload_mb + svc.cfg.max_dataset_mb + 2) * 2**20
    verify_limit = (svc.cfg.max_verify_mb + 2) * 2**20  # the card, a signature, the form
    app.add_middleware(VerifyGate, svc=svc, limiter=RateLimiter(svc.cfg.verify_per_minute))
    app.add_middleware(BodyLimit, limit=limit,
                       paths={f"{API}/verify": verify_limit, "/verify": verify_limit})
    from certify.service.conn import AuthBeforeBody

    # outside BodyLimit: a caller without a token learns nothing, not even the size limit
    app.add_middleware(AuthBeforeBody, svc=svc)
    app.add_middleware(CountResponses, counters=svc.counters)  # outermost: counts them all

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        # one error shape for every refusal: {"detail": "..."} (as the document says)
        said = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
                         for e in exc.errors()[:5])
        return JSONResponse({"detail": said[:2000] or "invalid request"}, status_code=422)

    @app.exception_handler(CertifyError)
    async def _certify_error(_req: Request, exc: CertifyError) -> JSONResponse:
        status = int(getattr(exc, "status", 422))
        detail = exc.message + (f" (hint: {exc.hint})" if exc.hint else "")
        return JSONResponse({"detail": detail}, status_code=status)

    from certify.service.store import StoreError

    @app.exception_handler(StoreError)
    async def _store_error(_req: Request, exc: StoreError) -> JSONResponse:
        # the store is another server: its failure is this service's 503, never a traceback
        log.error("the store did not answer: %s", exc)
        return JSONResponse({"detail": "the service's store did not answer; retry"},
                            status_code=503, headers={"Retry-After": "5"})

    from certify.report.pades import certificate_path
    from certify.service.log_routes import log_router

    cert = None if svc.cfg.sign_key is None else certificate_path(svc.cfg.sign_key)
    app.include_router(log_router(lambda: svc.tlog, svc.public_pem,
                                  cert.read_bytes() if cert and cert.is_file() else None),
                       prefix=API)
    _api_routes(app, svc, start_workers)
    from certify.service.ui import ui_router

    app.include_router(ui_router(svc))
    from certify.service.answers import document

    document(app)  # each operation's answers and refusals in the OpenAPI document
    return app


async def _janitor(svc: Services) -> None:
    """Hourly: delete uploads whose retention period ended."""
    from certify.service import retention

    while True:
        try:
            await asyncio.to_thread(retention.expire, svc.factory, svc.store)
        except Exception:  # noqa: BLE001 - retention must not stop the service
            log.exception("retention pass failed")
        await asyncio.sleep(3600)


def _docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI served from the assets the fastapi-offline package ships, so the
    API's page works on machines without internet access (FastAPI's default loads it from a
    CDN)."""
    import fastapi_offline
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles

    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount("/docs-assets", StaticFiles(directory=assets), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="certify service API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon.png")


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes before reading them (413), and bodies of
    unstated length (411): uploads are spooled to disk as they arrive, so a limit checked only
    afterwards would let one request fill the disk."""

    def __init__(self, app: Any, limit: int, paths: dict[str, int] | None = None) -> None:
        self.app, self.limit, self.paths = app, limit, paths or {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:  # noqa: D102
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = dict(scope.get("headers") or [])
            length = headers.get(b"content-length")
            limit = self.paths.get(scope.get("path", ""), self.limit)
            status, detail = 0, ""
            if length is None:
                if b"chunked" in headers.get(b"transfer-encoding", b""):
                    status, detail = 411, "send the request with a Content-Length"
            elif not length.isdigit() or len(length) > 15 or int(length) > limit:
                status, detail = 413, (f"the request is larger than this service's limit of "
                                       f"{limit // 2**20} MB")
            if status:
                await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class VerifyGate:
    """Rate-limit card verification (API and UI) for callers without a valid token, per
    client address (:mod:`certify.service.ratelimit`), before the upload is read (429 with
    ``Retry-After``)."""

    PATHS = frozenset({f"{API}/verify", "/verify"})

    def __init__(self, app: Any, svc: Services, limiter: RateLimiter) -> None:
        self.app, self.svc, self.limiter = app, svc, limiter

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:  # noqa: D102
        if scope["type"] == "http" and scope["method"] == "POST" and \
                scope.get("path") in self.PATHS:
            request = Request(scope)
            if await asyncio.to_thread(principal_from, request, self.svc) is None:
                peer = scope["client"][0] if scope.get("client") else None
                who = client_address(peer, request.headers.get("x-forwarded-for"),
                                     self.svc.cfg.trusted_proxies)
                wait = self.limiter.take(who)
                if wait:
                    await JSONResponse(
                        {"detail": f"too many verifications from {who} without a token: at "
                                   f"most {self.limiter.per_minute} a minute"},
                        status_code=429, headers={"Retry-After": retry_after(wait)},
                    )(scope, receive, send)
                    return
        await self.app(scope, receive, send)


class ShareBody(BaseModel):
    """``POST /runs/{id}/share``: whether every token may read the run."""

    public: bool


#: The largest integer a request may carry (a database integer); larger ones are refused (422).
MAX_INT = 2**63 - 1

#: Route parameters: the caller, with at least this role.
Reader = Annotated[auth.Principal, Depends(require("read"))]
Submitter = Annotated[auth.Principal, Depends(require("submit"))]
#: A run id in a route's path: its format is stated in the API document (any other id is 404).
RunId = Annotated[str, PathParam(description=f"A run id: {RUN_ID_FORMAT}")]


def _api_routes(app: FastAPI, svc: Services,  # noqa: C901 - one place for the routes
                start_workers: bool = True) -> None:

    @app.get(f"{API}/health", tags=["service"])
    def health() -> dict[str, Any]:
        """Liveness: the database answers."""
        with svc.factory() as s:
            s.execute(select(1))
        return {"status": "ok", "version": __version__}

    @app.get(f"{API}/ready", tags=["service"])
    def ready() -> JSONResponse:
        """Readiness (distinct from liveness): the database and the store answer, the
        service is not shutting down, and its workers run (when it has any). 503 otherwise."""
        import time

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
        elif svc.cfg.workers > 0 and start_workers and svc.workers is None:
            why = "the workers have not started"
        if why is not None:
            return JSONResponse({"detail": why}, status_code=503)
        return JSONResponse({"status": "ready", "workers": svc.cfg.workers,
                             "store": svc.store.description.split("://", 1)[0]})

    @app.get("/metrics", tags=["service"], response_class=PlainTextResponse)
    def metrics(request: Request) -> PlainTextResponse:
        """The service's metrics (Prometheus text format): runs by state, queue depth, run
        durations, HTTP responses by status class, verifications, every worker's heartbeat
        age and slots, the store's latency. Needs an admin token, or a request from the
        loopback address (not through a --trusted-proxy)."""
        import ipaddress

        from certify.service.metrics import exposition

        who = principal_from(request, svc)
        # the socket's peer, in the spelling client_address gives addresses
        peer = client_address(request.client.host if request.client else None, None, ())
        # A peer that is a trusted proxy is never "this host", even on the loopback address
        # (a local reverse proxy): its client is elsewhere, whatever X-Forwarded-For says.
        via_proxy = peer in {client_address(p, None, ()) for p in svc.cfg.trusted_proxies}
        try:
            local = not via_proxy and ipaddress.ip_address(peer).is_loopback
        except ValueError:
            local = False
        if not local and (who is None or not who.allows("admin")):
            raise HTTPException(401 if who is None else 403,
                                "metrics need an admin token, or a request from this host")
        return PlainTextResponse(exposition(svc.factory, svc.counters, svc.store),
                                 media_type="text/plain; version=0.0.4")

    @app.post(f"{API}/runs", status_code=202, tags=["runs"])
    async def submit(
        request: Request,
        who: Submitter,
        model: Annotated[list[UploadFile] | None, File(
            description="The .onnx file, with its external-data files, or one archive")] = None,
        endpoint: Annotated[str | None, Form(description="An inference endpoint URL")] = None,
        endpoint_secret: Annotated[str | None, Form(
            description="Sent in endpoint_header; stored encrypted, never returned")] = None,
        endpoint_header: Annotated[str, Form()] = "Authorization",
        model_version: Annotated[str | None, Form(
            description="Model card: the version evaluated (an endpoint's: the version it "
                        "serves)")] = None,
        suite: Annotated[str | None, Form(description="A packaged suite name")] = None,
        suite_file: Annotated[UploadFile | None, File(description="A suite YAML")] = None,
        dataset: Annotated[str | None, Form(description="A registered dataset name")] = None,
        dataset_file: Annotated[UploadFile | None, File(description="An .npz (x, y)")] = None,
        reference: Annotated[UploadFile | None, File(
            description="A reference model (.onnx)")] = None,
        surrogate: Annotated[UploadFile | None, File(
            description="An endpoint's surrogate (.onnx): the white-box attacks take its "
                        "gradients and the endpoint judges every candidate")] = None,
        samples: Annotated[int | None, Form(ge=1, le=MAX_INT)] = None,
        seed: Annotated[int | None, Form(ge=0, le=MAX_INT)] = None,
        model_name: Annotated[str | None, Form(
            description="Model card: the model's name as its team calls it")] = None,
        owner: Annotated[str | None, Form(description="Model card: who ships the model")] = None,
        license: Annotated[str | None, Form(description="Model card: the model's license")
                           ] = None,
        intended_use: Annotated[str | None, Form(
            description="Model card: what the model is for (the card says 'not stated' "
                        "without it)")] = None,
        device: Annotated[str | None, Form(
            description="auto (default), cpu, or cuda: a cuda run waits for a worker with a "
                        "GPU")] = None,
    ) -> dict[str, Any]:
        """Submit a run: 202 with its id once the static checks pass."""
        from certify.service.submit_checks import accept_submission

        run = await accept_submission(
            svc, who, model=model or [], endpoint=endpoint, endpoint_secret=endpoint_secret,
            endpoint_header=endpoint_header, model_version=model_version, suite=suite,
            suite_file=suite_file, dataset=dataset, dataset_file=dataset_file,
            reference=reference, surrogate=surrogate, samples=samples, seed=seed,
            card={"model_name": model_name, "model_version": model_version, "owner": owner,
                  "license": license, "intended_use": intended_use}, device=device)
        log.info("run %s queued by token %d (%s)", run.id, who.token_id, run.model_name)
        return run_json(run)

    @app.get(f"{API}/runs", tags=["runs"])
    def list_runs(who: Reader, model: str | None = None,
                  suite: str | None = None, verdict: str | None = None,
                  state: str | None = None,
                  limit: Annotated[int, Query(ge=-MAX_INT, le=MAX_INT)] = 50,
                  offset: Annotated[int, Query(ge=-MAX_INT, le=MAX_INT)] = 0
                  ) -> dict[str, Any]:
        """The caller's runs (an admin's: every run), newest first, filtered by model name,
        suite, verdict or state."""
        q = runs_query(who, model, suite, verdict, state)
        limit = max(1, min(limit, 500))
        with svc.factory() as s:
            total = s.scalar(select(func.count()).select_from(q.subquery()))
            runs = s.scalars(q.order_by(Run.seq.desc()).limit(limit).offset(max(0, offset)))
            return {"total": total, "runs": [run_json(r) for r in runs]}

    @app.get(f"{API}/runs/{{run_id}}", tags=["runs"])
    def get_run(run_id: RunId, who: Reader) -> dict[str, Any]:
        """One run: state, progress per check, statuses, verdict (404 for another token's
        private run, as for a missing one)."""
        return run_json(find_run(svc, run_id, who))

    @app.get(f"{API}/runs/{{run_id}}/events", tags=["runs"])
    async def events(run_id: RunId, request: Request,
                     who: Reader) -> StreamingResponse:
        """Server-sent events: the run's state whenever it changes, until it ends."""
        find_run(svc, run_id, who)

        async def stream() -> AsyncIterator[bytes]:
            last = None
            while True:
                try:
                    run = await asyncio.to_thread(find_run, svc, run_id, who)
                except HTTPException:  # made private (or deleted) while followed
                    yield b"event: end\ndata: {}\n\n"
                    return
                doc = run_json(run)
                text = json.dumps(doc)
                if text != last:
                    last = text
                    yield f"event: run\ndata: {text}\n\n".encode()
                if run.state in FINAL_STATES:
                    yield b"event: end\ndata: {}\n\n"
                    return
                if svc.stopping.is_set():  # the run goes on after the restart: follow again
                    yield b"event: shutdown\ndata: {}\n\n"
                    return
                if await request.is_disconnected():
                    return
                await asyncio.sleep(0.5)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    @app.post(f"{API}/runs/{{run_id}}/share", tags=["sharing"])
    def share(run_id: RunId, body: ShareBody, who: Submitter) -> dict[str, Any]:
        """Make your run public (readable by every token) or private again (admins: any
        run)."""
        find_run(svc, run_id, who, own=True)
        return run_json(set_public(svc, run_id, body.public))

    @app.post(f"{API}/runs/{{run_id}}/links", tags=["sharing"], status_code=201)
    def create_link(run_id: RunId, request: Request, who: Submitter) -> dict[str, Any]:
        """A share link of your run: whoever holds the URL reads its card and results without
        a token, until the link is revoked. The URL is shown only here."""
        find_run(svc, run_id, who, own=True)
        link = new_share_link(svc, run_id, who)
        return {**link, "url": str(request.base_url).rstrip("/") + link["path"]}

    @app.get(f"{API}/runs/{{run_id}}/links", tags=["sharing"])
    def list_links(run_id: RunId, who: Submitter) -> dict[str, Any]:
        """Your run's share links (ids and dates: their URLs are not kept)."""
        find_run(svc, run_id, who, own=True)
        return {"links": share_links(svc, run_id)}

    @app.delete(f"{API}/runs/{{run_id}}/links", tags=["sharing"])
    def revoke_links(run_id: RunId, who: Submitter) -> dict[str, Any]:
        """Revoke every share link of your run."""
        find_run(svc, run_id, who, own=True)
        return {"revoked": revoke_share_links(svc, run_id)}

    @app.delete(f"{API}/runs/{{run_id}}/links/{{link_id}}", tags=["sharing"])
    def revoke_link(run_id: RunId, link_id: int, who: Submitter) -> dict[str, Any]:
        """Revoke one share link of your run."""
        find_run(svc, run_id, who, own=True)
        if not 1 <= link_id <= MAX_INT or not revoke_share_links(svc, run_id, link_id):
            raise HTTPException(404, f"no share link {link_id} of run {run_id}")
        return {"revoked": 1}

    @app.get(f"{API}/runs/{{run_id}}/{{name}}", tags=["runs"])
    def artefact(run_id: RunId, name: str, who: Reader) -> Response:
        """A finished run's card.html, card.pdf, results.json or results.json.sig, served
        once its stored results pass their signature check."""
        if name not in ARTEFACTS:
            raise HTTPException(404, f"no such file {name!r}; one of {', '.join(ARTEFACTS)}")
        return artefact_response(svc, find_run(svc, run_id, who), name)

    @app.post(f"{API}/runs/{{run_id}}/cancel", tags=["runs"])
    def cancel(run_id: RunId, who: Submitter) -> dict[str, Any]:
        """Cancel a queued or running run (your own, or any as admin)."""
        run = find_run(svc, run_id, who, own=True)
        if run.state in FINAL_STATES:
            raise HTTPException(409, f"run {run_id} already ended ({run.state})")
        with svc.factory() as s:
            queue.request_cancel(s, run_id)
        return run_json(find_run(svc, run_id, who, own=True))

    @app.get(f"{API}/runs/{{a}}/compare/{{b}}", tags=["runs"])
    def compare_runs(a: RunId, b: RunId, who: Reader,
                     tolerance: float | None = Query(None, ge=0, le=100)) -> dict[str, Any]:
        """``certify compare`` of two finished runs (a = old, b = new), from their stored
        results once these pass their signature check; the sides are named by run id.
        ``tolerance`` is the CLI's ``--tolerance``. Without --tolerance, the gate's tolerance
        is the smaller of OLD's and NEW's release_tolerance, a run whose results state none
        counting as certify's default of 2, so the release under test can narrow its gate but
        never widen it. (The rule: :data:`certify.tolerance.TOLERANCE_RULE`.)"""
        from certify.report.compare import NotComparable, compare
        from certify.results import OLDER_SCHEMAS, SCHEMA, parse_result

        runs = [find_run(svc, rid, who) for rid in (a, b)]  # both readable, before anything
        results = []
        for rid, run in zip((a, b), runs, strict=True):
            if run.state != "done":
                raise HTTPException(409, f"run {rid} is {run.state}, not done")
            doc = json.loads(verified_results(svc, run))
            readable = (SCHEMA, *OLDER_SCHEMAS)  # runs stored before an upgrade compare too
            if doc.get("schema") not in readable:
                raise NotComparable(f"incompatible certify schema: run {rid} is "
                                    f"{doc.get('schema')!r}, this service compares "
                                    f"{' and '.join(readable)}",
                                    hint="rerun the older release's suite with this certify")
            results.append(parse_result(doc, older=True))
        c = compare(results[0], results[1], tolerance)
        out = c.to_json()
        for side, rid in (("old", a), ("new", b)):  # run ids, never the server's paths
            out[side].pop("path", None)
            out[side]["run_id"] = rid
        return {**out, "exit_code": c.exit_code}

    @app.post(f"{API}/verify", tags=["verify"])
    async def verify(file: Annotated[UploadFile, File(description="card.html, card.pdf or "
                                                           "results.json")],
                     signature: Annotated[UploadFile | None, File(
                         description="results.json.sig, with a results.json")] = None,
                     ) -> dict[str, Any]:
        """Check a card against this service's key and log (public, for auditors)."""
        return await verify_upload(svc, file, signature)  # its child process does the work

    @app.delete(f"{API}/uploads/{{digest}}", tags=["uploads"])
    def delete_upload(digest: str, who: Submitter
                      ) -> dict[str, Any]:
        """Delete your record of an upload (an admin: every token's); refused while a live
        run of yours uses it. The stored file goes with its last record."""
        from certify.service import retention

        owner = None if who.allows("admin") else who.token_id
        with svc.factory() as s:
            q = select(Upload.token_id).where(Upload.digest == digest)
            if owner is not None:
                q = q.where(Upload.token_id == owner)
            # another token's upload answers as a missing one: no existence oracle
            if s.scalar(q.limit(1)) is None:
                raise HTTPException(404, f"no upload {digest[:80]!r} of this token")
        if not retention.delete_upload(svc.factory, svc.store, digest, owner):
            raise HTTPException(409, "a queued or running run uses this upload")
        return {"deleted": digest}



