"""Deleting uploads: by their owner or an admin, and when their retention period ends.

An upload is deleted with everything the service made from it (a suite's .yaml, a model's
folder), unless a queued or running run still needs it. Finished runs keep their cards and
results; only the inputs go.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from typing import Any

from sqlalchemy import select

from certify.service.db import QUEUED, RUNNING, Run, Upload, utcnow

log = logging.getLogger("certify.service")


def in_use(factory: Any, digest: str) -> bool:
    """Whether a queued or running run uses the upload ``digest``."""
    with factory() as s:
        for opts in s.scalars(select(Run.options).where(Run.state.in_((QUEUED, RUNNING)))):
            if digest in (opts or {}).get("uploads", []):
                return True
    return False


def delete_upload(factory: Any, store: Any, digest: str) -> bool:
    """Delete an upload and what was made from it; False if a live run uses it."""
    if in_use(factory, digest):
        return False
    with factory() as s:
        row = s.get(Upload, digest)
        paths = list(row.paths or []) if row is not None else []
        if row is not None:
            s.delete(row)
            s.commit()
        others = {p for r in s.scalars(select(Upload)) for p in (r.paths or [])}
    for rel in paths:
        if rel in others:  # the same suite or model folder came from another upload too
            continue
        target = (store.root / rel).resolve()
        if store.root.resolve() not in target.parents:
            continue
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
    with contextlib.suppress(FileNotFoundError):
        store.delete(digest)
    return True


def expire(factory: Any, store: Any) -> int:
    """Delete uploads whose retention period ended; returns how many went."""
    with factory() as s:
        due = list(s.scalars(select(Upload.digest).where(Upload.expires < utcnow())))
    n = sum(delete_upload(factory, store, d) for d in due)
    if n:
        log.info("retention: deleted %d expired uploads", n)
    return n
