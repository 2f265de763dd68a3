"""Tenants apart (issue 38): web sessions in the database, public runs and share links, and
uploads recorded per (digest, token).

- ``sessions``: a web UI session is a row (the sha256 of the cookie's random id), so that
  logging out ends it at once.
- ``runs.public``: a run its owner (or an admin) made readable by every token.
- ``share_links``: secret URLs that read a run's card and results without a token.
- ``uploads``: the primary key becomes (digest, token_id): the file is stored once, but each
  token that uploaded it owns its own record. Rows without a token (none are written) keep
  token 0, which only an admin can delete.

Revision ID: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _uploads_table(name: str, token_pk: bool) -> None:
    op.create_table(
        name,
        sa.Column("digest", sa.String(80), primary_key=True),
        sa.Column("token_id", sa.Integer, primary_key=token_pk, nullable=not token_pk,
                  autoincrement=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("created", sa.DateTime, nullable=False),
        sa.Column("expires", sa.DateTime, nullable=True),
        sa.Column("paths", sa.JSON, nullable=False),
    )


def _swap_uploads(token_pk: bool, select: str) -> None:
    """Rebuild ``uploads`` with another primary key (SQLite cannot alter one in place):
    a new table, the rows copied by ``select``, the old table dropped, the new one renamed."""
    _uploads_table("uploads_next", token_pk)
    op.execute("INSERT INTO uploads_next (digest, token_id, kind, size, created, expires, "
               f"paths) {select}")
    op.drop_table("uploads")
    op.rename_table("uploads_next", "uploads")
    if op.get_bind().dialect.name == "postgresql":  # keep PostgreSQL's conventional name
        op.execute("ALTER INDEX uploads_next_pkey RENAME TO uploads_pkey")


def upgrade() -> None:
    """Add sessions, share links and public runs; key uploads by (digest, token)."""
    op.add_column("runs", sa.Column("public", sa.Boolean, nullable=False,
                                    server_default=sa.false()))
    op.create_table(
        "sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("token_id", sa.Integer, nullable=False),
        sa.Column("created", sa.DateTime, nullable=False),
        sa.Column("expires", sa.DateTime, nullable=False),
    )
    op.create_index("ix_sessions_token_id", "sessions", ["token_id"])
    op.create_index("ix_sessions_expires", "sessions", ["expires"])
    op.create_table(
        "share_links",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created", sa.DateTime, nullable=False),
        sa.Column("token_id", sa.Integer, nullable=True),
    )
    op.create_index("ix_share_links_run_id", "share_links", ["run_id"])
    op.create_index("ix_share_links_secret_hash", "share_links", ["secret_hash"], unique=True)
    _swap_uploads(True, "SELECT digest, COALESCE(token_id, 0), kind, size, created, expires, "
                        "paths FROM uploads")


def downgrade() -> None:
    """Back to one upload row per digest (the earliest token's), without sessions, share
    links or public runs."""
    _swap_uploads(False, "SELECT digest, token_id, kind, size, created, expires, paths FROM "
                         "uploads u WHERE token_id = (SELECT MIN(token_id) FROM uploads v "
                         "WHERE v.digest = u.digest)")
    op.drop_index("ix_share_links_secret_hash", "share_links")
    op.drop_index("ix_share_links_run_id", "share_links")
    op.drop_table("share_links")
    op.drop_index("ix_sessions_expires", "sessions")
    op.drop_index("ix_sessions_token_id", "sessions")
    op.drop_table("sessions")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("public")
