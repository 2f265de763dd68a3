"""Which store a ``--store`` URL names: the local folder (:class:`LocalStore`) or an
S3-compatible object store (:class:`certify.service.store_s3.S3Store`). Apart from both store
modules, so that neither imports the other's module back."""

from __future__ import annotations

from pathlib import Path

from certify.service.store import LocalStore, Store, StoreError
from certify.service.store_s3 import S3Store


def open_store(url: str | None, home: Path) -> Store:
    """The store a ``--store`` URL names: ``file:///PATH`` or a plain path (local), or
    ``s3://BUCKET[/PREFIX]`` with ``?endpoint=URL&region=NAME`` (credentials from the
    environment); None means ``home/store``."""
    from urllib.parse import urlsplit

    if url is None:
        return LocalStore(home / "store")
    from urllib.parse import unquote

    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        if parts.scheme and parts.netloc not in ("", "localhost"):
            raise StoreError(f"the store URL {url!r} names a host: a file store is a local "
                             "folder (file:///PATH)")
        path = unquote(parts.path) if parts.scheme else url
        if not path:
            raise StoreError(f"the store URL {url!r} names no folder")
        return LocalStore(Path(path))
    if parts.scheme == "s3":
        return S3Store.from_url(url)
    raise StoreError(f"unknown store URL scheme {parts.scheme!r}: use file:///PATH or "
                     "s3://BUCKET[/PREFIX]")
