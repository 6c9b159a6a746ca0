"""Agent status per node: last pass, its duration, devices in use, vendor utilization

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 13:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agent_status",
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("agent_id", sa.String(255), nullable=False),
        sa.Column("last_pass_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pass_s", sa.Double(), nullable=False),
        sa.Column("schedule_s", sa.Double(), nullable=False),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("utilization", sa.JSON(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("agent_status")
