"""Deleting uploads: by their owner or an admin, and when their retention period ends.

An upload is deleted with everything the service made from it (a suite's .yaml, a model's
folder), unless a queued or running run still needs it. Finished runs keep their cards and
results; only the inputs go. Each token's record of an upload goes on its own (its owner
deletes it, or its retention ends); the stored file goes with its last record.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from certify.service.db import QUEUED, RUNNING, Run, Upload, utcnow

if TYPE_CHECKING:
    from certify.service.store import Store

log = logging.getLogger("certify.service")


def in_use(factory: sessionmaker[Session], digest: str, token_id: int | None = None) -> bool:
    """Whether a queued or running run (of ``token_id``, when given) uses the upload
    ``digest``. Asked per token, another token's runs never show through."""
    q = select(Run.options).where(Run.state.in_((QUEUED, RUNNING)))
    if token_id is not None:
        q = q.where(Run.token_id == token_id)
    with factory() as s:
        for opts in s.scalars(q):
            if digest in (opts or {}).get("uploads", []):
                return True
    return False


def delete_upload(factory: sessionmaker[Session], store: Store, digest: str,
                  token_id: int | None = None) -> bool:
    """Delete ``token_id``'s record of an upload (``None``: every token's), and, with the
    upload's last record, the stored file and what was made from it; False if a live run (of
    that token) uses it."""
    if in_use(factory, digest, token_id):
        return False
    with factory() as s:
        q = select(Upload).where(Upload.digest == digest)
        if token_id is not None:
            q = q.where(Upload.token_id == token_id)
        rows = list(s.scalars(q))
        paths = {p for r in rows for p in (r.paths or [])}
        for row in rows:
            s.delete(row)
        s.commit()
        others = {p for r in s.scalars(select(Upload)) for p in (r.paths or [])}
        last = s.scalar(select(Upload.token_id).where(Upload.digest == digest).limit(1)) is None
    from certify.service.store import check_key, delete_prefix, digest_key

    for rel in sorted(paths):
        if rel in others:  # the same suite or model folder came from another record too
            continue
        try:
            check_key(rel)
        except ValueError:
            continue
        store.delete(rel)  # a suite's .yaml, a dataset's .npz
        delete_prefix(store, rel + "/")  # a model's folder
    if last:  # another token's record keeps the stored file
        with contextlib.suppress(ValueError):
            store.delete(digest_key(digest))
    return True


def expire(factory: sessionmaker[Session], store: Store) -> int:
    """Delete upload records whose retention period ended; returns how many went."""
    with factory() as s:
        due = list(s.execute(select(Upload.digest, Upload.token_id)
                             .where(Upload.expires < utcnow())))
    n = sum(delete_upload(factory, store, d, t) for d, t in due)
    if n:
        log.info("retention: deleted %d expired uploads", n)
    return n
