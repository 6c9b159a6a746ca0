"""The agent records the nodes its engine knows, so that the API server lists them and checks
requests against them without joining the engine (and without dying with a cluster's head).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 19:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cluster_nodes",
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("inventory", sa.JSON(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("cluster_nodes")
