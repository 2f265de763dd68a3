"""A submission's static checks, shared by the API and the web UI.

Everything here happens before the 202: token limits, the suite (packaged name, or uploaded YAML
parsed and validated), the dataset (registered name, or an uploaded .npz checked without
unpickling), the model (uploaded ONNX files checked statically by
:mod:`certify.service.uploads`, or an endpoint URL checked against the allow-list), and the
options. Uploads are stored by content digest under names the service makes; no name a client
sends ever becomes a path outside the upload's own folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from fastapi import HTTPException
from sqlalchemy import select, update
from sqlalchemy.orm import Session
from starlette.datastructures import UploadFile

from certify.errors import CertifyError
from certify.model_card import model_card_from
from certify.redact import has_credentials, redact
from certify.service import auth
from certify.service.db import QUEUED, RUNNING, Run, RunOptions, Token, Upload, utcnow
from certify.service.runids import new_run_id
from certify.service.shared import Services
from certify.service.store import Spooled

_T = TypeVar("_T")


@dataclass(frozen=True)
class RunRequest:
    """What a submission asks for (the API's form fields, or the web UI's): the model (its
    uploaded ``.onnx`` files, or an endpoint with its secret and the header it goes in), the
    suite (a packaged name or an uploaded YAML), the dataset (a registered name or an uploaded
    ``.npz``), a reference and an endpoint's surrogate model, the run's size, seed and device,
    and the model card's fields."""

    model: list[UploadFile] = field(default_factory=list)
    endpoint: str | None = None
    endpoint_secret: str | None = None
    endpoint_header: str = "Authorization"
    model_version: str | None = None
    suite: str | None = None
    suite_file: UploadFile | None = None
    dataset: str | None = None
    dataset_file: UploadFile | None = None
    reference: UploadFile | None = None
    surrogate: UploadFile | None = None
    samples: int | None = None
    seed: int | None = None
    card: dict[str, str | None] = field(default_factory=dict)
    device: str | None = None


def _hex(digest: str) -> str:
    return digest.split(":", 1)[1]


def _place(svc: Services, spooled: Spooled, key: str) -> None:
    """Store a spooled upload again under the key the service names it by (a suite's
    ``.yaml``, a dataset's ``.npz``); content-addressed, so an object already there is it."""
    if svc.store.size(key) == spooled.size:
        return
    with spooled.local.open("rb") as f:
        svc.store.put(key, f)


def _folder_digest(folder: Path) -> str:
    """sha256 over a model folder's file names and contents (its identity in the store)."""
    import hashlib

    from certify.onnx_files import sha256_file

    h = hashlib.sha256()
    for p in sorted(folder.iterdir()):
        h.update(f"{p.name}\0sha256:{sha256_file(p)}\n".encode())
    return h.hexdigest()


#: An upload is recorded as soon as it is stored, to expire after this long unless its
#: submission is accepted (then it is kept for the retention period): a refused submission's
#: files are deleted at once, and those of a submission the service crashed while checking
#: are swept by the janitor.
PENDING = dt.timedelta(hours=1)


def token_limits(s: Session, token_id: int) -> int | None:
    """Check a token's limits against its live runs: the query budget a new run may hold
    (None: unlimited); HTTPException 429 (or 403) when the token is at a limit.

    Live runs hold the budget they were given until they end and are charged what they spent
    (in the same transaction: :func:`certify.service.queue.finish`), so runs at once never
    spend more than the token's budget. Read alone this is only a snapshot; :func:`admit`
    reads it under the token's row lock.
    """
    tok = s.scalar(select(Token).where(Token.id == token_id)
                   .execution_options(populate_existing=True))
    if tok is None:
        raise HTTPException(401, "this token no longer exists")
    live = list(s.scalars(select(Run.options).where(
        Run.token_id == tok.id, Run.state.in_((QUEUED, RUNNING)))))
    if len(live) >= tok.max_concurrent:
        raise HTTPException(429, f"this token already has {len(live)} runs queued or "
                                 f"running (its limit is {tok.max_concurrent})")
    if tok.query_budget is None:
        return None
    reserved = sum(int((o or {}).get("query_budget") or 0) for o in live)
    left = tok.query_budget - tok.queries_used - reserved
    if left <= 0:
        if reserved:
            raise HTTPException(429, f"the rest of this token's query budget is held "
                                     f"by its {len(live)} queued or running runs")
        raise HTTPException(403, f"this token's query budget of {tok.query_budget} "
                                 "model queries is spent")
    return left


