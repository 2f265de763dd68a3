"""A token's uploads: ``DELETE /uploads/{digest}`` removes its record of one (the stored file
goes with the last record; uploads also expire, :mod:`certify.service.retention`)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from sqlalchemy import select

from certify.service.db import Upload
from certify.service.routes.deps import Submitter, Svc
from certify.service.shared import API

router = APIRouter(tags=["uploads"])


@router.delete(f"{API}/uploads/{{digest}}")
def delete_upload(svc: Svc, digest: str, who: Submitter) -> dict[str, object]:
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
