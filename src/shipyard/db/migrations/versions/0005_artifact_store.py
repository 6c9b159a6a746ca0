"""Artifact store catalog: blobs, artifacts (manifests) and their entries; job outputs' store names

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("artifacts") as batch:
        batch.add_column(sa.Column("stored_name", sa.String(255), nullable=True))
    op.create_table(
        "stored_blobs",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False, index=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("wrapped_key", sa.LargeBinary(), nullable=True),
        sa.Column("project", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "stored_artifacts",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("encrypted", sa.Boolean(), nullable=False),
        sa.Column("created_by", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("project", "name"),
    )
    op.create_table(
        "stored_entries",
        sa.Column(
            "artifact_id",
            sa.Integer(),
            sa.ForeignKey("stored_artifacts.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("path", sa.Text(), primary_key=True),
        sa.Column(
            "blob_name", sa.String(128), sa.ForeignKey("stored_blobs.name"), nullable=False, index=True
        ),
    )


def downgrade() -> None:
    op.drop_table("stored_entries")
    op.drop_table("stored_artifacts")
    op.drop_table("stored_blobs")
    with op.batch_alter_table("artifacts") as batch:
        batch.drop_column("stored_name")
