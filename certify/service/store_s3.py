"""The service's objects in an S3-compatible object store (AWS S3, MinIO, Ceph RGW).

``--store s3://BUCKET[/PREFIX]?endpoint=URL&region=NAME`` (see :meth:`S3Store.from_url`): every
key is stored under ``PREFIX/`` in ``BUCKET``. Credentials come only from the environment and
boto3's default chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, an
instance role ...), never from the URL, so the URL can be logged and shown on ``/metrics``.

The store uses these S3 operations and no others, so a bucket policy may grant just them
(``s3:GetObject``, ``s3:PutObject``, ``s3:DeleteObject``, ``s3:ListBucket``,
``s3:AbortMultipartUpload``) on the prefix:

- PutObject (an object of at most one part, 8 MiB),
- CreateMultipartUpload, UploadPart, CompleteMultipartUpload, AbortMultipartUpload (larger
  objects, in parts of 8 MiB and more; an upload that fails is aborted, so no partial object
  ever appears),
- GetObject, HeadObject, DeleteObject,
- ListObjectsV2 (listing, and :meth:`S3Store.ping` with ``MaxKeys=1``: no HeadBucket),
- a presigned GET (:meth:`S3Store.download_url`; signed locally, no request).

Every body sent carries its Content-MD5, which every S3-compatible server checks; boto3's
newer default CRC32 checksums are asked for only where an operation requires them (older
MinIO and Ceph releases refuse them).
"""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, BinaryIO, NoReturn
from urllib.parse import parse_qsl, quote, urlsplit

from certify.service.store import NotInStore, StoreError, check_key, check_prefix

#: The size of one part of a multipart upload (S3's minimum is 5 MiB): an object up to this size
#: is one PutObject.
PART = 8 << 20
#: S3 allows at most this many parts per upload; the part size grows every 1000 parts
#: (8 MiB, then 16 MiB ...), so 10,000 parts hold about 440 GB.
_MAX_PARTS = 10_000
_MAX_PART = 5 << 30
#: The longest a presigned URL may live (S3's limit for SigV4).
MAX_EXPIRES_S = 7 * 24 * 3600
#: Seconds to open a connection / to wait for a response's next bytes.
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0
#: Attempts per request, the first included (standard retry mode: backoff with jitter).
ATTEMPTS = 4
#: The query parameters an ``s3://`` store URL may carry.
URL_PARAMS = ("endpoint", "region")
DEFAULT_REGION = "us-east-1"
ENDPOINT_ENV = "CERTIFY_S3_ENDPOINT"

# S3's bucket naming rules (the strict, DNS-compatible ones every server accepts)
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_REGION = re.compile(r"[a-z0-9-]{1,40}")
# what a Content-Type header may hold: printable ASCII, no CR/LF
_MEDIA_TYPE = re.compile(r"[!-~][ -~]{0,254}")
_MISSING = {"NoSuchKey", "404", "NotFound"}


def _boto() -> tuple[Any, Any, Any]:
    """boto3, botocore's Config and botocore's exceptions (StoreError where boto3 is
    missing)."""
    try:
        import boto3
        import botocore.exceptions
        from botocore.config import Config
    except ImportError:
        raise StoreError("the S3 store needs boto3: pip install 'certify[s3]'") from None
    return boto3, Config, botocore.exceptions


