"""Alembic environment: runs on the connection that ``engine.upgrade`` hands over."""

from __future__ import annotations

from alembic import context

from shipyard.db import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through shipyard.db.engine.upgrade(engine)")
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
