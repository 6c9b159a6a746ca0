"""What each shape of job measured, throughput beside memory, and this cluster's fitted device
efficiency. The shape's key now counts the threads per process (they set a CPU job's
throughput), so the memory measurements under the old keys are dropped, not carried over.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_table("memory_measurements")
    op.create_table(
        "shape_measurements",
        sa.Column("shape", sa.String(64), primary_key=True),
        sa.Column("accelerator_type", sa.String(64), primary_key=True),
        sa.Column("planned_gib", sa.Double(), nullable=True),
        sa.Column("measured_gib", sa.Double(), nullable=True),
        sa.Column("planned_tokens_per_s", sa.Double(), nullable=True),
        sa.Column("measured_tokens_per_s", sa.Double(), nullable=True),
        sa.Column("planned_efficiency", sa.Double(), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "device_calibrations",
        sa.Column("accelerator_type", sa.String(64), primary_key=True),
        sa.Column("efficiency", sa.Double(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("error_before", sa.Double(), nullable=False),
        sa.Column("error_after", sa.Double(), nullable=False),
        sa.Column("fitted_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("device_calibrations")
    op.drop_table("shape_measurements")
    op.create_table(
        "memory_measurements",
        sa.Column("shape", sa.String(64), primary_key=True),
        sa.Column("accelerator_type", sa.String(64), primary_key=True),
        sa.Column("planned_gib", sa.Double(), nullable=False),
        sa.Column("measured_gib", sa.Double(), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
    )