class _Body(io.RawIOBase):
    """A GetObject response body as a raw binary stream; read errors become StoreError."""

    def __init__(self, body: Any, key: str, errors: Any) -> None:
        super().__init__()
        self._body = body
        self._key = key
        self._errors = errors

    def readable(self) -> bool:  # noqa: D102
        return True

    def readinto(self, buffer: Any) -> int:  # noqa: D102
        view = memoryview(buffer).cast("B")
        try:
            data = self._body.read(len(view))
        except (self._errors.BotoCoreError, OSError) as exc:
            raise StoreError(f"the S3 store broke off reading {self._key}: "
                             f"{type(exc).__name__}") from None
        n = len(data)
        view[:n] = data
        return n

    def readall(self) -> bytes:  # noqa: D102 - in large reads, not io's 8 KiB default
        chunks: list[bytes] = []
        while True:
            chunk = self.read(1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    def close(self) -> None:  # noqa: D102
        if not self.closed:
            try:
                self._body.close()
            finally:
                super().close()


class S3Store:
    """Objects in one bucket of an S3-compatible store, under an optional key prefix.

    ``endpoint`` is the server's URL (MinIO, Ceph RGW, a test server; path-style addressing is
    then used); None means AWS S3 itself. Credentials come from boto3's default chain. One
    boto3 client serves every thread (boto3 clients are thread-safe).
    """

    def __init__(self, bucket: str, prefix: str = "", *, endpoint: str | None = None,
                 region: str = DEFAULT_REGION) -> None:
        boto3, config_cls, errors = _boto()
        if _BUCKET.fullmatch(bucket) is None or ".." in bucket:
            raise StoreError(f"not an S3 bucket name: {bucket[:80]!r}")
        if _REGION.fullmatch(region) is None:
            raise StoreError(f"not an S3 region: {region[:80]!r}")
        prefix = prefix.strip("/")
        if prefix:
            try:
                check_key(prefix)
            except ValueError:
                raise StoreError(f"not a key prefix: {prefix[:80]!r} (segments of "
                                 "A-Z a-z 0-9 . _ -)") from None
        if endpoint is not None:
            _check_endpoint(endpoint)
        self.bucket, self.prefix, self.endpoint, self.region = bucket, prefix, endpoint, region
        self._base = f"{prefix}/" if prefix else ""
        self._errors = errors

        query = "&".join(f"{k}={v}" for k, v in (("endpoint", endpoint), ("region", region))
                         if v is not None)
        self.description = f"s3://{bucket}{'/' + prefix if prefix else ''}?{query}"

        # botocore >= 1.36 adds CRC32 checksums by default; older releases know no such option
        checksums = {k: "when_required" for k in ("request_checksum_calculation",
                                                  "response_checksum_validation")
                     if k in getattr(config_cls, "OPTION_DEFAULTS", {})}

        def config(attempts: int, connect_s: float, read_s: float) -> Any:
            return config_cls(
                signature_version="s3v4", connect_timeout=connect_s, read_timeout=read_s,
                retries={"mode": "standard", "total_max_attempts": attempts},
                s3={"addressing_style": "path" if endpoint else "auto"}, **checksums)

        try:
            session = boto3.session.Session(region_name=region)
            self._client = session.client("s3", endpoint_url=endpoint,
                                          config=config(ATTEMPTS, CONNECT_TIMEOUT_S,
                                                        READ_TIMEOUT_S))
            # a health check answers at once: one attempt, short timeouts
            self._ping_client = session.client("s3", endpoint_url=endpoint,
                                               config=config(1, 2.0, 5.0))
        except errors.BotoCoreError as exc:
            raise StoreError(f"cannot set up the S3 client: {exc}") from None

    @classmethod
    def from_url(cls, url: str) -> S3Store:
        """The store ``s3://BUCKET[/PREFIX][?endpoint=URL][&region=NAME]`` names.

        ``endpoint`` defaults to the variable ``CERTIFY_S3_ENDPOINT`` (else AWS S3 itself),
        ``region`` to us-east-1. A URL with a user or password is refused: credentials come
        from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
        ``AWS_PROFILE`` ...).
        """
        parts = urlsplit(url)
        if parts.scheme != "s3":
            raise StoreError("an S3 store URL starts with s3://")
        if "@" in parts.netloc:
            raise StoreError(
                "the S3 store URL must not hold credentials (user:password@): set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the "
                "service's environment instead")
        if parts.fragment:
            raise StoreError("the S3 store URL has a #fragment: remove it")
        if not parts.netloc:
            raise StoreError("the S3 store URL names no bucket: s3://BUCKET[/PREFIX]")
        valid = ", ".join(URL_PARAMS)
        params: dict[str, str] = {}
        try:
            pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            if parts.query:
                raise StoreError(f"the S3 store URL's query is not NAME=VALUE&...: valid names "
                                 f"are {valid}") from None
            pairs = []
        for name, value in pairs:
            if name not in URL_PARAMS:
                raise StoreError(f"unknown parameter {name[:40]!r} in the S3 store URL: "
                                 f"valid ones are {valid}")
            if name in params:
                raise StoreError(f"the S3 store URL gives {name} twice")
            if not value:
                raise StoreError(f"the S3 store URL's {name} is empty")
            params[name] = value
        endpoint = params.get("endpoint") or os.environ.get(ENDPOINT_ENV) or None
        return cls(parts.netloc, parts.path, endpoint=endpoint,
                   region=params.get("region", DEFAULT_REGION))

    # ---- the Store protocol ------------------------------------------------------------------

    def put(self, key: str, stream: IO[bytes]) -> int:
        """Store the stream under ``key``: one PutObject up to 8 MiB, else a multipart upload
        that is aborted on any error (the stream's own errors propagate as they are)."""
        name = self._name(key)
        first = _read_part(stream, PART)
        second = _read_part(stream, PART) if len(first) == PART else b""
        if not second:
            with self._mapped("write", key):
                self._client.put_object(Bucket=self.bucket, Key=name, Body=first,
                                        ContentMD5=_md5(first))
            return len(first)
        with self._mapped("write", key):
            upload_id = self._client.create_multipart_upload(
                Bucket=self.bucket, Key=name)["UploadId"]
        try:
            size, done = 0, []
            parts = itertools.chain((first, second), _more_parts(stream, 3))
            for number, part in enumerate(parts, start=1):
                if number > _MAX_PARTS:
                    raise StoreError(f"{key} is too large for one S3 object")
                with self._mapped("write", key):
                    answer = self._client.upload_part(
                        Bucket=self.bucket, Key=name, UploadId=upload_id, PartNumber=number,
                        Body=part, ContentMD5=_md5(part))
                done.append({"ETag": answer["ETag"], "PartNumber": number})
                size += len(part)
            with self._mapped("write", key):
                self._client.complete_multipart_upload(
                    Bucket=self.bucket, Key=name, UploadId=upload_id,
                    MultipartUpload={"Parts": done})
        except BaseException:
            try:  # no partial object, and no parts left to pay for
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=name,
                                                    UploadId=upload_id)
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise
        return size

    def open(self, key: str) -> BinaryIO:
        """A buffered stream of the object (GetObject); NotInStore if there is none."""
        name = self._name(key)
        with self._mapped("read", key, missing=True):
            answer = self._client.get_object(Bucket=self.bucket, Key=name)
        return io.BufferedReader(_Body(answer["Body"], key, self._errors), buffer_size=1 << 20)

    def size(self, key: str) -> int | None:
        """The object's ContentLength (HeadObject), or None if there is none. (A HEAD answer
        has no body: a missing bucket reads as a missing object here; :meth:`ping` and the
        other methods tell them apart.)"""
        name = self._name(key)
        try:
            with self._mapped("look up", key, missing=True):
                answer = self._client.head_object(Bucket=self.bucket, Key=name)
        except NotInStore:
            return None
        return int(answer["ContentLength"])

    def list(self, prefix: str) -> list[str]:
        """The keys under ``prefix``, sorted (ListObjectsV2, every page). Objects whose names
        are not valid keys (a console's ``folder/`` marker) are left out."""
        check_prefix(prefix)
        keys = []
        with self._mapped("list", prefix or "the store"):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._base + prefix)
            for page in pages:
                for obj in page.get("Contents", ()):
                    key = obj["Key"][len(self._base):]
                    try:
                        keys.append(check_key(key))
                    except ValueError:
                        continue
        return sorted(keys)

    def delete(self, key: str) -> None:
        """Remove the object (DeleteObject; S3 answers the same where there is none)."""
        name = self._name(key)
        with self._mapped("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=name)

    def download_url(self, key: str, filename: str, media_type: str,
                     expires_s: int = 300) -> str | None:
        """A presigned GET of the object that serves it as ``media_type``, inline, named
        ``filename``, for ``expires_s`` seconds (1 s to 7 days)."""
        name = self._name(key)
        if not 1 <= expires_s <= MAX_EXPIRES_S:
            raise ValueError(f"expires_s must be 1 to {MAX_EXPIRES_S} s, not {expires_s}")
        if _MEDIA_TYPE.fullmatch(media_type) is None:
            raise ValueError(f"not a media type: {media_type[:80]!r}")
        with self._mapped("sign a download of", key):
            return str(self._client.generate_presigned_url(
                "get_object", ExpiresIn=expires_s,
                Params={"Bucket": self.bucket, "Key": name, "ResponseContentType": media_type,
                        "ResponseContentDisposition": _disposition(filename)}))

    def ping(self) -> None:
        """StoreError unless the bucket answers a one-key listing of the prefix (one attempt,
        short timeouts)."""
        with self._mapped("list", "the store"):
            self._ping_client.list_objects_v2(Bucket=self.bucket, Prefix=self._base,
                                              MaxKeys=1)

    # ---- internals ---------------------------------------------------------------------------

    def _name(self, key: str) -> str:
        return self._base + check_key(key)

    @contextmanager
    def _mapped(self, action: str, key: str, missing: bool = False) -> Iterator[None]:
        """Turn botocore's errors into StoreError (NotInStore for a missing object where
        ``missing``), with a message naming the store but no credential."""
        try:
            yield
        except self._errors.ClientError as exc:
            self._client_error(exc, action, key, missing)
        except self._errors.NoCredentialsError:
            raise StoreError("no S3 credentials: set AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment") from None
        except self._errors.PartialCredentialsError:
            raise StoreError("incomplete S3 credentials in the environment (an access key "
                             "without its secret, or the reverse)") from None
        except (self._errors.EndpointConnectionError, self._errors.ConnectTimeoutError):
            raise StoreError(f"cannot reach the S3 store at {self._where()} "
                             f"(could not {action} {key})") from None
        except self._errors.ReadTimeoutError:
            raise StoreError(f"the S3 store at {self._where()} did not answer in "
                             f"{READ_TIMEOUT_S:g} s (could not {action} {key})") from None
        except self._errors.BotoCoreError as exc:
            from certify.redact import redact

            raise StoreError(f"the S3 store could not {action} {key}: {type(exc).__name__}: "
                             f"{redact(str(exc))[:300]}") from None

    def _client_error(self, exc: Any, action: str, key: str, missing: bool) -> NoReturn:
        from certify.redact import redact

        error = exc.response.get("Error", {})
        code = str(error.get("Code", "")) or "?"
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":  # a 404 too, but no missing object
            raise StoreError(f"the S3 bucket {self.bucket} does not exist at "
                             f"{self._where()}") from None
        if missing and (code in _MISSING or status == 404):
            raise NotInStore(f"{key} is not in the store") from None
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            raise StoreError(f"the S3 store refused to {action} {key} ({code}): check the "
                             "credentials in the environment and the bucket's policy") from None
        detail = redact(str(error.get("Message", "")))[:200]
        raise StoreError(f"the S3 store could not {action} {key}: {code} (HTTP {status})"
                         + (f": {detail}" if detail else "")) from None

    def _where(self) -> str:
        return self.endpoint or f"AWS S3 ({self.region})"


def _check_endpoint(endpoint: str) -> None:
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise StoreError(f"the S3 endpoint must be an http:// or https:// URL, not "
                         f"{endpoint[:80]!r}")
    if "@" in parts.netloc:
        raise StoreError("the S3 endpoint must not hold credentials (user:password@): set "
                         "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment")
    if parts.query or parts.fragment or parts.path not in ("", "/"):
        raise StoreError(f"the S3 endpoint is a server's URL (scheme://host[:port]), not "
                         f"{endpoint[:80]!r}")


def _part_size(number: int) -> int:
    """The size of part ``number`` (from 1): 8 MiB, doubled after 1000 parts, and so on."""
    return min(PART * (1 + (number - 1) // 1000), _MAX_PART)


def _more_parts(stream: IO[bytes], number: int) -> Iterator[bytes]:
    """The rest of ``stream`` as parts, the first of them numbered ``number``."""
    while part := _read_part(stream, _part_size(number)):
        yield part
        number += 1


def _read_part(stream: IO[bytes], size: int) -> bytes:
    """Up to ``size`` bytes of ``stream``, fewer only at its end (a read may return less)."""
    chunks, got = [], 0
    while got < size:
        chunk = stream.read(size - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def _disposition(filename: str) -> str:
    """``inline`` with an ASCII filename and its UTF-8 form (RFC 6266); nothing of the name
    can break out of the header."""
    ascii_name = re.sub(r"[^A-Za-z0-9._-]", "_", filename)[:200] or "download"
    return f"inline; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename[:200], safe='')}"
