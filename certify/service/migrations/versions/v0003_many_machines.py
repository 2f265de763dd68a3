"""Many machines (issue 39): a run may ask for a device, workers are rows with heartbeats,
and the service's identity (its keys' fingerprints) is recorded so that every node agrees.

- ``runs.device``: ``cuda`` for a run that must run on a GPU worker; NULL: any worker.
- ``runs.token_id`` gets an index (the fair claim order groups by it).
- ``workers``: one row per worker process (API nodes with ``--workers N`` and
  ``certify worker``), its device and its last heartbeat on the database's clock.
- ``identity``: name -> fingerprint of the signing key, the session secret, the secrets key
  and the signing certificate shared by every node (``certificate`` holds its PEM).

Revision ID: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the run's device, the workers and the identity tables."""
    op.add_column("runs", sa.Column("device", sa.String(8), nullable=True))
    op.create_index("ix_runs_token_id", "runs", ["token_id"])
    op.create_table(
        "workers",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("device", sa.String(8), nullable=False),
        sa.Column("started", sa.DateTime, nullable=False),
        sa.Column("last_seen", sa.DateTime, nullable=False),
        sa.Column("slots", sa.Integer, nullable=False),
        sa.Column("running", sa.Integer, nullable=False),
    )
    op.create_table(
        "identity",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("created", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    """Drop them again."""
    op.drop_table("identity")
    op.drop_table("workers")
    op.drop_index("ix_runs_token_id", "runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("device")
