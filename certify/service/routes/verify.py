"""Verifying a card against this service's key and log (``POST /verify``): public, for
auditors; rate-limited per address for callers without a token
(:class:`certify.service.conn.VerifyGate`), and done in a bounded child process
(:mod:`certify.service.verify_sandbox`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, UploadFile

from certify.service.routes.deps import Svc
from certify.service.shared import API, verify_upload

router = APIRouter(tags=["verify"])


@router.post(f"{API}/verify")
async def verify(svc: Svc,
                 file: Annotated[UploadFile, File(description="card.html, card.pdf or "
                                                              "results.json")],
                 signature: Annotated[UploadFile | None, File(
                     description="results.json.sig, with a results.json")] = None,
                 ) -> dict[str, object]:
    """Check a card against this service's key and log (public, for auditors)."""
    return await verify_upload(svc, file, signature)  # its child process does the work
