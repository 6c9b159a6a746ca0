"""Metrics as a time series of named scalars (any number the runtime logs, each on its own
steps), and the devices' telemetry sampled by each node's agent. The scalars of the records
already ingested are copied into the series.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 07:00:00
"""

import math
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_EVENTS = {"start", "resume", "checkpoint"}
_NOT_FIGURES = {"kind", "step", "time"}


def upgrade() -> None:
    points = op.create_table(
        "metric_points",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column(
            "attempt_id", sa.Integer(), sa.ForeignKey("attempts.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
    )
    op.create_index("ix_metric_points_job_name_step", "metric_points", ["job_id", "name", "step"])
    op.create_table(
        "device_samples",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("device", sa.String(32), nullable=False),
        sa.Column("at", sa.Double(), nullable=False),
        *(
            sa.Column(name, sa.Double(), nullable=True)
            for name in ("utilization", "memory_gib", "power_w", "temperature_c", "clock_mhz", "io_mib_s")
        ),
        sa.Column("throttle", sa.String(128), nullable=True),
    )
    op.create_index("ix_device_samples_node_device_at", "device_samples", ["node", "device", "at"])
    _copy_recorded_metrics(points)


def _copy_recorded_metrics(points: sa.Table) -> None:
    """Each recorded training or eval line's numbers become points, logged at the attempt's start
    plus the seconds the line says had passed (the records kept no clock of their own)."""
    bind = op.get_bind()
    metrics = sa.table(
        "metrics", sa.column("job_id"), sa.column("attempt_id"), sa.column("kind"), sa.column("step"),
        sa.column("values", sa.JSON()),
    )  # fmt: skip
    attempts = sa.table("attempts", sa.column("id"), sa.column("started_at", sa.DateTime(timezone=True)))
    rows = bind.execute(sa.select(attempts.c.id, attempts.c.started_at))
    started = {row.id: row.started_at for row in rows}
    batch: list[dict[str, object]] = []
    for row in bind.execute(sa.select(metrics).where(metrics.c.kind.notin_(_EVENTS))):
        values = row.values if isinstance(row.values, dict) else {}
        begun = started.get(row.attempt_id)
        at = (begun.timestamp() if begun else 0.0) + float(values.get("elapsed_s") or 0.0)
        for key, value in values.items():
            if key in _NOT_FIGURES or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(value) or len(key) > 48:
                continue
            name = key if row.kind == "train" else f"{row.kind}_{key}"
            batch.append(
                {"job_id": row.job_id, "attempt_id": row.attempt_id, "name": name, "step": row.step,
                 "value": float(value), "at": at}
            )  # fmt: skip
        if len(batch) >= 5000:
            bind.execute(sa.insert(points), batch)
            batch = []
    if batch:
        bind.execute(sa.insert(points), batch)


def downgrade() -> None:
    op.drop_table("device_samples")
    op.drop_table("metric_points")
