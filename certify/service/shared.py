"""What the HTTP API (:mod:`certify.service.app`) and the web UI (:mod:`certify.service.ui`)
share: the routes' services, the caller's identity, runs as JSON and queries, card checks.

Both edges import this module; neither imports the other's internals.
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from fastapi import HTTPException, Request, Response
from sqlalchemy import Select, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.datastructures import UploadFile

from certify.service import auth
from certify.service.config import ServeConfig
from certify.service.db import Run, Token, utcnow
from certify.service.runids import is_run_id

if TYPE_CHECKING:
    from certify.service.metrics import Counters
    from certify.service.ratelimit import RateLimiter
    from certify.service.secrets import SecretBox
    from certify.service.store import Store
    from certify.service.tlog import TransparencyLog
    from certify.service.uploads import Limits
    from certify.service.verify_sandbox import Gate
    from certify.service.workers import WorkerPool

log = logging.getLogger("certify.service")

API = "/api/v1"
SESSION_COOKIE = "certify_session"
#: Files of a finished run that may be downloaded, and their media types.
ARTEFACTS = {"card.html": "text/html; charset=utf-8", "card.pdf": "application/pdf",
             "results.json": "application/json", "results.json.sig": "application/json"}


@dataclass
class Services:
    """What the routes share: configuration, database, store, log, keys, workers."""

    cfg: ServeConfig
    factory: sessionmaker[Session]
    store: Store
    tlog: TransparencyLog
    secrets: SecretBox | None
    public_pem: bytes
    session_key: bytes
    limits: Limits
    #: node-local folder where uploads are spooled while their submission is checked
    spool_dir: Path = Path("/nonexistent")
    workers: WorkerPool | None = None
    #: set when the service begins to shut down (see :func:`begin_shutdown`)
    stopping: threading.Event = field(default_factory=threading.Event)
    #: uploads an hour per token (``--token-uploads-per-hour``; refused ones count too)
    upload_limiter: RateLimiter | None = None
    #: what ``GET /metrics`` counts in this process
    counters: Counters | None = None
    #: card verifications at once (``--verify-concurrency``), made at the first one
    verify_gate: Gate | None = None


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
        from certify.service.sessions import session_token

        with svc.factory() as s:
            tid = session_token(s, cookie)  # a row of the sessions table: ended at logout
            row = s.get(Token, tid) if tid is not None else None
            # the token is checked on every request: revoking it ends its sessions too
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

    # read by certify.service.conn.AuthBeforeBody, which checks it before a body is read
    setattr(dep, "required_role", role)  # noqa: B010 - a function's attribute, for mypy
    return dep


# --- runs ---------------------------------------------------------------------------------

def run_json(run: Run) -> dict[str, object]:
    """A run as the API shows it (never its secret)."""
    links = {"self": f"{API}/runs/{run.id}", "events": f"{API}/runs/{run.id}/events"}
    if run.state == "done":
        written = (run.progress or {}).get("files")  # absent: a run from before it was kept
        links.update({name: f"{API}/runs/{run.id}/{name}" for name in ARTEFACTS
                      if not isinstance(written, list) or name in written})
    return {
        "id": run.id, "state": run.state, "model": run.model_name, "model_kind": run.model_kind,
        "suite": run.suite_name, "dataset": run.dataset if not run.dataset.startswith("store:")
        else "uploaded", "options": {k: v for k, v in (run.options or {}).items()
                                     if k in ("samples", "seed")},
        "created": run.created.isoformat() + "Z", "updated": run.updated.isoformat() + "Z",
        "attempts": run.attempts, "progress": run.progress or {}, "verdict": run.verdict,
        "exit_code": run.exit_code, "error": run.error, "log_index": run.log_index,
        "public": bool(run.public), "device": run.device or "auto", "links": links,
    }


# --- tenants ------------------------------------------------------------------------------
# A token sees its own runs, runs made public, and (as an admin) every run; a run is changed
# (cancelled, shared) by its owner or an admin. Every other run answers exactly as a missing one
# does: its id reveals nothing. Share links read a run's files without a token.

def owns(who: auth.Principal, run: Run) -> bool:
    """Whether ``who`` may change ``run``: its submitter, or an admin."""
    return who.allows("admin") or (run.token_id is not None and run.token_id == who.token_id)


def can_read(who: auth.Principal, run: Run) -> bool:
    """Whether ``who`` may read ``run``: it owns it, or the run is public."""
    return owns(who, run) or bool(run.public)


def runs_query(who: auth.Principal, model: str | None, suite: str | None,
               verdict: str | None, state: str | None = None) -> Select[Run]:
    """``who``'s runs (an admin's: every run) filtered by model name (substring), suite,
    verdict and state (API and UI). Others' public runs are read by id, not listed."""
    q = select(Run)
    if not who.allows("admin"):
        q = q.where(Run.token_id == who.token_id)
    if model:
        q = q.where(Run.model_name.contains(model))
    if suite:
        q = q.where(Run.suite_name == suite)
    if verdict:
        q = q.where(Run.verdict == verdict.upper())
    if state:
        q = q.where(Run.state == state)
    return q


