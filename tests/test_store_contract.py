"""The Store protocol's contract, run the same way on the local folder and on S3 (moto's server),
and ``certify store migrate`` between them."""

from __future__ import annotations

import hashlib
import io
import os
import sys
import time
import uuid
from pathlib import Path

import boto3
import pytest
import requests
from click.testing import CliRunner
from s3server import REGION
from service_fixture import free_port

from certify.errors import UsageError
from certify.service.store import (
    LocalStore,
    NotInStore,
    Store,
    StoreError,
    delete_prefix,
    digest_key,
    fetch_file,
    fetch_tree,
    iter_chunks,
    put_bytes,
    read_bytes,
    spool_upload,
)
from certify.service.store_cli import store as store_group
from certify.service.store_s3 import PART, S3Store
from certify.service.uploads import UploadError

pytestmark = [pytest.mark.e2e]

BUCKET = "certify-test"
BAD_KEYS = ["../x", "/abs", "a//b", "a/./b", "", "a b", "x/", "a/../b", "k\n"]


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> Store:
    """A fresh, empty store of each kind (S3: a prefix of its own on the session's server)."""
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    server = request.getfixturevalue("s3_server")
    return S3Store.from_url(server.url(BUCKET, f"t-{uuid.uuid4().hex[:12]}"))


def s3_client(s: S3Store):
    """A plain boto3 client on the store's server, to look behind the store's back."""
    return boto3.session.Session(region_name=REGION).client("s3", endpoint_url=s.endpoint)