def admit(s: Session, fields: dict[str, object]) -> dict[str, object]:
    """The token's limits, checked again inside the transaction that inserts its run
    (:func:`certify.service.queue.enqueue`): the check and the insert are one step.

    The token's row is updated first (to itself): that takes the row's lock on PostgreSQL and
    the database's write lock on SQLite, so concurrent submissions of one token queue here and
    each counts the runs the ones before it committed. The run holds the budget left now (the
    early check's figure may be stale).
    """
    token_id, options = fields["token_id"], fields["options"]
    if not isinstance(token_id, int) or not isinstance(options, dict):
        raise TypeError("a run's fields name its token and its options")
    s.execute(update(Token).where(Token.id == token_id)
              .values(max_concurrent=Token.max_concurrent))
    budget = token_limits(s, token_id)
    return {**fields, "options": {**options, "query_budget": budget}}


class _Submission:
    """Collects what a submission stored: each upload is recorded when it is stored, kept for
    the retention period once the submission is accepted, and deleted if it is refused."""

    def __init__(self, svc: Services, who: auth.Principal) -> None:
        self.svc, self.who = svc, who
        #: digest -> (kind, size, store paths made from it)
        self.uploads: dict[str, tuple[str, int, list[str]]] = {}
        #: uploads this submission recorded first (swept if it is refused)
        self.new: set[str] = set()
        #: node-local spooled copies of the uploads (the static checks read them)
        self.spooled: list[Path] = []

    def put(self, upload: UploadFile, limit: int, kind: str) -> Spooled:
        from certify.service.store import spool_upload

        self._quota_before()
        stored = spool_upload(self.svc.store, upload.file, limit, self.svc.spool_dir, kind)
        self.spooled.append(stored.local)
        self.uploads.setdefault(stored.digest, (kind, stored.size, []))
        self._record_pending(stored.digest, kind, stored.size)
        self._quota_after()
        return stored

    def _quota_before(self) -> None:
        """At most ``token_uploads_per_hour`` uploads an hour per token, refused ones
        included (429)."""
        from certify.service.ratelimit import retry_after

        limiter = self.svc.upload_limiter
        if limiter is None:
            return
        wait = limiter.take(f"token:{self.who.token_id}")
        if wait:
            raise HTTPException(429, f"this token sent more uploads in the last hour than the "
                                     f"service's limit of {limiter.per_minute}; retry later",
                                headers={"Retry-After": retry_after(wait)})

    def _quota_after(self) -> None:
        """At most ``token_storage_mb`` stored per token (its uploads not yet deleted)."""
        cap = self.svc.cfg.token_storage_mb * 2**20
        with self.svc.factory() as s:
            used = sum(s.scalars(select(Upload.size).where(
                Upload.token_id == self.who.token_id)))
        if used > cap:
            raise HTTPException(413, f"this token's uploads take {used / 2**20:.0f} MB, over "
                                     f"the service's limit of {cap // 2**20} MB per token",
                                )

    def _record_pending(self, digest: str, kind: str, size: int) -> None:
        """Record this token's upload of ``digest`` (pending until the submission is
        accepted). The file is stored once, but each token has its own record: whether another
        token sent the same bytes changes nothing this token sees or may do."""
        from sqlalchemy.exc import IntegrityError

        with self.svc.factory() as s:
            if s.get(Upload, (digest, self.who.token_id)) is not None:
                return
            s.add(Upload(digest=digest, kind=kind, size=size, created=utcnow(),
                         token_id=self.who.token_id, expires=utcnow() + PENDING, paths=[]))
            try:
                s.commit()
            except IntegrityError:  # recorded by a concurrent submission of the same file
                s.rollback()
                return
        self.new.add(digest)

    def sweep(self) -> None:
        """Delete what a refused submission stored and recorded first (with the paths made
        from it), unless a live run uses it."""
        from certify.service.retention import delete_upload

        for digest in sorted(self.new):
            with self.svc.factory() as s:
                row = s.get(Upload, (digest, self.who.token_id))
                if row is None:
                    continue
                row.paths = sorted(set(row.paths or []) | set(self.uploads[digest][2]))
                s.commit()
            with contextlib.suppress(Exception):  # a sweep must not hide the refusal
                delete_upload(self.svc.factory, self.svc.store, digest, self.who.token_id)

    def cleanup(self) -> None:
        """Delete the node-local spooled copies (the store keeps the uploads)."""
        for path in self.spooled:
            path.unlink(missing_ok=True)

    def made(self, digest: str, rel: str) -> None:
        """Record that ``rel`` (store-relative) was made from upload ``digest``."""
        paths = self.uploads[digest][2]
        if rel not in paths:
            paths.append(rel)

    def limits_for_token(self) -> int | None:
        """The early check of the token's limits (a fast refusal before any upload is read);
        :func:`admit` checks them again as the run is inserted, which is what holds."""
        with self.svc.factory() as s:
            return token_limits(s, self.who.token_id)

    def suite(self, name: str | None, file: UploadFile | None) -> tuple[str, str]:
        from certify.service.uploads import check_suite_yaml
        from certify.suite import packaged_suites

        if (name is None) == (file is None):
            raise HTTPException(422, "give a packaged suite name (suite) or a suite YAML "
                                     "(suite_file), not both and not neither")
        if name is not None:
            suites = packaged_suites()
            if name not in suites:
                raise HTTPException(422, f"unknown suite {name!r}; packaged suites: "
                                         f"{', '.join(sorted(suites))}")
            return name, name
        assert file is not None
        stored = self.put(file, self.svc.limits.max_suite_bytes, "suite")
        suite_name = check_suite_yaml(stored.local.read_bytes(), self.svc.limits)
        rel = f"suites/{_hex(stored.digest)}.yaml"
        _place(self.svc, stored, rel)
        self.made(stored.digest, rel)
        return f"store:{rel}", suite_name

    def dataset(self, name: str | None, file: UploadFile | None) -> str:
        from certify.service.uploads import check_npz

        if (name is None) == (file is None):
            raise HTTPException(422, "give a registered dataset name (dataset) or an .npz "
                                     "(dataset_file), not both and not neither")
        if name is not None:
            if name not in self.svc.cfg.datasets:
                known = ", ".join(sorted(self.svc.cfg.datasets)) or "none registered"
                raise HTTPException(422, f"unknown dataset {name!r} (registered: {known})")
            return name
        assert file is not None
        stored = self.put(file, self.svc.limits.max_dataset_bytes, "dataset")
        check_npz(stored.local, self.svc.limits)
        rel = f"datasets/{_hex(stored.digest)}.npz"
        _place(self.svc, stored, rel)
        self.made(stored.digest, rel)
        return f"store:{rel}"

    def onnx(self, files: list[UploadFile]) -> tuple[str, str]:
        """Store, lay out and statically check one model's files; (store path, name)."""
        import tempfile

        from certify.service.uploads import check_onnx, prepare_model

        total, named, digests = 0, [], []
        for f in files:
            stored = self.put(f, self.svc.limits.max_model_bytes, "model")
            digests.append(stored.digest)
            total += stored.size
            if total > self.svc.limits.max_total_bytes:
                raise HTTPException(413, "the model's files together exceed "
                                         f"{self.svc.limits.max_total_bytes // 2**20} MB")
            named.append((f.filename or "model.onnx", stored.local))
        self.svc.spool_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=self.svc.spool_dir))
        try:
            main = prepare_model(named, work / "m", self.svc.limits)
            check_onnx(main, self.svc.limits)
            rel = f"models/{_folder_digest(work / 'm')}"
            for p in sorted((work / "m").iterdir()):  # content-addressed: the same folder
                key = f"{rel}/{p.name}"
                if self.svc.store.size(key) != p.stat().st_size:
                    with p.open("rb") as fh:
                        self.svc.store.put(key, fh)
            for d in digests:
                self.made(d, rel)
            return f"{rel}/{main.name}", main.name.removesuffix(".onnx")
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def record_uploads(self) -> None:
        """Record this token's uploads (or extend its records) for the retention period:
        concurrent first uploads of the same file by this token race on (digest, token); the
        loser retries as an update."""
        from sqlalchemy.exc import IntegrityError

        expires = utcnow() + dt.timedelta(days=self.svc.cfg.retention_days)
        for _ in range(10):
            with self.svc.factory() as s:
                try:
                    for digest, (kind, size, paths) in self.uploads.items():
                        row = s.get(Upload, (digest, self.who.token_id))
                        if row is None:
                            s.add(Upload(digest=digest, kind=kind, size=size,
                                         created=utcnow(), token_id=self.who.token_id,
                                         expires=expires, paths=paths))
                        else:
                            row.expires = max(row.expires or expires, expires)
                            row.paths = sorted(set(row.paths or []) | set(paths))
                        s.flush()
                    s.commit()
                    return
                except IntegrityError:
                    s.rollback()
        raise HTTPException(503, "the upload could not be recorded; retry")


