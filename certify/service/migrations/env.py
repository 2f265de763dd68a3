"""Alembic environment: migrations run on the connection :func:`certify.service.db.migrate`
passes in (never from an alembic.ini: the service has none)."""

from alembic import context

from certify.service.db import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
