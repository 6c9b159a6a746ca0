"""Device telemetry as chart series: a node's devices over the last hours, or the devices each
attempt of a job ran on, over its run. Averaged into time buckets in the database, so a month of
samples every few seconds reads as a few hundred points."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Integer, cast, func, select
from sqlalchemy.orm import Session

from shipyard.auth import Permission
from shipyard.db import Attempt, DeviceSample
from shipyard.errors import InvalidSpec
from shipyard.hardware.telemetry import FIGURES
from shipyard.schemas.views import DeviceSeriesView
from shipyard.services.context import ServiceContext
from shipyard.services.jobs.access import allowed_job

MAX_POINTS = 2000
MAX_HOURS = 24 * 31


def node_telemetry(
    ctx: ServiceContext, node: str, *, hours: float = 1.0, max_points: int = 300
) -> list[DeviceSeriesView]:
    """Each device of ``node`` over the last ``hours``, at most ``max_points`` points each."""
    _check(hours, max_points)
    until = time.time()
    with ctx.db.read() as session:
        return _series(session, node, None, until - hours * 3600, until, max_points, attempt=None)


def job_telemetry(ctx: ServiceContext, job_id: str, *, max_points: int = 300) -> list[DeviceSeriesView]:
    """The devices each attempt of the job held, over the attempt's run (a CPU attempt: the host)."""
    _check(1.0, max_points)
    with ctx.db.read() as session:
        allowed_job(ctx, session, job_id, Permission.JOB_READ)
        attempts = session.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number))
        series = []
        for attempt in attempts:
            if attempt.node is None:
                continue
            devices = (
                ["cpu"] if attempt.accelerator_type == "cpu" else [str(i) for i in attempt.device_ids or []]
            )
            until = attempt.finished_at.timestamp() if attempt.finished_at else time.time()
            series += _series(
                session,
                attempt.node,
                devices,
                attempt.started_at.timestamp(),
                until,
                max_points,
                attempt=attempt.number,
            )
        return series


def _check(hours: float, max_points: int) -> None:
    if not 0 < hours <= MAX_HOURS:
        raise InvalidSpec(
            f"hours must be above 0 and at most {MAX_HOURS}, got {hours}", hint="ask for a month or less"
        )
    if not 2 <= max_points <= MAX_POINTS:
        raise InvalidSpec(f"max_points must be 2 to {MAX_POINTS}, got {max_points}", hint="ask for fewer")


def _series(
    session: Session,
    node: str,
    devices: list[str] | None,
    since: float,
    until: float,
    max_points: int,
    *,
    attempt: int | None,
) -> list[DeviceSeriesView]:
    width = max((until - since) / max_points, 1e-3)
    # An integer cast (SQLite truncates, PostgreSQL rounds: either way one bucket per interval).
    bucket = cast((DeviceSample.at - since) / width, Integer).label("bucket")
    query = (
        select(
            DeviceSample.device, bucket, func.avg(DeviceSample.at),
            *(func.avg(getattr(DeviceSample, figure)) for figure in FIGURES), func.max(DeviceSample.throttle),
        )
        .where(DeviceSample.node == node, DeviceSample.at >= since, DeviceSample.at <= until)
        .group_by(DeviceSample.device, bucket)
        .order_by(DeviceSample.device, bucket)
    )  # fmt: skip
    if devices is not None:
        query = query.where(DeviceSample.device.in_(devices))
    columns: dict[str, dict[str, list[Any]]] = {}
    for device, _, at, *figures, throttle in session.execute(query):
        column = columns.setdefault(device, {name: [] for name in ("at", *FIGURES, "throttle")})
        column["at"].append(round(at, 3))
        for name, value in zip(FIGURES, figures, strict=True):
            column[name].append(None if value is None else round(float(value), 4))
        column["throttle"].append(throttle)
    return [
        DeviceSeriesView(node=node, device=device, attempt=attempt, bucket_s=round(width, 3), **column)
        for device, column in sorted(columns.items(), key=lambda item: (item[0] != "cpu", item[0]))
    ]
