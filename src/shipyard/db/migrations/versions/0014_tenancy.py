"""Model names per project (``research/shared`` and ``vision/shared`` are two models), and sign-in
links as a credential of their own. Existing versions keep their numbers: versions of one name
numbered across projects stay unique within each.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PER_PROJECT = "uq_model_versions_project_name_version"
UNNAMED = {"uq": "uq_%(table_name)s_%(column_0_name)s"}
"""The name SQLite's batch mode gives the unnamed (name, version) constraint of 0001."""


def _global_constraint() -> str:
    """The (name, version) constraint of 0001, which named none: PostgreSQL's default name, or
    the name the naming convention gives it where the table is rebuilt (SQLite)."""
    if op.get_bind().dialect.name == "postgresql":
        return "model_versions_name_version_key"
    return "uq_model_versions_name"


def upgrade() -> None:
    with op.batch_alter_table("model_versions", naming_convention=UNNAMED) as batch:
        batch.drop_constraint(_global_constraint(), type_="unique")
        batch.create_unique_constraint(PER_PROJECT, ["project", "name", "version"])
    op.create_table(
        "sign_in_links",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("user", sa.String(64), sa.ForeignKey("users.name", ondelete="CASCADE"), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("sign_in_links")
    with op.batch_alter_table("model_versions", naming_convention=UNNAMED) as batch:
        batch.drop_constraint(PER_PROJECT, type_="unique")
        batch.create_unique_constraint(_global_constraint(), ["name", "version"])
