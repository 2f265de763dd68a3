"""The HTTP API (``/api/v1``), mounted with the web UI and the transparency log's routes:
the service's state (:func:`open_services`) and the application that assembles the API's
routers, one per resource (:mod:`certify.service.routes`), and the web UI's pages
(:mod:`certify.service.ui`) behind the gates of :mod:`certify.service.conn`
(:func:`create_app`).

Only static validation happens before a submission's 202 (tokens and limits, suite parse, upload
sizes, the ONNX static checks, dataset name, endpoint allow-list); the model is loaded and
probed in the run's own process, whose refusals end the run ``error`` with the messages
``certify run`` prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import serialization
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from certify.errors import CertifyError
from certify.service.config import ServeConfig
from certify.service.metrics import Counters
from certify.service.ratelimit import RateLimiter
from certify.service.shared import API, Services
from certify.version import __version__

if TYPE_CHECKING:
    from certify.service.store import StoreError

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
    """The service's ASGI application: the API's routers (:mod:`certify.service.routes`), the
    web UI's (:mod:`certify.service.ui`), the gates every request passes before its body is
    read (:mod:`certify.service.conn`), and one error shape for every refusal."""
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
    app.state.start_workers = start_workers  # readiness waits for workers started here
    if svc.upload_limiter is None:
        svc.upload_limiter = RateLimiter(svc.cfg.token_uploads_per_hour, period=3600.0)
    if svc.counters is None:
        svc.counters = Counters()
    _docs(app)
    _gates(app, svc)
    _refusals(app)
    _routes(app, svc)
    return app


def _gates(app: FastAPI, svc: Services) -> None:
    """The middleware every request passes, outermost last: what it may send (its size, and
    for card verification without a token a rate), who sends it (before any body is read),
    and the count of every answer."""
    from certify.service.conn import AuthBeforeBody, BodyLimit, VerifyGate
    from certify.service.metrics import CountResponses

    assert svc.counters is not None
    limit = (2 * svc.cfg.max_upload_mb + svc.cfg.max_dataset_mb + 2) * 2**20
    verify_limit = (svc.cfg.max_verify_mb + 2) * 2**20  # the card, a signature, the form
    app.add_middleware(VerifyGate, svc=svc, limiter=RateLimiter(svc.cfg.verify_per_minute))
    app.add_middleware(BodyLimit, limit=limit,
                       paths={f"{API}/verify": verify_limit, "/verify": verify_limit})
    # outside BodyLimit: a caller without a token learns nothing, not even the size limit
    app.add_middleware(AuthBeforeBody, svc=svc)
    app.add_middleware(CountResponses, counters=svc.counters)  # outermost: counts them all


def _refusals(app: FastAPI) -> None:
    """One error shape for every refusal: ``{"detail": "..."}`` (as the document says)."""
    from certify.service.store import StoreError

    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(CertifyError)(_certify_error)
    app.exception_handler(StoreError)(_store_error)


async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
    said = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
                     for e in exc.errors()[:5])
    return JSONResponse({"detail": said[:2000] or "invalid request"}, status_code=422)


async def _certify_error(_req: Request, exc: CertifyError) -> JSONResponse:
    status = int(getattr(exc, "status", 422))
    detail = exc.message + (f" (hint: {exc.hint})" if exc.hint else "")
    return JSONResponse({"detail": detail}, status_code=status)


async def _store_error(_req: Request, exc: StoreError) -> JSONResponse:
    # the store is another server: its failure is this service's 503, never a traceback
    log.error("the store did not answer: %s", exc)
    return JSONResponse({"detail": "the service's store did not answer; retry"},
                        status_code=503, headers={"Retry-After": "5"})


def _routes(app: FastAPI, svc: Services) -> None:
    """The transparency log's routes, the API's (one router per resource, in their order:
    :data:`certify.service.routes.ROUTERS`), then the web UI's; each operation's answers and
    refusals in the OpenAPI document."""
    from certify.report.pades import certificate_path
    from certify.service.answers import document
    from certify.service.routes import ROUTERS
    from certify.service.routes.log import log_router
    from certify.service.ui import ui_router

    cert = None if svc.cfg.sign_key is None else certificate_path(svc.cfg.sign_key)
    app.include_router(log_router(lambda: svc.tlog, svc.public_pem,
                                  cert.read_bytes() if cert and cert.is_file() else None),
                       prefix=API)
    for router in ROUTERS:
        app.include_router(router)
    app.include_router(ui_router())
    document(app)  # each operation's answers and refusals in the OpenAPI document


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