def leftovers(s: Store, tmp_path: Path) -> list[str]:
    """What a failed put could have left: files under the local folder (temporary ones
    included), or unfinished multipart uploads under the S3 prefix."""
    if isinstance(s, LocalStore):
        return [str(p) for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert isinstance(s, S3Store)
    answer = s3_client(s).list_multipart_uploads(Bucket=BUCKET, Prefix=s.prefix + "/")
    return [u["Key"] for u in answer.get("Uploads", [])]


class Boom(Exception):
    """The client's stream broke."""


class BreakingStream(io.RawIOBase):
    """``good`` bytes, then Boom."""

    def __init__(self, good: int) -> None:
        super().__init__()
        self.left = good

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.left <= 0:
            raise Boom("the client went away")
        n = min(len(b), self.left, 1 << 20)
        b[:n] = b"z" * n
        self.left -= n
        return n


class Trickle(io.RawIOBase):
    """A stream whose reads return at most 100 kB (as a socket's do)."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.f = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.f.read(min(len(b), 100_000))
        b[:len(data)] = data
        return len(data)


class Counting:
    """A store that counts its puts."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.puts = inner, 0
        self.description = inner.description

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def put(self, key, stream):
        self.puts += 1
        return self.inner.put(key, stream)


# ---- the contract, on both stores ------------------------------------------------------------

def test_is_a_store(store):
    assert isinstance(store, Store)
    assert "testing" not in store.description  # no credential in what gets logged
    store.ping()


def test_round_trip_small(store):
    assert put_bytes(store, "a/b.json", b'{"x": 1}') == 8
    assert read_bytes(store, "a/b.json") == b'{"x": 1}'
    assert store.size("a/b.json") == 8
    assert put_bytes(store, "empty", b"") == 0
    assert store.size("empty") == 0 and read_bytes(store, "empty") == b""
    with store.open("a/b.json") as f:  # a real stream: partial reads, then EOF
        assert f.read(3) == b'{"x'
        assert f.read() == b'": 1}'
        assert f.read(10) == b""


def test_round_trip_multipart(store):
    data = os.urandom(17 << 20)  # three parts on S3
    assert store.put("big/x.bin", Trickle(data)) == len(data)
    assert store.size("big/x.bin") == len(data)
    h = hashlib.sha256()
    for block in iter_chunks(store, "big/x.bin"):
        h.update(block)
    assert h.digest() == hashlib.sha256(data).digest()
    with store.open("big/x.bin") as f:
        assert f.read(PART + 5) == data[:PART + 5]
    exactly = data[:PART]  # the boundary: still one part
    assert store.put("big/part.bin", io.BytesIO(exactly)) == PART
    assert read_bytes(store, "big/part.bin") == exactly
    if isinstance(store, S3Store):  # really multipart, and really not
        client = s3_client(store)
        etag = client.head_object(Bucket=BUCKET, Key=f"{store.prefix}/big/x.bin")["ETag"]
        assert etag.endswith('-3"'), etag
        etag = client.head_object(Bucket=BUCKET, Key=f"{store.prefix}/big/part.bin")["ETag"]
        assert "-" not in etag, etag


def test_replace(store):
    put_bytes(store, "k", b"first version, longer")
    put_bytes(store, "k", b"second")
    assert read_bytes(store, "k") == b"second"
    assert store.size("k") == 6
    assert store.list("") == ["k"]


def test_missing(store):
    assert store.size("no/such") is None
    with pytest.raises(NotInStore) as err:
        store.open("no/such")
    assert isinstance(err.value, KeyError) and isinstance(err.value, StoreError)
    assert "no/such" in str(err.value)
    with pytest.raises(NotInStore):
        read_bytes(store, "no/such")


def test_list_by_prefix(store):
    keys = ["runs/abc/x", "runs/abc/y/z", "runs/abd/q", "runs/b", "blobs/1", "runsx/1", "z"]
    for k in reversed(keys):
        put_bytes(store, k, k.encode())
    assert store.list("") == sorted(keys)
    assert store.list("runs/ab") == ["runs/abc/x", "runs/abc/y/z", "runs/abd/q"]
    assert store.list("runs/abc/") == ["runs/abc/x", "runs/abc/y/z"]
    assert store.list("runs/abc") == ["runs/abc/x", "runs/abc/y/z"]
    assert store.list("runs/") == ["runs/abc/x", "runs/abc/y/z", "runs/abd/q", "runs/b"]
    assert store.list("runs") == ["runs/abc/x", "runs/abc/y/z", "runs/abd/q", "runs/b",
                                  "runsx/1"]
    assert store.list("runs/abc/y/z") == ["runs/abc/y/z"]
    assert store.list("nothing/") == [] and store.list("runs/c") == []


def test_delete(store):
    put_bytes(store, "d/one", b"1")
    put_bytes(store, "d/two", b"2")
    store.delete("d/one")
    assert store.size("d/one") is None
    with pytest.raises(NotInStore):
        store.open("d/one")
    assert store.list("d/") == ["d/two"]
    store.delete("d/one")  # again: silent
    store.delete("never/was")
    store.delete("d/two")
    assert store.list("") == []
    put_bytes(store, "d", b"a key where a folder was")
    assert read_bytes(store, "d") == b"a key where a folder was"


@pytest.mark.parametrize("key", BAD_KEYS)
def test_invalid_keys_refused_everywhere(store, key):
    with pytest.raises(ValueError):
        store.put(key, io.BytesIO(b"x"))
    with pytest.raises(ValueError):
        store.open(key)
    with pytest.raises(ValueError):
        store.size(key)
    with pytest.raises(ValueError):
        store.delete(key)
    with pytest.raises(ValueError):
        store.download_url(key, "f.txt", "text/plain")
    if key and key != "x/":  # "" lists everything; "x/" is a folder prefix
        with pytest.raises(ValueError):
            store.list(key)
    assert store.list("") == []


@pytest.mark.parametrize("good", [3 << 20, PART + (1 << 20)], ids=["in-part-1", "in-part-2"])
def test_failing_stream_leaves_nothing(store, tmp_path, good):
    with pytest.raises(Boom):
        store.put("up/x", BreakingStream(good))
    assert store.size("up/x") is None
    assert store.list("") == []
    assert leftovers(store, tmp_path) == []
    put_bytes(store, "up/x", b"the old object")  # a broken replace keeps the old object
    with pytest.raises(Boom):
        store.put("up/x", BreakingStream(good))
    assert read_bytes(store, "up/x") == b"the old object"


def test_helpers(store, tmp_path):
    put_bytes(store, "runs/abc/out/card.html", b"<html>card</html>")
    put_bytes(store, "runs/abc/records/000001", b"row1\nrow2\n")
    put_bytes(store, "runs/abcd/keep", b"other run")

    assert read_bytes(store, "runs/abcd/keep", limit=9) == b"other run"
    with pytest.raises(StoreError) as err:
        read_bytes(store, "runs/abcd/keep", limit=8)
    assert not isinstance(err.value, NotInStore)
    assert b"".join(iter_chunks(store, "runs/abc/records/000001", chunk=3)) == b"row1\nrow2\n"

    dest = tmp_path / "local-run"
    written = fetch_tree(store, "runs/abc", dest)
    assert sorted(written) == [dest / "out/card.html", dest / "records/000001"]
    assert (dest / "out/card.html").read_bytes() == b"<html>card</html>"
    assert (dest / "records/000001").read_bytes() == b"row1\nrow2\n"

    one = fetch_file(store, "runs/abcd/keep", tmp_path / "one" / "keep.txt")
    assert one.read_bytes() == b"other run"
    with pytest.raises(NotInStore):
        fetch_file(store, "runs/nothing", tmp_path / "one" / "nothing")
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["keep.txt"]  # no temp

    assert delete_prefix(store, "runs/abc/") == 2
    assert store.list("") == ["runs/abcd/keep"]
    assert delete_prefix(store, "runs/abc/") == 0


def test_spool_upload(store, tmp_path):
    counting = Counting(store)
    data = os.urandom(3 << 20)
    spool = tmp_path / "spool"
    up = spool_upload(counting, io.BytesIO(data), limit=4 << 20, spool_dir=spool)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert (up.digest, up.size, up.key) == (digest, len(data), digest_key(digest))
    assert read_bytes(store, up.key) == data
    assert up.local.read_bytes() == data
    up.local.unlink()

    again = spool_upload(counting, io.BytesIO(data), limit=4 << 20, spool_dir=spool)
    assert again.key == up.key and counting.puts == 1  # content-addressed: stored once
    again.local.unlink()

    with pytest.raises(UploadError) as err:
        spool_upload(counting, io.BytesIO(os.urandom(5 << 20)), limit=4 << 20,
                     spool_dir=spool)
    assert err.value.status == 413
    assert counting.puts == 1 and store.list("") == [up.key]
    assert list(spool.iterdir()) == []


def test_download_url(store):
    data = b"%PDF-1.7 not really"
    put_bytes(store, "runs/r/out/card.pdf", data)
    url = store.download_url("runs/r/out/card.pdf", "card é.pdf", "application/pdf",
                             expires_s=60)
    if isinstance(store, LocalStore):
        assert url is None  # the API streams it
        return
    assert url is not None and url.startswith(store.endpoint + "/")
    got = requests.get(url, timeout=10)
    assert got.status_code == 200, got.text
    assert got.content == data
    assert got.headers["Content-Type"] == "application/pdf"
    disposition = got.headers["Content-Disposition"]
    assert disposition.startswith("inline;") and 'filename="card__.pdf"' in disposition
    assert "filename*=UTF-8''card%20%C3%A9.pdf" in disposition
    with pytest.raises(ValueError):
        store.download_url("runs/r/out/card.pdf", "x", "text/html\r\nX-Evil: 1")
    with pytest.raises(ValueError):
        store.download_url("runs/r/out/card.pdf", "x", "text/plain\n")
    with pytest.raises(ValueError):
        store.download_url("runs/r/out/card.pdf", "x", "text/html", expires_s=0)


# ---- S3 specifics and store URLs -------------------------------------------------------------

def test_s3_unreachable_and_missing_bucket(s3_server):
    port = free_port()  # nothing listens there
    dead = S3Store.from_url(f"s3://{BUCKET}/p?endpoint=http://127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(StoreError) as err:
        dead.ping()
    assert time.monotonic() - started < 5
    assert f"127.0.0.1:{port}" in str(err.value) and "testing" not in str(err.value)
    assert not isinstance(err.value, NotInStore)

    nobucket = S3Store.from_url(s3_server.url("no-such-bucket", "p"))
    with pytest.raises(StoreError, match="no-such-bucket does not exist"):
        nobucket.ping()
    with pytest.raises(StoreError) as err:
        nobucket.open("x")
    assert not isinstance(err.value, NotInStore)  # a missing bucket is not a missing object


def test_open_store_urls(tmp_path, monkeypatch):
    from certify.service.store_url import open_store

    home = tmp_path / "home"
    default = open_store(None, home)
    assert isinstance(default, LocalStore) and (home / "store").is_dir()

    plain = open_store(str(tmp_path / "plain"), home)
    put_bytes(plain, "a/b", b"1")
    assert (tmp_path / "plain" / "a" / "b").read_bytes() == b"1"
    url = open_store(f"file://{tmp_path / 'url'}", home)
    put_bytes(url, "c", b"2")
    assert (tmp_path / "url" / "c").read_bytes() == b"2"
    assert url.description == f"file://{(tmp_path / 'url').resolve()}"

    monkeypatch.delenv("CERTIFY_S3_ENDPOINT", raising=False)
    s3 = open_store("s3://bucket-1/some/prefix?region=eu-west-1", home)
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix, s3.region, s3.endpoint) == (
        "bucket-1", "some/prefix", "eu-west-1", None)
    monkeypatch.setenv("CERTIFY_S3_ENDPOINT", "http://127.0.0.1:9000")
    s3 = open_store("s3://bucket-1", home)
    assert isinstance(s3, S3Store)
    assert s3.endpoint == "http://127.0.0.1:9000" and s3.prefix == ""
    assert s3.description == "s3://bucket-1?endpoint=http://127.0.0.1:9000&region=us-east-1"

    with pytest.raises(StoreError, match="valid ones are endpoint, region"):
        open_store("s3://bucket-1/p?endpoint=http://x&colour=red", home)
    with pytest.raises(StoreError) as err:
        open_store("s3://AKIAEXAMPLE:s3cr3tvalue@bucket-1/p", home)
    assert "AWS_ACCESS_KEY_ID" in str(err.value)
    assert "s3cr3t" not in str(err.value) and "AKIAEXAMPLE" not in str(err.value)
    for bad in ("s3://Bad_Bucket/p", "s3://bucket-1/../x", "s3:///p", "s3://bucket-1?region=",
                "s3://bucket-1?region=a&region=b", "s3://bucket-1?endpoint=ftp://x",
                "s3://bucket-1?endpoint=http://u:p@host", "ftp://host/x"):
        with pytest.raises(StoreError):
            open_store(bad, home)


def test_s3_without_boto3(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    with pytest.raises(StoreError, match=r"pip install 'certify\[s3\]'"):
        S3Store.from_url("s3://bucket-1/p")


# ---- certify store migrate -------------------------------------------------------------------

def test_migrate_local_to_s3(s3_server, tmp_path):
    home = tmp_path / "home"
    local = LocalStore(home / "store")
    objects = {f"runs/{i:032x}/out/results.json": os.urandom(1000 + i) for i in range(5)}
    objects["blobs/sha256/ab/" + "ab" * 32] = os.urandom(9 << 20)  # multipart on the way
    objects["suites/s.yaml"] = b""
    for k, v in objects.items():
        put_bytes(local, k, v)
    url = s3_server.url(BUCKET, f"mig-{uuid.uuid4().hex[:12]}")
    runner = CliRunner()

    dry = runner.invoke(store_group, ["migrate", "--home", str(home), "--to", url, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert dry.output.count("would copy ") == len(objects) + 1  # one line each, and the summary
    target = S3Store.from_url(url)
    assert target.list("") == []

    first = runner.invoke(store_group, ["migrate", "--home", str(home), "--to", url,
                                        "--progress-every", "2"])
    assert first.exit_code == 0, first.output
    assert "2/7 objects" in first.output and "4/7 objects" in first.output
    total = sum(map(len, objects.values()))
    assert f"copied 7 objects ({total / 1e6:.1f} MB)" in first.output
    assert target.list("") == sorted(objects)
    for k, v in objects.items():
        assert read_bytes(target, k) == v

    # interrupted after some objects: one missing, one cut short -> only those two go again
    missing, short = sorted(objects)[0], sorted(objects)[1]
    target.delete(missing)
    put_bytes(target, short, b"partial")
    again = runner.invoke(store_group, ["migrate", "--home", str(home), "--to", url])
    assert again.exit_code == 0, again.output
    assert "copied 2 objects" in again.output and "5 already there" in again.output
    assert read_bytes(target, short) == objects[short]
    rerun = runner.invoke(store_group, ["migrate", "--home", str(home), "--to", url])
    assert "copied 0 objects (0.0 MB)" in rerun.output and "7 already there" in rerun.output


def test_migrate_errors(s3_server, tmp_path):
    runner = CliRunner()
    missing = runner.invoke(store_group, ["migrate", "--home", str(tmp_path / "none"),
                                          "--to", str(tmp_path / "t")])
    assert isinstance(missing.exception, UsageError)
    assert "is not a folder" in str(missing.exception)

    home = tmp_path / "home"
    put_bytes(LocalStore(home / "store"), "a", b"1")
    port = free_port()
    dead = runner.invoke(store_group, ["migrate", "--home", str(home), "--to",
                                       f"s3://{BUCKET}/p?endpoint=http://127.0.0.1:{port}"])
    assert isinstance(dead.exception, UsageError)
    assert "does not answer" in str(dead.exception)
    same = runner.invoke(store_group, ["migrate", "--home", str(home), "--to",
                                       str(home / "store")])
    assert isinstance(same.exception, UsageError)

    # a local folder is a valid target too
    ok = runner.invoke(store_group, ["migrate", "--home", str(home), "--to",
                                     str(tmp_path / "copy")])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "copy" / "a").read_bytes() == b"1"
