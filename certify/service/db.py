"""The service's state: tables, engine, schema migrations (Alembic).

SQLite (WAL) by default, PostgreSQL with ``--db postgresql+psycopg://...``. The schema is only
ever created by the Alembic migrations in :mod:`certify.service.migrations`, run at start.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Engine,
    Integer,
    LargeBinary,
    String,
    Text,
    create_engine,
    event,
    false,
    text,
)
from sqlalchemy.engine import CursorResult
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.sql.dml import UpdateBase

#: Run states. ``queued`` and ``running`` are live; the rest are final.
QUEUED, RUNNING, DONE, ERROR, CANCELLED = "queued", "running", "done", "error", "cancelled"
FINAL_STATES = (DONE, ERROR, CANCELLED)


def utcnow() -> dt.datetime:
    """Now, timezone-aware UTC (stored as naive UTC: SQLite keeps no zone)."""
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class HttpOptions(TypedDict):
    """An endpoint run's HTTP options: the header its secret goes in, the version it serves."""

    auth_header: str
    version: str | None


class RunOptions(TypedDict, total=False):
    """A run's options (the ``runs.options`` JSON column), as the submission checks set
    them: the run's size, seed and query budget, its model card, an endpoint's HTTP options,
    its reference and surrogate models (store keys) and the uploads it uses (digests)."""

    samples: int | None
    seed: int | None
    query_budget: int | None
    model_card: dict[str, str]
    http: HttpOptions
    reference: str
    surrogate: str
    uploads: list[str]


class Base(DeclarativeBase):
    """Declarative base of the service's tables."""