def find_run(svc: Services, run_id: str, who: auth.Principal, own: bool = False) -> Run:
    """The run ``run_id`` if ``who`` may read it (``own``: change it); otherwise 404, the same
    answer as for a malformed or unknown id, so that another tenant's ids reveal nothing."""
    missing = HTTPException(404, f"no run {run_id[:80]!r}" + (" of this token" if own else ""))
    if not is_run_id(run_id):
        raise missing
    with svc.factory() as s:
        run = s.get(Run, run_id)
    if run is None or not (owns(who, run) if own else can_read(who, run)):
        raise missing
    return run


def shared_run(svc: Services, secret: str) -> Run | None:
    """The run a share link's secret reads (None for an unknown or revoked link)."""
    import hashlib

    from certify.service.db import ShareLink

    if not (20 <= len(secret) <= 100 and secret.replace("-", "").replace("_", "").isalnum()):
        return None
    digest = hashlib.sha256(secret.encode("ascii")).hexdigest()
    with svc.factory() as s:
        link = s.scalar(select(ShareLink).where(ShareLink.secret_hash == digest))
        return s.get(Run, link.run_id) if link is not None else None


def verified_results(svc: Services, run: Run) -> bytes:
    """The stored ``results.json`` of a finished run, after checking it against its detached
    signature with the service's key. Stored results that fail (edited on disk, a missing or
    damaged signature) are logged and answer 500; nothing of them is served or compared."""
    import json

    from cryptography.hazmat.primitives import serialization

    from certify.canonical import canonical_json
    from certify.errors import VerificationError
    from certify.report.sign import Signature, verify
    from certify.service.store import NotInStore, StoreError, read_bytes

    out = out_key(run.id)
    try:
        try:
            raw = read_bytes(svc.store, f"{out}/results.json")
            sig = Signature.from_json(
                read_bytes(svc.store, f"{out}/results.json.sig", 1 << 16).decode("utf-8"),
                "results.json.sig")
        except NotInStore:
            raise OSError("missing") from None
        except StoreError as exc:
            log.error("run %s: the store did not answer: %s", run.id, exc)
            raise HTTPException(503, "the service's store did not answer; retry",
                                headers={"Retry-After": "5"}) from None
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise VerificationError("the results are not a JSON document")
        verify(doc, sig, serialization.load_pem_public_key(svc.public_pem))  # type: ignore[arg-type]
        if raw != canonical_json(doc):
            raise VerificationError("the results' bytes were reformatted after signing")
    except (OSError, ValueError, VerificationError) as exc:
        why = exc.message if isinstance(exc, VerificationError) else (
            "the file is missing or unreadable" if isinstance(exc, OSError)
            else "the file is not JSON")
        log.error("run %s: the stored results.json fails its signature with this service's "
                  "key (%s); refusing to serve or compare it", run.id, why)
        raise HTTPException(500, f"the stored results of run {run.id} fail their signature "
                                 f"check with this service's key ({why}): they changed after "
                                 "signing, so nothing of this run is served or compared "
                                 "(logged for the operator)") from None
    return raw


