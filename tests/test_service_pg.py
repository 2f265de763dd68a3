"""The service on PostgreSQL (started by the test from Debian's package) and its schema."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pg import postgres_cluster
from service_fixture import Service, small_inputs, submit_cli
from sqlalchemy import Engine, inspect

from certify.service import queue
from certify.service.db import Base, make_engine, migrate, sessions, sqlite_url

from builders import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this module."""
    with postgres_cluster() as url:
        yield url


@contextmanager
def _engine(url: str) -> Iterator[Engine]:
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def _schema(url: str) -> dict[str, list[str]]:
    with _engine(url) as engine:
        insp = inspect(engine)
        return {t: sorted(c["name"] for c in insp.get_columns(t))
                for t in insp.get_table_names()}


def test_migrations_make_the_same_schema_on_postgresql_and_sqlite(pg_url: str,
                                                                   tmp_path: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    lite = sqlite_url(tmp_path)
    for url in (pg_url, lite):
        with _engine(url) as engine:
            migrate(engine)
            migrate(engine)  # a second time is a no-op
            with engine.connect() as conn:
                diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], (url.split(":")[0], diff)
    assert _schema(pg_url) == _schema(lite)


def test_concurrent_claims_take_each_run_once(pg_url: str) -> None:
    with _engine(pg_url) as engine:
        _claim_all(engine)


def _claim_all(engine: Engine) -> None:
    migrate(engine)
    factory = sessions(engine)
    with factory() as s:
        ids = {queue.enqueue(s, token_id=None, model_kind="onnx", model_ref="m", model_name="m",
                             suite="gtsrb", suite_name="gtsrb", dataset="d",
                             options={"secret": b"x".hex()}).id for _ in range(40)}
    claimed: list[str] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        while (run := queue.claim(factory, f"w{n}", 60)) is not None:
            with lock:
                claimed.append(run.id)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == sorted(ids)  # every run once, none twice


def test_serve_submit_verify_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    suite, data = small_inputs(tmp_path / "in")
    svc = Service(tmp_path / "home", "--workers", "1", "--dataset", f"small={data}",
                  db=pg_url).start()
    try:
        token = svc.token("submit")
        out = tmp_path / "card"
        r = submit_cli(svc, token, suite, out, samples=12)
        assert r.returncode == 0, r.stderr + svc.log()
        v = run_cli("verify", out / "card.pdf", "--log", svc.url, "--log-state",
                    tmp_path / "state.json")
        assert v.returncode == 0, v.stdout + v.stderr
        assert "inclusion: proven" in v.stdout
        assert not (tmp_path / "home" / "state.db").exists()  # the state is in PostgreSQL
    finally:
        svc.stop()


def test_four_api_nodes_started_together_on_an_empty_database_all_come_up(
        pg_url: str, tmp_path: Path) -> None:
    """Issue 50: every node migrates the schema at start; on an empty database four nodes
    started at the same moment used to race (one exited 2 on ``pg_type``'s unique index or
    ``alembic_version`` already existing). Under the advisory lock all four come up, on one
    schema and one identity."""
    import os

    import psycopg

    from certify.report.sign import keygen

    base, _, _ = pg_url.rpartition("/")
    with psycopg.connect(base.replace("postgresql+psycopg://", "postgresql://") + "/postgres",
                         autocommit=True) as conn:
        conn.execute("CREATE DATABASE together")
    url = f"{base}/together"
    key, _pub = keygen(tmp_path / "keys", "service")
    env = {"CERTIFY_SESSION_SECRET": os.urandom(32).hex()}
    nodes = [Service(tmp_path / f"api-{n}", "--workers", "0", "--sign-key", str(key),
                     db=url, env=env) for n in range(4)]
    try:
        for node in nodes:
            node.launch()
        for node in nodes:
            node.wait_up(120)
        keys = {n.get("/log").json()["key_fingerprint"] for n in nodes}
        assert len(keys) == 1, keys
    finally:
        for node in nodes:
            node.stop()
    logs = "\n".join(n.log() for n in nodes)
    assert "Traceback" not in logs and "already exists" not in logs, logs
    with _engine(url) as engine, engine.connect() as conn:
        from alembic.autogenerate import compare_metadata
        from alembic.migration import MigrationContext

        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_four_processes_migrating_one_new_sqlite_database_together_all_succeed(
        tmp_path: Path) -> None:
    """SQLite's side of the migration lock: a lock file beside the database (a lock on the
    database file itself would drop SQLite's own locks when released)."""
    import subprocess
    import sys

    url = sqlite_url(tmp_path)
    code = ("import sys\nfrom certify.service.db import make_engine, migrate\n"
            "engine = make_engine(sys.argv[1])\nmigrate(engine)\nengine.dispose()\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, url], stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    assert (tmp_path / "state.db.migrate-lock").exists()
    with _engine(url) as engine, engine.connect() as conn:
        from alembic.autogenerate import compare_metadata
        from alembic.migration import MigrationContext

        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
