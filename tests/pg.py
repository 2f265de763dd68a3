"""A throwaway PostgreSQL cluster for the service tests: initdb in a temp dir, 127.0.0.1 only.

PostgreSQL refuses to run as root; when the tests run as root (CI does), the cluster runs as
the ``postgres`` user that Debian's package creates. The binaries come from Debian's
``postgresql`` package, which ``scripts/setup.sh`` installs; a machine without them and without
apt skips (and says so), a machine with apt but without them fails: setup.sh should have run.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from service_fixture import free_port


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _as_user(cmd: list[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


@contextmanager
def postgres_cluster() -> Iterator[str]:
    """Start a cluster; yield a SQLAlchemy URL of a fresh database; stop it at the end."""
    bindir = _bindir()
    if bindir is None:
        if shutil.which("apt-get") is None:
            pytest.skip("PostgreSQL is not installed and apt is unavailable on this machine")
        pytest.fail("PostgreSQL binaries missing: run scripts/setup.sh (installs postgresql)")
    user = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="certify-pg-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    if user:
        shutil.chown(root, user)
        shutil.chown(sock, user)
    port = free_port()
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    subprocess.run(_as_user([str(bindir / "initdb"), "-D", str(data), "-U", "certify",
                             "-A", "trust", "-E", "UTF8", "--no-sync"], user),
                   check=True, capture_output=True, env=env, cwd=root)
    log = root / "server.log"
    subprocess.run(_as_user([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w",
                             "-o", f"-h 127.0.0.1 -p {port} -k {sock} -F", "start"], user),
                   check=True, capture_output=True, env=env, cwd=root)
    try:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(f"host=127.0.0.1 port={port} user=certify dbname=postgres",
                                     autocommit=True) as conn:
                    conn.execute("CREATE DATABASE certify")
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield f"postgresql+psycopg://certify@127.0.0.1:{port}/certify"
    finally:
        subprocess.run(_as_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast",
                                 "stop"], user), capture_output=True, env=env, cwd=root)
        shutil.rmtree(root, ignore_errors=True)
