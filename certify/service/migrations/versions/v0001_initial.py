"""The first schema: tokens, runs, uploads, log entries.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create the tables."""
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created", sa.DateTime, nullable=False),
        sa.Column("expires", sa.DateTime, nullable=True),
        sa.Column("revoked", sa.Boolean, nullable=False),
        sa.Column("query_budget", sa.Integer, nullable=True),
        sa.Column("queries_used", sa.Integer, nullable=False),
        sa.Column("max_concurrent", sa.Integer, nullable=False),
    )
    op.create_index("ix_tokens_token_hash", "tokens", ["token_hash"], unique=True)
    op.create_table(
        "runs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("seq", sa.Integer, nullable=False, unique=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created", sa.DateTime, nullable=False),
        sa.Column("updated", sa.DateTime, nullable=False),
        sa.Column("token_id", sa.Integer, nullable=True),
        sa.Column("model_kind", sa.String(8), nullable=False),
        sa.Column("model_ref", sa.Text, nullable=False),
        sa.Column("model_name", sa.String(300), nullable=False),
        sa.Column("secret_enc", sa.LargeBinary, nullable=True),
        sa.Column("suite", sa.String(300), nullable=False),
        sa.Column("suite_name", sa.String(300), nullable=False),
        sa.Column("dataset", sa.String(300), nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("lease_expires", sa.DateTime, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("progress", sa.JSON, nullable=False),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("log_index", sa.Integer, nullable=True),
    )
    op.create_index("ix_runs_state", "runs", ["state"])
    op.create_table(
        "uploads",
        sa.Column("digest", sa.String(80), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("created", sa.DateTime, nullable=False),
        sa.Column("token_id", sa.Integer, nullable=True),
        sa.Column("expires", sa.DateTime, nullable=True),
        sa.Column("paths", sa.JSON, nullable=False),
    )
    op.create_table(
        "log_entries",
        sa.Column("idx", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("leaf_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("statement_digest", sa.String(80), nullable=False),
        sa.Column("statement", sa.JSON, nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("created", sa.DateTime, nullable=False),
    )
    op.create_index("ix_log_entries_statement_digest", "log_entries", ["statement_digest"],
                    unique=True)


def downgrade() -> None:
    """Drop the tables."""
    for t in ("log_entries", "uploads", "runs", "tokens"):
        op.drop_table(t)