def artefact_response(svc: Services, run: Run, name: str) -> Response:
    """A finished run's file (API and share links): 404 for an unknown name, 409 before the
    run is done, and only once its stored results pass their signature check."""
    from fastapi.responses import RedirectResponse, StreamingResponse

    from certify.service.store import NotInStore, StoreError, iter_chunks

    if name not in ARTEFACTS:
        raise HTTPException(404, f"no such file {name[:80]!r}; one of {', '.join(ARTEFACTS)}")
    if run.state != "done":
        raise HTTPException(409, f"run {run.id} is {run.state}: its card exists once it is "
                                 "done")
    raw = verified_results(svc, run)
    headers = {"Content-Disposition": f'inline; filename="{name}"'}
    if name == "results.json":  # the very bytes that were checked
        return Response(raw, media_type=ARTEFACTS[name], headers=headers)
    key = f"{out_key(run.id)}/{name}"
    try:
        size = svc.store.size(key)
        if size is None:
            raise NotInStore(key)
        if svc.cfg.presigned_downloads:
            url = svc.store.download_url(key, name, ARTEFACTS[name])
            if url is not None:
                return RedirectResponse(url, status_code=307)
        chunks = iter_chunks(svc.store, key)
        first = next(chunks, b"")  # a store failure answers 503 here, not mid-stream
    except NotInStore:
        raise HTTPException(404, f"{name} is missing from run {run.id}") from None
    except StoreError as exc:
        log.error("run %s: the store did not answer: %s", run.id, exc)
        raise HTTPException(503, "the service's store did not answer; retry",
                            headers={"Retry-After": "5"}) from None

    def body() -> Iterator[bytes]:
        yield first
        yield from chunks

    return StreamingResponse(body(), media_type=ARTEFACTS[name],
                             headers={**headers, "Content-Length": str(size)})


def out_key(run_id: str) -> str:
    """The key prefix of a run's written files (its card, results and signature)."""
    from certify.service.job import OUT_DIR
    from certify.service.store import run_prefix

    return f"{run_prefix(run_id)}/{OUT_DIR}"


def set_public(svc: Services, run_id: str, public: bool) -> Run:
    """Make a run readable by every token, or private again."""
    with svc.factory() as s:
        run = s.get(Run, run_id)
        assert run is not None
        run.public = public
        s.commit()
        return run


class NewLink(TypedDict):
    """A share link just made: its id (to revoke it), its secret path, when."""

    id: int
    path: str
    created: str


class LinkInfo(TypedDict):
    """A share link as it is listed (its secret is not kept)."""

    id: int
    created: str


def new_share_link(svc: Services, run_id: str, who: auth.Principal) -> NewLink:
    """A new share link of a run: its id (to revoke it) and its secret path (shown only
    here; only the secret's sha256 is kept)."""
    import hashlib
    import secrets

    from certify.service.db import ShareLink

    secret = secrets.token_urlsafe(32)
    with svc.factory() as s:
        link = ShareLink(run_id=run_id, secret_hash=hashlib.sha256(secret.encode()).hexdigest(),
                         created=utcnow(), token_id=who.token_id)
        s.add(link)
        s.commit()
        return NewLink(id=link.id, path=f"/shared/{secret}",
                       created=link.created.isoformat() + "Z")


def share_links(svc: Services, run_id: str) -> list[LinkInfo]:
    """A run's share links (ids and dates; their secrets are not kept)."""
    from certify.service.db import ShareLink

    with svc.factory() as s:
        return [LinkInfo(id=x.id, created=x.created.isoformat() + "Z") for x in s.scalars(
            select(ShareLink).where(ShareLink.run_id == run_id).order_by(ShareLink.id))]


def revoke_share_links(svc: Services, run_id: str, link_id: int | None = None) -> int:
    """Revoke one share link of a run, or all of them; how many went."""
    from sqlalchemy import delete

    from certify.service.db import ShareLink, changed_rows

    q = delete(ShareLink).where(ShareLink.run_id == run_id)
    if link_id is not None:
        q = q.where(ShareLink.id == link_id)
    with svc.factory() as s:
        n = changed_rows(s, q)
        s.commit()
    return n


