"""Exports record their lineage (base model and data digests, fine-tuning method); peak memory
measured per shape of job feeds later estimates

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 19:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("artifacts") as batch:
        batch.add_column(sa.Column("lineage", sa.JSON(), nullable=True))
    op.create_table(
        "memory_measurements",
        sa.Column("shape", sa.String(64), primary_key=True),
        sa.Column("accelerator_type", sa.String(64), primary_key=True),
        sa.Column("planned_gib", sa.Double(), nullable=False),
        sa.Column("measured_gib", sa.Double(), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("memory_measurements")
    with op.batch_alter_table("artifacts") as batch:
        batch.drop_column("lineage")