class Token(Base):
    """An API token: only its sha256 is stored."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    expires: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Model queries this token's runs may spend in all (None: unlimited).
    query_budget: Mapped[int | None] = mapped_column(Integer, nullable=True)
    queries_used: Mapped[int] = mapped_column(Integer, default=0)
    #: Runs of this token that may be queued or running at once.
    max_concurrent: Mapped[int] = mapped_column(Integer, default=4)


class Run(Base):
    """One submitted run, from queued to a final state."""

    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, unique=True)  # submission order
    state: Mapped[str] = mapped_column(String(16), index=True)
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    updated: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    #: ``onnx`` (model_ref = upload digest) or ``http`` (model_ref = endpoint URL).
    model_kind: Mapped[str] = mapped_column(String(8))
    model_ref: Mapped[str] = mapped_column(Text)
    model_name: Mapped[str] = mapped_column(String(300))
    #: The endpoint's auth secret, encrypted (:mod:`certify.service.secrets`); never returned.
    secret_enc: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    #: A packaged suite name, or ``upload:<digest>`` of an uploaded YAML.
    suite: Mapped[str] = mapped_column(String(300))
    suite_name: Mapped[str] = mapped_column(String(300))
    #: A registered dataset name, or ``upload:<digest>`` of an uploaded .npz.
    dataset: Mapped[str] = mapped_column(String(300))
    options: Mapped[RunOptions] = mapped_column(JSON, default=dict)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    lease_owner: Mapped[str | None] = mapped_column(String(64), nullable=True)
    lease_expires: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    #: Live progress: {"label": ..., "done": n, "total": m, "checks": {id: status}}.
    progress: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    verdict: Mapped[str | None] = mapped_column(String(16), nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    log_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: Readable by every token (set by the run's owner or an admin); private by default.
    public: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: ``cuda``: only a worker with a GPU claims the run; None: any worker.
    device: Mapped[str | None] = mapped_column(String(8), nullable=True)


class Upload(Base):
    """One token's record of an uploaded file. The file is stored once, by content digest;
    each token that uploaded it has its own row, so that a token's upload looks the same
    whether or not another token sent the same bytes (no existence oracle), counts against
    that token's quota, and goes when that token deletes it (the blob goes with the last row).
    """

    __tablename__ = "uploads"
    digest: Mapped[str] = mapped_column(String(80), primary_key=True)
    token_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    kind: Mapped[str] = mapped_column(String(16))  # model | suite | dataset
    size: Mapped[int] = mapped_column(Integer)
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    expires: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    #: Store-relative paths made from this upload (a suite's .yaml, a model's folder).
    paths: Mapped[list[str]] = mapped_column(JSON, default=list)


class WebSession(Base):
    """A web UI session: the cookie carries a random id, only its sha256 is stored; logging
    out deletes the row, so a copied cookie stops working at once."""

    __tablename__ = "sessions"
    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[int] = mapped_column(Integer, index=True)
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    expires: Mapped[dt.datetime] = mapped_column(DateTime, index=True)


class ShareLink(Base):
    """A share link of a run: whoever holds its secret URL reads the run's card and results
    without a token, until the link is revoked (the row deleted). Only the secret's sha256 is
    stored."""

    __tablename__ = "share_links"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(32), index=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    #: The token that made the link.
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)


class LogEntry(Base):
    """One leaf of the transparency log (append-only: rows are never updated or deleted)."""

    __tablename__ = "log_entries"
    idx: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    leaf_hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    #: sha256 of the signed statement's canonical JSON (the leaf's data), "sha256:<hex>".
    statement_digest: Mapped[str] = mapped_column(String(80), unique=True, index=True)
    statement: Mapped[dict[str, object]] = mapped_column(JSON)
    run_id: Mapped[str] = mapped_column(String(32))
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class Worker(Base):
    """A worker process (an API node's ``--workers`` or ``certify worker``): its device and
    its last heartbeat, on the database's clock (:func:`db_now`)."""

    __tablename__ = "workers"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(String(200))
    device: Mapped[str] = mapped_column(String(8))
    started: Mapped[dt.datetime] = mapped_column(DateTime)
    last_seen: Mapped[dt.datetime] = mapped_column(DateTime)
    #: Runs it may hold at once, and holds now.
    slots: Mapped[int] = mapped_column(Integer)
    running: Mapped[int] = mapped_column(Integer)


class Identity(Base):
    """What every node of one service must share, by fingerprint (``sign_key``,
    ``session_secret``, ``secrets_key``) or value (``certificate``: the signing key's PEM
    certificate, made by the first node)."""

    __tablename__ = "identity"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    created: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


def db_now(session: Session) -> dt.datetime:
    """Now on the database's clock, as naive UTC: leases and heartbeats are compared on one
    clock however many machines write them. PostgreSQL answers ``now()``; SQLite is a local
    file, so every process using it shares this machine's clock."""
    bind = session.get_bind()
    if bind.dialect.name == "postgresql":
        value = session.scalar(text("SELECT now() AT TIME ZONE 'UTC'"))
        if not isinstance(value, dt.datetime):
            raise RuntimeError(f"the database's clock answered {value!r}")
        return value.replace(tzinfo=None)
    return utcnow()


def changed_rows(session: Session, statement: UpdateBase) -> int:
    """Run an UPDATE or DELETE in ``session``; the rows it matched (what a conditional
    transition of the queue tests)."""
    result = session.execute(statement)
    if not isinstance(result, CursorResult):  # what SQLAlchemy returns for DML
        raise TypeError(f"{type(result).__name__} has no row count")
    return int(result.rowcount)


def sqlite_url(home: Path) -> str:
    """The default database: ``state.db`` in the service's home folder."""
    return f"sqlite:///{home / 'state.db'}"


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and foreign keys."""
    if url.startswith("sqlite"):
        from sqlalchemy.engine import make_url

        from certify.service.private import private_file

        database = make_url(url).database
        if database and database != ":memory:" and Path(database).parent.is_dir():
            private_file(Path(database))  # 0600: SQLite keeps it, and gives its WAL the same
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


#: The PostgreSQL advisory lock key that serialises schema migrations (any number of nodes may
#: start together on an empty database): ``certify`` in ASCII.
MIGRATION_LOCK_KEY = int.from_bytes(b"certify", "big")


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest migration (Alembic ``upgrade head``), one node at a time.

    On PostgreSQL the migration's transaction first takes a transaction-scoped advisory lock
    (:data:`MIGRATION_LOCK_KEY`): a node that starts beside another waits for its migration
    to commit, then finds the schema at head (without it, two nodes on an empty database both
    created the tables and one failed on ``pg_type``'s unique index). On SQLite the migration
    holds an exclusive ``flock`` on ``<database>.migrate-lock`` beside the database: never on
    the database file itself, since closing any descriptor of that file drops every POSIX lock
    SQLite holds on it in this process."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    with _migration_lock(engine), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                         {"key": MIGRATION_LOCK_KEY})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """An exclusive lock beside a SQLite database for the migration (nothing elsewhere)."""
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    if not path or path == ":memory:" or path.startswith("file:"):
        yield
        return
    import fcntl

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{path}.migrate-lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the file releases the lock


def sessions(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)