async def verify_upload(svc: Services, file: UploadFile, signature: UploadFile | None
                        ) -> dict[str, object]:
    """Verify an uploaded card (and detached signature) against the service's key.

    The card is verified in a child process with fixed limits, behind a concurrency limit
    (:mod:`certify.service.verify_sandbox`); this process only stores the upload and reads the
    child's answer. A card the limits stop is answered invalid, naming the limit; no free slot
    within ``--verify-wait`` seconds is a 503 with ``Retry-After``."""
    try:
        out = await _verify_upload(svc, file, signature)
    except HTTPException:
        if svc.counters is not None:
            svc.counters.verification("refused")
        raise
    if svc.counters is not None:
        state = out.get("state")
        svc.counters.verification(str(state) if state else
                                  "valid" if out["valid"] else "invalid")
    return out


#: What a card's uploaded name may be to be kept (anything else is called ``card<suffix>``).
_UPLOAD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._ -]{0,99}")


def upload_name(filename: str | None) -> str:
    """The name an uploaded card is verified under (messages name it): its own base name where
    that is plain, else ``card<suffix>``; 422 unless it is a card.html, card.pdf or
    results.json."""
    name = Path((filename or "").replace("\\", "/")).name
    suffix = Path(name.lower()).suffix
    if suffix not in (".html", ".htm", ".pdf", ".json"):
        raise HTTPException(422, "upload card.html, card.pdf or results.json")
    return name if _UPLOAD_NAME.fullmatch(name) else f"card{suffix}"


