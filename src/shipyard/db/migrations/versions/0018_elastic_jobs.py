"""Elastic jobs: the size each attempt ran at (processes of its gang over all its nodes), the
scheduler's resize of a running job until its attempt ends with the kind ``resized``, and that
resize in words on the attempt it ended.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 17:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("world_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("message", sa.Text(), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("resize_message", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("resize_message")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("message")
        batch.drop_column("world_size")
