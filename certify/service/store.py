"""Where the service keeps what is not in its database: one :class:`Store` protocol, two stores.

Uploads (by content digest), the suites, datasets and model folders made from them, and each
run's folder (its records as numbered segments, its card, results and signature) are *objects*
named by keys such as ``runs/<run id>/out/card.pdf``. No local path crosses the protocol: a
caller names a key and hands over or receives a stream, so the API, the workers and
``certify store migrate`` work the same on the local folder (:class:`LocalStore`, the default,
``home/store``) and on an S3-compatible object store (:class:`certify.service.store_s3.S3Store`).

Keys are ``/``-separated segments of ``[A-Za-z0-9._+-]`` that do not start with a dot (the
characters of the file names the service makes, :func:`certify.service.uploads.safe_name`),
checked by :func:`check_key` in every store, so a key can never name something outside the
store. A client's file name never becomes a key; uploads are named by their sha256.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, Protocol, runtime_checkable

from certify.service.private import make_private_dir
from certify.service.runids import is_run_id

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
#: A key's segment; one that starts with a dot is refused (the local store's own temporary
#: files start with one, and are never listed).
_SEGMENT = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]*")
CHUNK = 1 << 20


class StoreError(Exception):
    """The store could not do what was asked (unreachable, refused, a bad key)."""


class NotInStore(StoreError, KeyError):
    """No object has this key."""

    def __str__(self) -> str:  # KeyError quotes its argument
        return str(self.args[0]) if self.args else "not in the store"


def check_key(key: str) -> str:
    """``key`` if it is a valid object key (ValueError otherwise)."""
    parts = key.split("/")
    if not key or len(key) > 512 or any(_SEGMENT.fullmatch(p) is None for p in parts):
        raise ValueError(f"not a store key: {key[:80]!r}")
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a key, optionally ending in ``/``."""
    if prefix:
        check_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


@runtime_checkable
class Store(Protocol):
    """Objects by key. Every method may raise :class:`StoreError`; none takes or returns a
    local path."""

    #: Where the store is, for logs and ``/metrics`` (no credential in it).
    description: str

    def put(self, key: str, stream: IO[bytes]) -> int:
        """Store everything ``stream`` yields under ``key`` (replacing an object there);
        returns the number of bytes. The object appears whole or not at all."""
        ...

    def open(self, key: str) -> BinaryIO:
        """A readable stream of the object (:class:`NotInStore` if there is none); the caller
        closes it."""
        ...

    def size(self, key: str) -> int | None:
        """The object's size in bytes, or None if there is none."""
        ...

    def list(self, prefix: str) -> list[str]:
        """The keys that start with ``prefix``, sorted."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object (nothing happens if there is none)."""
        ...

    def download_url(self, key: str, filename: str, media_type: str,
                     expires_s: int = 300) -> str | None:
        """A URL that serves the object for ``expires_s`` seconds without other credentials
        (a presigned GET), or None where the store has none (the API then streams it)."""
        ...

    def ping(self) -> None:
        """Raise :class:`StoreError` unless the store answers."""
        ...


# ---- helpers over the protocol ---------------------------------------------------------------

def put_bytes(store: Store, key: str, data: bytes) -> int:
    """Store ``data`` under ``key``."""
    import io

    return store.put(key, io.BytesIO(data))


def read_bytes(store: Store, key: str, limit: int | None = None) -> bytes:
    """The object's bytes (:class:`NotInStore` if missing; :class:`StoreError` beyond
    ``limit``)."""
    with store.open(key) as f:
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise StoreError(f"{key} is larger than {limit} bytes")
    return data


def iter_chunks(store: Store, key: str, chunk: int = CHUNK) -> Iterator[bytes]:
    """The object in chunks (for a streamed HTTP response)."""
    with store.open(key) as f:
        while block := f.read(chunk):
            yield block


def delete_prefix(store: Store, prefix: str) -> int:
    """Delete every object under the "folder" ``prefix``; returns how many went."""
    keys = store.list(prefix.rstrip("/") + "/")
    for key in keys:
        store.delete(key)
    return len(keys)