async def _verify_upload(svc: Services, file: UploadFile, signature: UploadFile | None
                         ) -> dict[str, object]:
    import asyncio
    import shutil
    import time

    from cryptography.hazmat.primitives import serialization

    from certify.report.sign import fingerprint
    from certify.service.ratelimit import retry_after
    from certify.service.verify_sandbox import (
        INBOX,
        Busy,
        Gate,
        Limits,
        VerifierUnavailable,
        limit_reason,
        verifier,
    )

    name = upload_name(file.filename)
    cfg = svc.cfg
    limits = Limits(memory_mb=cfg.verify_memory_mb, timeout_s=cfg.verify_timeout_s,
                    max_inflated_bytes=cfg.max_verify_mb * 2**20)
    if svc.verify_gate is None:
        svc.verify_gate = Gate(cfg.verify_concurrency, cfg.verify_wait_s)
    key_fp = fingerprint(serialization.load_pem_public_key(svc.public_pem))  # type: ignore[arg-type]
    later = {"Retry-After": retry_after(min(cfg.verify_timeout_s, 10.0))}
    folder = Path(tempfile.mkdtemp(prefix="certify-verify-"))
    try:
        async with svc.verify_gate.slot():
            await asyncio.to_thread(_stage, svc, file, signature, folder / INBOX, name)
            started = time.monotonic()
            outcome = await verifier().run(folder, name, svc.public_pem, limits)
            answer = await asyncio.to_thread(_answer, folder)
        log.info("verify %s: %s in %.2f s (child: peak RSS %d MB, CPU %.2f s)", name,
                 outcome.how if answer is None else
                 "valid" if answer.get("valid") else "invalid",
                 time.monotonic() - started, outcome.maxrss_kb // 1024, outcome.cpu_s)
    except Busy:  # no slot within --verify-wait
        raise HTTPException(503, f"this service is verifying {cfg.verify_concurrency} card(s) "
                                 "already; try again shortly", headers=later) from None
    except VerifierUnavailable as exc:
        log.error("card verification: %s", exc)
        raise HTTPException(503, "the card verifier is unavailable (the service's log says "
                                 "why); try again shortly",
                            headers=later) from None
    finally:
        await asyncio.to_thread(shutil.rmtree, folder, True)
    if answer is None:  # the limits (or a signal) ended the child before it answered
        limit = {"memory": "memory", "time": "time", "signal": "memory/time"}.get(outcome.how)
        return {"valid": False, "state": "invalid",
                "reason": f"{name}: {limit_reason(outcome, limits)}",
                "hint": "a card certify wrote verifies well within them; do not trust this "
                        "file" if limit else "try again; the service's log says what failed",
                "service_key": key_fp, "limit": limit}
    if not answer.get("valid"):
        return {"valid": False, "state": "invalid", "service_key": key_fp,
                "reason": _no_paths(str(answer.get("reason") or "invalid"), folder),
                "hint": _no_paths(str(answer.get("hint") or ""), folder) or None}
    return await asyncio.to_thread(_valid_answer, svc, answer)


def _stage(svc: Services, file: UploadFile, signature: UploadFile | None, inbox: Path,
           name: str) -> None:
    """Store the upload (and signature) for the child, within their size limits."""
    inbox.mkdir()
    copy_limited(file, inbox / name, svc.cfg.max_verify_mb * 2**20)
    if signature is not None:
        copy_limited(signature, inbox / f"{name}.sig", 2**20)


def _answer(folder: Path) -> dict[str, object] | None:
    """The child's answer, or None where it wrote none (its limits ended it)."""
    import json

    from certify.service.verify_sandbox import ANSWER, MAX_ANSWER_BYTES

    path = folder / ANSWER
    try:
        with path.open("rb") as f:
            data = f.read(MAX_ANSWER_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_ANSWER_BYTES:
        return None
    doc = json.loads(data)  # written by certify's own child: a flat, bounded document
    return doc if isinstance(doc, dict) else None


def _no_paths(text: str, folder: Path) -> str:
    """A message without the upload's private folder (the child names files relatively; this
    holds even where a library resolves a path)."""
    import os

    from certify.service.verify_sandbox import INBOX

    for base in {str(folder), os.path.realpath(folder)}:
        text = text.replace(f"{base}/{INBOX}/", "").replace(f"{base}/", "").replace(base, "")
    return text


#: What ``state`` says of a verified card (the API's and the page's one meaning of valid):
#: ``valid`` only where every layer was checked; a card whose signature and payload check out
#: but whose visible content could not be compared with them is ``visible_not_checked``, and
#: ``valid`` is then false (issue 50): what a reader sees may not be what was signed.
VERIFY_STATES = ("valid", "visible_not_checked", "invalid")


def _valid_answer(svc: Services, answer: dict[str, object]) -> dict[str, object]:
    """The answer for a card whose signature and payload check out, with where the
    transparency log has it: ``valid`` only where its visible layer was compared too."""
    from certify.service.tlog import statement_digest

    signed = answer.get("signed")
    signed = signed if isinstance(signed, dict) else {}
    digest = statement_digest(signed)
    index = svc.tlog.lookup(digest)
    run_id = answer.get("run_id")
    logged_run = svc.tlog.entry(index)["run_id"] if index is not None else None
    said = {k: v for k, v in answer.items() if k not in ("signed", "run_id", "valid")}
    checked = answer.get("visible_compared") is not False
    out = {
        "valid": checked, "state": "valid" if checked else "visible_not_checked",
        "signature_valid": True, "key_fingerprint": answer.get("key_fingerprint"),
        "statement_digest": digest, "log_index": index,
        "in_log": index is not None and (run_id is None or run_id == logged_run),
        "run_id": run_id, "log_run_id": logged_run, **said,
    }
    if not checked:
        out["reason"] = ("the signature and the signed payload are intact, but the card's "
                         "visible content was not compared with them "
                         f"({answer.get('visible') or 'no reason given'}): what a reader of "
                         "this file sees may not be what was signed")
        out["hint"] = ("trust the signed figures below, not the file's pages; verify the "
                       "card with the certify that rendered it, or its results.json")
    return out


def copy_limited(upload: UploadFile, dest: Path, limit: int) -> None:
    """Write ``upload`` to ``dest``, refusing (413) more than ``limit`` bytes (read at most
    ``limit`` + 1 of them)."""
    n = 0
    with dest.open("wb") as out:
        while chunk := upload.file.read(min(1 << 20, limit + 1 - n)):
            n += len(chunk)
            if n > limit:
                raise HTTPException(413, f"the upload exceeds {limit // 2**20} MB")
            out.write(chunk)
