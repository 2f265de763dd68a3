"""Content-addressed storage of uploads, and the run folders, under one root.

Blobs live at ``blobs/sha256/<2 hex>/<64 hex>``; a client's file name never becomes a path.
An upload is streamed into ``tmp/`` with a byte limit, hashed on the way, and renamed into place
only when complete: an oversized or interrupted upload leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
CHUNK = 1 << 20


@dataclass(frozen=True)
class StoredFile:
    """A stored upload: its digest, size and path."""

    digest: str
    size: int
    path: Path


class Store:
    """The service's files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for sub in ("blobs", "tmp", "runs"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def path(self, digest: str) -> Path:
        """Where the blob ``digest`` lives (ValueError for anything but ``sha256:<64 hex>``)."""
        m = _DIGEST.match(digest)
        if m is None:
            raise ValueError(f"not a sha256 digest: {digest[:80]!r}")
        h = m.group(1)
        return self.root / "blobs" / "sha256" / h[:2] / h

    def put_stream(self, stream: BinaryIO, limit: int, kind: str = "upload") -> StoredFile:
        """Store at most ``limit`` bytes from ``stream`` (UploadError 413 beyond it)."""
        from certify.service.uploads import UploadError

        h = hashlib.sha256()
        size = 0
        fd, tmp_name = tempfile.mkstemp(dir=self.root / "tmp", prefix="up-")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := stream.read(CHUNK):
                    size += len(chunk)
                    if size > limit:
                        raise UploadError(f"the {kind} upload is larger than the service's "
                                          f"limit of {limit / 2**20:g} MB", status=413)
                    h.update(chunk)
                    out.write(chunk)
            digest = "sha256:" + h.hexdigest()
            dest = self.path(digest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
            return StoredFile(digest, size, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, digest: str) -> None:
        """Remove a blob (FileNotFoundError if it is not there)."""
        self.path(digest).unlink()

    def run_dir(self, run_id: str) -> Path:
        """The folder of run ``run_id`` (a 32-hex id; ValueError otherwise)."""
        if _RUN_ID.match(run_id) is None:
            raise ValueError(f"not a run id: {run_id[:80]!r}")
        return self.root / "runs" / run_id