def _check(svc: Services, who: auth.Principal, req: RunRequest,
           then: Callable[[dict[str, object]], _T]) -> _T:
    """The submission's static checks, then ``then`` of the Run fields (the insert); a
    refused submission's uploads are deleted, whether the checks or the insert refused it."""
    sub = _Submission(svc, who)
    try:
        return then(_check_with(sub, svc, who, req))
    except BaseException:
        sub.sweep()
        raise
    finally:
        sub.cleanup()


def _check_with(sub: _Submission, svc: Services, who: auth.Principal, req: RunRequest
                ) -> dict[str, object]:
    """The Run fields of ``req``, once every static check passed (HTTPException else)."""
    budget = sub.limits_for_token()
    if req.samples is not None and req.samples > svc.cfg.max_samples:
        raise HTTPException(422, f"samples {req.samples} is over this service's limit of "
                                 f"{svc.cfg.max_samples}")
    if bool(req.model) == bool(req.endpoint):
        raise HTTPException(422, "give a model: upload its .onnx file(s) (model) or name an "
                                 "endpoint URL (endpoint), not both")
    suite_ref, suite_name = sub.suite(req.suite, req.suite_file)
    dataset_ref = sub.dataset(req.dataset, req.dataset_file)
    options = RunOptions(samples=req.samples, seed=req.seed, query_budget=budget)
    try:
        stated = model_card_from(**req.card)
    except CertifyError as exc:
        raise HTTPException(422, str(exc)) from None
    if stated is not None:
        options["model_card"] = stated.model_dump(exclude_none=True)
    if req.endpoint:
        _check_endpoint(svc, req)
        options["http"] = {"auth_header": req.endpoint_header, "version": req.model_version}
        # a credential in the URL is kept encrypted with the run, like a header secret
        kind, ref, name = "http", redact(req.endpoint), redact(req.endpoint)
    else:
        kind = "onnx"
        ref, name = sub.onnx(req.model)
    if req.device not in (None, "", "auto", "cpu", "cuda"):
        raise HTTPException(422, f"device must be auto, cpu or cuda, not "
                                 f"{str(req.device)[:20]!r}")
    if req.surrogate is not None and not req.endpoint:
        raise HTTPException(422, "a surrogate is for endpoints: an uploaded model is attacked "
                                 "through its own graph")
    if req.reference is not None:
        options["reference"], _ = sub.onnx([req.reference])
    if req.surrogate is not None:
        options["surrogate"], _ = sub.onnx([req.surrogate])
    options["uploads"] = sorted(sub.uploads)
    sub.record_uploads()
    return {"token_id": who.token_id, "model_kind": kind, "model_ref": ref,
            "model_name": name[:300], "suite": suite_ref, "suite_name": suite_name,
            "dataset": dataset_ref, "options": options,
            # a run that asks for a GPU waits for a worker that has one
            "device": req.device if req.device in ("cpu", "cuda") else None}


