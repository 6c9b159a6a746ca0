"""Queue configurations applied through the API: quota changes kept in the database, versioned

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 12:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "queue_configs",
        sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.Column("applied_by", sa.String(64), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("queue_configs")
