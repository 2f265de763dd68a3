"""What the HTTP API (:mod:`certify.service.app`) and the web UI (:mod:`certify.service.ui`)
share: the routes' services, the caller's identity, runs as JSON and queries, card checks.

Both edges import this module; neither imports the other's internals.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import HTTPException, Request, UploadFile
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from certify.service import auth
from certify.service.config import ServeConfig
from certify.service.db import Run, Token, utcnow

API = "/api/v1"
SESSION_COOKIE = "certify_session"
#: Files of a finished run that may be downloaded, and their media types.
ARTEFACTS = {"card.html": "text/html; charset=utf-8", "card.pdf": "application/pdf",
             "results.json": "application/json", "results.json.sig": "application/json"}


@dataclass
class Services:
    """What the routes share: configuration, database, store, log, keys, workers."""

    cfg: ServeConfig
    factory: sessionmaker[Any]
    store: Any  # certify.service.store.Store
    tlog: Any  # certify.service.tlog.TransparencyLog
    secrets: Any  # certify.service.secrets.SecretBox | None
    public_pem: bytes
    session_key: bytes
    limits: Any  # certify.service.uploads.Limits
    workers: Any = None  # certify.service.workers.WorkerPool
    #: set when the service begins to shut down (see :func:`begin_shutdown`)
    stopping: threading.Event = field(default_factory=threading.Event)
    #: uploads an hour per token (``--token-uploads-per-hour``; refused ones count too)
    upload_limiter: Any = None  # certify.service.ratelimit.RateLimiter
    #: what ``GET /metrics`` counts in this process
    counters: Any = None  # certify.service.metrics.Counters


def begin_shutdown(svc: Services) -> None:
    """The first step of a shutdown (SIGTERM, SIGINT): claim no more runs and end every event
    stream, so that no follower holds the server open; the running runs go back on the queue
    when the workers stop (the app's lifespan)."""
    svc.stopping.set()
    if svc.workers is not None:
        svc.workers.stop_claiming()


# --- authentication -----------------------------------------------------------------------

def principal_from(request: Request, svc: Services, cookie_ok: bool = True
                   ) -> auth.Principal | None:
    """The caller: a bearer token, or (where ``cookie_ok``) the web UI's session cookie."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        with svc.factory() as s:
            return auth.authenticate(s, header[7:].strip())
    cookie = request.cookies.get(SESSION_COOKIE) if cookie_ok else None
    if cookie:
        from certify.service.sessions import read_session

        tid = read_session(cookie, svc.session_key)
        if tid is not None:
            with svc.factory() as s:
                row = s.get(Token, tid)
                if row is not None and not row.revoked and (
                        row.expires is None or row.expires > utcnow()):
                    return auth.Principal(row.id, row.name, row.role)
    return None


def require(role: str) -> Callable[[Request], auth.Principal]:
    """A dependency: the caller, who must hold ``role`` (401 without a token, 403 below it).

    The API takes the web UI's session cookie for reading only: a change (POST, DELETE) needs
    a bearer token, since the cookie alone would let another site's page make it (CSRF; the
    UI's own forms carry a CSRF token)."""

    def dep(request: Request) -> auth.Principal:
        safe = request.method in ("GET", "HEAD", "OPTIONS")
        who = principal_from(request, request.app.state.services, cookie_ok=safe)
        if who is None:
            raise HTTPException(401, "a valid API token is required (Authorization: Bearer "
                                     "<token>); it is missing, unknown, revoked or expired",
                                headers={"WWW-Authenticate": "Bearer"})
        if not who.allows(role):
            raise HTTPException(403, f"this token's role {who.role!r} may not do this "
                                     f"(needs {role!r})")
        return who

    return dep


# --- runs ---------------------------------------------------------------------------------

def run_json(run: Run) -> dict[str, Any]:
    """A run as the API shows it (never its secret)."""
    links = {"self": f"{API}/runs/{run.id}", "events": f"{API}/runs/{run.id}/events"}
    if run.state == "done":
        written = (run.progress or {}).get("files")  # absent: a run from before it was kept
        links.update({name: f"{API}/runs/{run.id}/{name}" for name in ARTEFACTS
                      if written is None or name in written})
    return {
        "id": run.id, "state": run.state, "model": run.model_name, "model_kind": run.model_kind,
        "suite": run.suite_name, "dataset": run.dataset if not run.dataset.startswith("store:")
        else "uploaded", "options": {k: v for k, v in (run.options or {}).items()
                                     if k in ("samples", "seed")},
        "created": run.created.isoformat() + "Z", "updated": run.updated.isoformat() + "Z",
        "attempts": run.attempts, "progress": run.progress or {}, "verdict": run.verdict,
        "exit_code": run.exit_code, "error": run.error, "log_index": run.log_index,
        "links": links,
    }


def runs_query(model: str | None, suite: str | None, verdict: str | None,
               state: str | None = None) -> Any:
    """Runs filtered by model name (substring), suite, verdict and state (API and UI)."""
    q = select(Run)
    if model:
        q = q.where(Run.model_name.contains(model))
    if suite:
        q = q.where(Run.suite_name == suite)
    if verdict:
        q = q.where(Run.verdict == verdict.upper())
    if state:
        q = q.where(Run.state == state)
    return q


def find_run(svc: Services, run_id: str) -> Run:
    """The run ``run_id`` (404 for a malformed or unknown id)."""
    if not (len(run_id) == 32 and all(c in "0123456789abcdef" for c in run_id)):
        raise HTTPException(404, f"no run {run_id!r}")
    with svc.factory() as s:
        run = s.get(Run, run_id)
    if run is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return run


def verify_upload(svc: Services, file: UploadFile, signature: UploadFile | None
                  ) -> dict[str, Any]:
    """Verify an uploaded card (and detached signature) against the service's key."""
    try:
        out = _verify_upload(svc, file, signature)
    except HTTPException:
        if svc.counters is not None:
            svc.counters.verification("refused")
        raise
    if svc.counters is not None:
        svc.counters.verification("valid" if out["valid"] else "invalid")
    return out


def _verify_upload(svc: Services, file: UploadFile, signature: UploadFile | None
                   ) -> dict[str, Any]:
    from cryptography.hazmat.primitives import serialization

    from certify.errors import VerificationError
    from certify.report.sign import fingerprint, verify_file
    from certify.service.tlog import statement_digest

    name = Path(file.filename or "").name.lower()
    suffix = Path(name).suffix
    if suffix not in (".html", ".htm", ".pdf", ".json"):
        raise HTTPException(422, "upload card.html, card.pdf or results.json")
    key = serialization.load_pem_public_key(svc.public_pem)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"card{suffix}"
        copy_limited(file, path, svc.cfg.max_verify_mb * 2**20)
        if signature is not None:
            copy_limited(signature, Path(tmp) / f"card{suffix}.sig", 2**20)
        try:
            v = verify_file(path, key)  # type: ignore[arg-type]
        except VerificationError as exc:
            return {"valid": False, "reason": exc.message, "hint": exc.hint,
                    "service_key": fingerprint(key)}  # type: ignore[arg-type]
    digest = statement_digest(v.signature.signed)
    index = svc.tlog.lookup(digest)
    m = v.result.measurement
    service = (v.result.provenance.model_extra or {}).get("service") or {}
    run_id = service.get("run_id") if isinstance(service, dict) else None
    logged_run = svc.tlog.entry(index)["run_id"] if index is not None else None
    return {
        "valid": True, "key_fingerprint": v.signature.key_fingerprint,
        "statement_digest": digest, "log_index": index,
        "in_log": index is not None and (run_id is None or run_id == logged_run),
        "run_id": run_id, "log_run_id": logged_run,
        "visible": v.visible, "model": m.model.name, "suite": m.suite.name,
        "verdict": m.verdict, "checks": {c.id: c.status for c in m.checks},
    }


def copy_limited(upload: UploadFile, dest: Path, limit: int) -> None:
    """Write ``upload`` to ``dest``, refusing (413) more than ``limit`` bytes."""
    n = 0
    with dest.open("wb") as out:
        while chunk := upload.file.read(1 << 20):
            n += len(chunk)
            if n > limit:
                raise HTTPException(413, f"the upload exceeds {limit // 2**20} MB")
            out.write(chunk)