def _check_endpoint(svc: Services, req: RunRequest) -> None:
    """An endpoint's URL on the allow-list, its secret storable, its header a plain name."""
    from certify.service.endpoints import EndpointRefused, check_endpoint

    assert req.endpoint is not None
    try:
        check_endpoint(req.endpoint, tuple(svc.cfg.allow_endpoints))
    except EndpointRefused as exc:
        raise HTTPException(422, f"endpoint refused: {exc}") from None
    if (req.endpoint_secret or has_credentials(req.endpoint)) and svc.secrets is None:
        raise HTTPException(422, "this service stores no endpoint secrets (a header "
                                 "secret, or a credential in the URL): its operator has "
                                 "not given it a secrets key (--secrets-key)")
    if not req.endpoint_header or any(c in req.endpoint_header for c in "\r\n:"):
        raise HTTPException(422, "endpoint_header must be a plain header name")


async def validate_submission(svc: Services, who: auth.Principal, req: RunRequest
                              ) -> dict[str, object]:
    """Check a submission statically; the Run fields to enqueue (HTTPException otherwise)."""
    return await _checked(svc, who, req, dict)


async def _checked(svc: Services, who: auth.Principal, req: RunRequest,
                   then: Callable[[dict[str, object]], _T]) -> _T:
    try:
        return await asyncio.to_thread(_check, svc, who, req, then)
    except CertifyError as exc:
        status = int(getattr(exc, "status", 422))
        detail = exc.message + (f" (hint: {exc.hint})" if exc.hint else "")
        raise HTTPException(status, detail) from None


async def accept_submission(svc: Services, who: auth.Principal, req: RunRequest) -> Run:
    """Check a submission and queue it (its endpoint secret encrypted); returns the Run.

    The token's limits are checked twice: early, as a fast refusal before any upload is read,
    and again in the transaction that inserts the run (:func:`admit`), which is what holds
    under concurrent submissions. The secret is encrypted before the insert (with the run's
    id), so the run is never claimable without it.
    """
    from certify.service import queue
    from certify.service.secrets import pack

    header, url = req.endpoint_secret, req.endpoint
    url = url if url and has_credentials(url) else None

    def enqueue(fields: dict[str, object]) -> Run:
        run_id = new_run_id()
        if header or url:
            assert svc.secrets is not None  # checked: a secret needs the secrets key
            fields = {**fields, "secret_enc": svc.secrets.encrypt(pack(header, url), run_id)}
        with svc.factory() as s:
            return queue.enqueue(s, admit=admit, run_id=run_id, **fields)

    return await _checked(svc, who, req, enqueue)
