"""What the live scheduler takes each job's speed to be: steps per second per accelerator type
(the planner's estimate scaled by peak FLOPS, replaced by what jobs of its shape measured, then
by what it measured itself), for an elastic job per size too, and what its last resize cost it;
and where each job's training stands (its last step)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shipyard.db import Attempt, Metric, MetricPoint
from shipyard.domain import ExitReason
from shipyard.services.caches.submitted_jobs import Submitted, aware


def last_steps(session: Session, job_ids: list[str]) -> dict[str, int]:
    if not job_ids:
        return {}
    rows = session.execute(
        select(Metric.job_id, func.max(Metric.step))
        .where(Metric.job_id.in_(job_ids), Metric.kind == "train")
        .group_by(Metric.job_id)
    )
    return {job_id: int(step or 0) for job_id, step in rows}


def measured_rates(session: Session, job_ids: list[str]) -> dict[str, dict[str, float]]:
    """Mean tokens/s of the training steps each job's attempts reported, by accelerator type:
    averaged in the database, as every pass asks it of every live job (a median would read a
    long run's every row, a million of them, on each pass; only ratios between types matter)."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(Attempt.job_id, Attempt.accelerator_type, func.avg(Metric.tokens_per_s))
        .join(Metric, Metric.attempt_id == Attempt.id)
        # On the metrics' (job, kind, step) index, not a scan of every job's metrics.
        .where(Metric.job_id.in_(job_ids), Metric.kind == "train", Metric.tokens_per_s.is_not(None))
        .group_by(Attempt.job_id, Attempt.accelerator_type)
    )
    measured: dict[str, dict[str, float]] = {}
    for job_id, accelerator_type, tokens_per_s in rows:
        if tokens_per_s is not None:
            measured.setdefault(job_id, {})[accelerator_type] = float(tokens_per_s)
    return measured


def measured_size_rates(session: Session, job_ids: list[str]) -> dict[str, dict[tuple[str, int], float]]:
    """Elastic jobs' mean tokens/s by accelerator type and size (processes of the attempt)."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(Attempt.job_id, Attempt.accelerator_type, Attempt.world_size, func.avg(Metric.tokens_per_s))
        .join(Metric, Metric.attempt_id == Attempt.id)
        .where(Metric.job_id.in_(job_ids), Metric.kind == "train", Metric.tokens_per_s.is_not(None))
        .where(Attempt.world_size.is_not(None))
        .group_by(Attempt.job_id, Attempt.accelerator_type, Attempt.world_size)
    )
    measured: dict[str, dict[tuple[str, int], float]] = {}
    for job_id, accelerator_type, world_size, tokens_per_s in rows:
        if tokens_per_s is not None:
            measured.setdefault(job_id, {})[(accelerator_type, int(world_size))] = float(tokens_per_s)
    return measured


def size_rates(
    job: Submitted, peaks: dict[str, float], measured: Mapping[tuple[str, int], float]
) -> dict[tuple[str, int, str], float]:
    """An elastic job's steps/s at each size it may run at, per accelerator type: what it
    measured at the sizes it ran at, and at the others the nearest measured size's figure in
    proportion to the devices (before any measurement on a type: the planner's, at its largest
    size, in proportion)."""
    planned = type_rates(job, peaks, {})
    sizes, largest = job.never_ran.sizes, job.never_ran.sizes[-1]
    rates: dict[tuple[str, int, str], float] = {}
    for accelerator_type, rate in planned.items():
        ran = {
            world_size * job.unit: tokens_per_s / job.batch_tokens
            for (kind, world_size), tokens_per_s in measured.items()
            if kind == accelerator_type and tokens_per_s > 0
        }
        for size in sizes:
            if size in ran:
                rates[(job.never_ran.id, size, accelerator_type)] = ran[size]
            elif ran:
                nearest = min(ran, key=lambda m: (abs(m - size), m))
                rates[(job.never_ran.id, size, accelerator_type)] = ran[nearest] * size / nearest
            else:
                rates[(job.never_ran.id, size, accelerator_type)] = rate * size / largest
    return rates


def first_steps(session: Session, attempt_ids: list[int]) -> dict[int, float]:
    """When each attempt logged its first training step (seconds since the epoch)."""
    if not attempt_ids:
        return {}
    rows = session.execute(
        select(MetricPoint.attempt_id, func.min(MetricPoint.at))
        .where(MetricPoint.attempt_id.in_(attempt_ids), MetricPoint.name == "loss")
        .group_by(MetricPoint.attempt_id)
    )
    return {attempt_id: float(at) for attempt_id, at in rows if at is not None}


def resize_cost(attempts: Sequence[Any], first_steps: Mapping[int, float]) -> float | None:
    """What the job's last resize cost it: from the scheduler's stop of the resized attempt to
    the first step of the next (its checkpoint, restart and reload); None before any."""
    for before, after in reversed(list(itertools.pairwise(attempts))):
        if before.exit_reason == ExitReason.RESIZED and before.signalled_at and after.id in first_steps:
            return max(0.0, first_steps[after.id] - aware(before.signalled_at).timestamp())
    return None


def type_rates(job: Submitted, peaks: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    """Steps/s per accelerator type: measured where the job ran, else where a job of its shape
    ran, else the planner's estimate scaled by peak FLOPS, else the peak alone (only the ratios
    between types matter then)."""
    allowed = [k for k in job.accelerator_types if k in peaks]
    base_type, batch_tokens = job.planned_on, job.batch_tokens
    base_rate = job.planned_tokens_per_s / batch_tokens
    rates = {}
    for accelerator_type in allowed:
        if base_type in peaks and base_rate > 0:
            rates[accelerator_type] = base_rate * peaks[accelerator_type] / peaks[base_type]
        else:
            rates[accelerator_type] = peaks[accelerator_type]
    for accelerator_type, tokens_per_s in [*job.shape_tokens_per_s.items(), *measured.items()]:
        if accelerator_type in rates and tokens_per_s > 0:
            rates[accelerator_type] = tokens_per_s / batch_tokens
    return rates
