"""Failed logins throttled per (user name, client address) instead of locking the account

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "login_throttles",
        sa.Column("user", sa.String(64), primary_key=True),
        sa.Column("source", sa.String(128), primary_key=True),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("blocked_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_failure_at", sa.DateTime(timezone=True), nullable=False, index=True),
    )
    with op.batch_alter_table("users") as batch:
        batch.drop_column("failed_logins")
        batch.drop_column("locked_until")


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("failed_logins", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("locked_until", sa.DateTime(timezone=True), nullable=True))
    op.drop_table("login_throttles")
