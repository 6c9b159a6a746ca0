"""A checkpoint its nodes wrote into the store themselves is recorded with its files' records
(blob names, digests, sizes, wrapped keys) until the catalog commits it, and after, so that a
relaunch reads it back whether or not the commit came first.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 19:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("artifacts") as batch:
        batch.add_column(sa.Column("written", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("artifacts") as batch:
        batch.drop_column("written")
