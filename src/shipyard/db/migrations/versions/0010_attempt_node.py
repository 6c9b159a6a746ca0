"""Attempts record the node they run on and the executor's handle; jobs the code of why they wait

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("node", sa.String(128), nullable=True))
        batch.add_column(sa.Column("handle", sa.String(256), nullable=True))
    # Attempts of before ran as processes of the agent's machine: their handle is the pid, and
    # their node (unknown) is taken to be the machine of the agent that looks at them.
    op.execute("UPDATE attempts SET handle = CAST(pid AS VARCHAR(256)) WHERE pid IS NOT NULL")
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("pending_code", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("pending_code")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("handle")
        batch.drop_column("node")
