"""Recovery: a job's next micro-batch (after running out of memory) and when its next retry may
start; each attempt's micro-batch and health (stragglers); submissions' idempotency keys; why a
node is cordoned; each stored blob's block CRC32Cs

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("micro_batch_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("restart_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("idempotency_key", sa.String(128), nullable=True))
        batch.create_unique_constraint("uq_jobs_owner_idempotency_key", ["owner", "idempotency_key"])
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("micro_batch_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("health", sa.JSON(), nullable=True))
    with op.batch_alter_table("agent_status") as batch:
        batch.add_column(sa.Column("problems", sa.JSON(), nullable=True))
    with op.batch_alter_table("stored_blobs") as batch:
        batch.add_column(sa.Column("block_crcs", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stored_blobs") as batch:
        batch.drop_column("block_crcs")
    with op.batch_alter_table("agent_status") as batch:
        batch.drop_column("problems")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("health")
        batch.drop_column("micro_batch_size")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("uq_jobs_owner_idempotency_key", type_="unique")
        batch.drop_column("idempotency_key")
        batch.drop_column("restart_at")
        batch.drop_column("micro_batch_size")
