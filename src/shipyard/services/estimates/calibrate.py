"""This cluster's own compute efficiency on each accelerator type, fitted from what its jobs
measured against what the planner had predicted for them (``shape_measurements``).

The factor multiplies the planner's large-GEMM efficiency of the type. It is fitted as a factor on
throughput (the geometric mean of measured over planned tokens/s), which is what it is for the
compute-bound steps of one node; the part of a step spent in collectives does not scale with it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from shipyard import audit
from shipyard.auth import Permission
from shipyard.db import DeviceCalibration, ShapeMeasurement
from shipyard.db.base import utcnow
from shipyard.planner.calibration import CALIBRATION, Calibration
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext

HELD_OUT_ROWS = 3
"""Shapes of a type below which a leave-one-out error would say nothing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceFit:
    accelerator_type: str
    rows: int
    """Shapes of job measured on the type."""
    efficiency: float
    """The fitted factor on the planner's efficiency for the type."""
    error_before: float
    """Median absolute error of the planner's tokens/s against the measured, with the catalog's
    efficiency (no factor)."""
    error_after: float
    """The same with the fitted factor, on the rows it was fitted on."""
    error_held_out: float | None
    """The same with each row predicted by the factor fitted on the others (the figure to
    trust), where there are at least ``HELD_OUT_ROWS``."""


def cluster_calibration(session: Session) -> Calibration:
    """The planner's calibration with this cluster's fitted factors, as estimates use it."""
    fitted = list(session.scalars(select(DeviceCalibration)))
    if not fitted:
        return CALIBRATION
    return replace(
        CALIBRATION,
        device_efficiency=MappingProxyType({row.accelerator_type: row.efficiency for row in fitted}),
        device_runs=MappingProxyType({row.accelerator_type: row.rows for row in fitted}),
    )


def calibrate(ctx: ServiceContext, *, save_fits: bool) -> list[DeviceFit]:
    """Fit every accelerator type with measurements; with ``save_fits``, make the fits the
    cluster's calibration (an admin's change, like the queues: the scheduler plans with it)."""
    with ctx.db.transaction() as session:
        if save_fits:
            rbac.require(ctx, session, Permission.QUEUE_MANAGE, "calibration")
        fits = fit(session)
        if save_fits and fits:
            save(session, fits)
            detail = {f.accelerator_type: round(f.efficiency, 4) for f in fits}
            audit.append(session, ctx.audit_key, ctx.actor, "planner.calibrate", "calibration", detail=detail)
    return fits


def fit(session: Session) -> list[DeviceFit]:
    """One fit per accelerator type with measured throughput, from the planner's figures taken
    back to the catalog's efficiency (each was planned with the factor then in force)."""
    ratios: dict[str, list[float]] = {}
    rows = session.scalars(
        select(ShapeMeasurement).where(
            ShapeMeasurement.measured_tokens_per_s > 0, ShapeMeasurement.planned_tokens_per_s > 0
        )
    )
    for row in rows:
        assert row.measured_tokens_per_s is not None and row.planned_tokens_per_s is not None
        uncalibrated = row.planned_tokens_per_s / (row.planned_efficiency or 1.0)
        ratios.setdefault(row.accelerator_type, []).append(row.measured_tokens_per_s / uncalibrated)
    return [_fit_one(kind, found) for kind, found in sorted(ratios.items())]


def _fit_one(accelerator_type: str, ratios: Sequence[float]) -> DeviceFit:
    factor = _geometric_mean(ratios)
    held_out = None
    if len(ratios) >= HELD_OUT_ROWS:
        held_out = _error(
            [r / _geometric_mean([*ratios[:i], *ratios[i + 1 :]]) for i, r in enumerate(ratios)]
        )
    return DeviceFit(
        accelerator_type=accelerator_type,
        rows=len(ratios),
        efficiency=factor,
        error_before=_error(ratios),
        error_after=_error([r / factor for r in ratios]),
        error_held_out=held_out,
    )


def _geometric_mean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _error(measured_over_planned: Sequence[float]) -> float:
    """Median of |planned / measured - 1|."""
    return statistics.median(abs(1 / r - 1) for r in measured_over_planned)


def save(session: Session, fits: Sequence[DeviceFit]) -> None:
    """Make ``fits`` the cluster's calibration: later estimates plan with them."""
    session.execute(delete(DeviceCalibration))
    now = utcnow()
    for f in fits:
        session.add(
            DeviceCalibration(
                accelerator_type=f.accelerator_type,
                efficiency=f.efficiency,
                rows=f.rows,
                error_before=f.error_before,
                error_after=f.error_held_out if f.error_held_out is not None else f.error_after,
                fitted_at=now,
            )
        )
