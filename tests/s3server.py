"""moto's standalone S3-compatible server on 127.0.0.1, for the object store's tests.

``with moto_server() as s3:`` starts ``python -m moto.server`` on a free port and stops it at
the end. ``s3.endpoint`` is its URL; ``s3.env`` holds the dummy credentials a client needs (pass
``{**os.environ, **s3.env}`` to a subprocess); ``with s3.credentials():`` puts them in this
process's environment (the S3 store takes credentials only from there), and ``s3.url(bucket,
prefix)`` is a ``--store`` URL. :func:`create_bucket` makes a bucket (test set-up only: the store
itself never creates one).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import requests
from service_fixture import free_port

REGION = "us-east-1"

#: Dummy credentials, and no shared config or instance metadata: a client finds nothing else.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
#: Variables that would point a client elsewhere or add to the credentials above.
AWS_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL",
             "AWS_ENDPOINT_URL_S3", "CERTIFY_S3_ENDPOINT")


@dataclass
class MotoServer:
    """A running moto server: its endpoint and the environment its clients need."""

    endpoint: str
    env: dict[str, str] = field(default_factory=lambda: dict(AWS_ENV))

    def url(self, bucket: str, prefix: str = "") -> str:
        """The ``--store`` URL of ``bucket`` (under ``prefix``) on this server."""
        path = f"/{prefix}" if prefix else ""
        return f"s3://{bucket}{path}?endpoint={self.endpoint}&region={REGION}"

    @contextmanager
    def credentials(self) -> Iterator[None]:
        """This server's credentials in ``os.environ`` (restored afterwards)."""
        saved = {k: os.environ.get(k) for k in (*self.env, *AWS_UNSET)}
        os.environ.update(self.env)
        for k in AWS_UNSET:
            os.environ.pop(k, None)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@contextmanager
def moto_server(timeout: float = 30.0) -> Iterator[MotoServer]:
    """Start moto's server on a free port of 127.0.0.1, wait until it answers, and stop it at
    the end of the ``with`` block."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in AWS_UNSET}
    with tempfile.TemporaryDirectory(prefix="moto-") as tmp:
        log_path = Path(tmp) / "moto.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**env, **AWS_ENV})
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"moto's server exited {proc.returncode}:\n"
                                       f"{log_path.read_text(errors='replace')}")
                try:
                    if requests.get(f"{endpoint}/moto-api/", timeout=2).ok:
                        break
                except requests.RequestException:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto's server did not answer in {timeout} s:\n"
                                       f"{log_path.read_text(errors='replace')}")
                time.sleep(0.1)
            yield MotoServer(endpoint)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def create_bucket(server: MotoServer, bucket: str) -> None:
    """Make ``bucket`` on the server (CreateBucket: test set-up, not a store operation)."""
    import boto3

    client = boto3.session.Session(
        aws_access_key_id=server.env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=server.env["AWS_SECRET_ACCESS_KEY"],
        region_name=REGION).client("s3", endpoint_url=server.endpoint)
    client.create_bucket(Bucket=bucket)