def fetch_tree(store: Store, prefix: str, dest: Path) -> list[Path]:
    """Copy every object under ``prefix/`` into the local folder ``dest`` (keys below the
    prefix become relative paths); returns the files written. The local side of a worker."""
    prefix = prefix.rstrip("/") + "/"
    written = []
    for key in store.list(prefix):
        target = dest / key[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        fetch_file(store, key, target)
        written.append(target)
    return written


def fetch_file(store: Store, key: str, dest: Path) -> Path:
    """Copy one object into the local file ``dest`` (written whole, then renamed)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as out, store.open(key) as src:
            shutil.copyfileobj(src, out, CHUNK)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return dest


def digest_key(digest: str) -> str:
    """The key of the upload ``digest`` (ValueError for anything but ``sha256:<64 hex>``)."""
    m = _DIGEST.fullmatch(digest)
    if m is None:
        raise ValueError(f"not a sha256 digest: {digest[:80]!r}")
    h = m.group(1)
    return f"blobs/sha256/{h[:2]}/{h}"


def run_prefix(run_id: str) -> str:
    """The key prefix of run ``run_id``'s folder (a 32-hex id; ValueError otherwise)."""
    if not is_run_id(run_id):
        raise ValueError(f"not a run id: {run_id[:80]!r}")
    return f"runs/{run_id}"


@dataclass(frozen=True)
class Spooled:
    """An upload as received: its digest and size, and a node-local spooled copy that the
    submission's static checks read (deleted when the request ends). The stored object is at
    ``key``."""

    digest: str
    size: int
    key: str
    local: Path


def spool_upload(store: Store, stream: BinaryIO, limit: int, spool_dir: Path,
                 kind: str = "upload") -> Spooled:
    """Read at most ``limit`` bytes of ``stream`` into a local spool file, hashing on the way
    (UploadError 413 beyond it), then store it under its digest's key. An oversized or
    interrupted upload leaves nothing behind, locally or in the store. The caller deletes
    ``Spooled.local``."""
    from certify.service.uploads import UploadError

    spool_dir.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(dir=spool_dir, prefix="up-")
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
        key = digest_key(digest)
        if store.size(key) != size:  # content-addressed: the same bytes are stored once
            with tmp.open("rb") as f:
                store.put(key, f)
        return Spooled(digest, size, key, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ---- the local folder -----------------------------------------------------------------------

class LocalStore:
    """Objects as files under one local folder (``home/store``): the single-machine default.

    A put writes a temporary file in the object's folder and renames it into place, so a
    reader never sees a partial object. Folders left empty by deletes are removed.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        try:
            make_private_dir(root)  # a store folder outside the home is private too
        except OSError as exc:
            raise StoreError(f"cannot use the store folder: {exc.strerror}") from None
        self.description = f"file://{root.resolve()}"

    def _file(self, key: str) -> Path:
        return self._root / check_key(key)

    def put(self, key: str, stream: IO[bytes]) -> int:  # noqa: D102
        target = self._file(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".put-")
        except OSError as exc:
            raise StoreError(f"cannot write {key}: {exc.strerror}") from None
        size = 0
        try:
            with os.fdopen(fd, "wb") as out:
                while block := stream.read(CHUNK):
                    out.write(block)
                    size += len(block)
            os.replace(tmp, target)
        except OSError as exc:
            raise StoreError(f"cannot write {key}: {exc.strerror}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return size

    def open(self, key: str) -> BinaryIO:  # noqa: D102
        try:
            return self._file(key).open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotInStore(f"{key} is not in the store") from None
        except OSError as exc:
            raise StoreError(f"cannot read {key}: {exc.strerror}") from None

    def size(self, key: str) -> int | None:  # noqa: D102
        import stat

        try:
            st = self._file(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def list(self, prefix: str) -> list[str]:  # noqa: D102
        check_prefix(prefix)
        # walk only the folder the prefix names (its last segment may be partial)
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self._root / base if base else self._root
        keys = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel = os.path.relpath(dirpath, self._root)
            for name in filenames:
                if name.startswith("."):  # a put in progress
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:  # noqa: D102
        target = self._file(key)
        try:
            target.unlink()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return
        except OSError as exc:
            raise StoreError(f"cannot delete {key}: {exc.strerror}") from None
        parent = target.parent
        while parent != self._root:  # drop folders the delete left empty
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def download_url(self, key: str, filename: str, media_type: str,  # noqa: D102
                     expires_s: int = 300) -> str | None:
        check_key(key)
        return None

    def ping(self) -> None:  # noqa: D102
        if not os.access(self._root, os.W_OK | os.X_OK):
            raise StoreError("the store folder is not writable")
