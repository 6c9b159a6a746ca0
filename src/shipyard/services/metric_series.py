"""A job's metric history as chart series, downsampled in the database.

A long run logs a point every few steps: a million of them is more than a chart can show or a
page can wait for. The series keeps every ``stride``-th logged step, stride chosen from the
first, second and last step (three index seeks) so that at most ``max_points`` come back; the
filter is on the (job, kind, step) index, so only the rows kept are read. A chart that already
holds the history asks for what came after its last step.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shipyard.auth import Permission
from shipyard.db import Metric
from shipyard.errors import InvalidSpec
from shipyard.schemas.views import MetricSeriesView
from shipyard.services.context import ServiceContext
from shipyard.services.job_access import allowed_job

KINDS = ("train", "eval")
MAX_POINTS = 20_000
"""Most points one answer holds."""


def series(
    ctx: ServiceContext, job_id: str, *, kind: str = "train", max_points: int = 2000, after_step: int = -1
) -> MetricSeriesView:
    """The job's ``kind`` metrics after ``after_step``, at most ``max_points`` of them."""
    if kind not in KINDS:
        raise InvalidSpec(f"unknown metric kind {kind!r}", hint=f"use one of: {', '.join(KINDS)}")
    if not 1 <= max_points <= MAX_POINTS:
        raise InvalidSpec(f"max_points must be 1 to {MAX_POINTS}, got {max_points}", hint="ask for fewer")
    with ctx.db.read() as session:
        allowed_job(ctx, session, job_id, Permission.JOB_READ)
        return _downsampled(session, job_id, kind, max_points, after_step)


def sampled(session: Session, job_id: str, kind: str, max_points: int) -> list[Metric]:
    """The job's ``kind`` metrics as rows, every stride-th logged step and the newest, in the
    order they were recorded: what a job's summary is computed from (exact up to ``max_points``
    logged steps; beyond, its medians and peak are those of an even sample)."""
    where = (Metric.job_id == job_id, Metric.kind == kind)
    kept = _kept(session, where, max_points)
    if kept is None:
        return []
    condition, _ = kept
    return list(session.scalars(select(Metric).where(*where).where(condition).order_by(Metric.id)))


def _kept(session: Session, where: tuple[Any, ...], max_points: int) -> tuple[Any, int] | None:
    """The filter that keeps at most ``max_points`` of the rows ``where`` selects (every
    stride-th logged step from the first, and the last), and the stride; None when none is."""

    def step_at(*order: Any, above: int | None = None) -> int | None:
        query = select(Metric.step).where(*where).order_by(*order).limit(1)
        if above is not None:
            query = query.where(Metric.step > above)
        return session.scalar(query)

    first = step_at(Metric.step)
    if first is None:
        return None
    last = step_at(Metric.step.desc())
    assert last is not None
    second = step_at(Metric.step, above=first)
    interval = max(1, (second - first) if second is not None else 1)
    logged = (last - first) // interval + 1
    stride = interval * max(1, math.ceil(logged / max(1, max_points - 1)))  # one place kept for the last
    return ((Metric.step - first) % stride == 0) | (Metric.step == last), stride


def _downsampled(
    session: Session, job_id: str, kind: str, max_points: int, after_step: int
) -> MetricSeriesView:
    where = (Metric.job_id == job_id, Metric.kind == kind, Metric.step > after_step)
    empty = MetricSeriesView(
        job_id=job_id,
        kind=kind,
        step=[],
        loss=[],
        tokens_per_s=[],
        mfu=[],
        mem_gib=[],
        stride=1,
        last_step=None,
    )
    kept = _kept(session, where, max_points)
    if kept is None:
        return empty
    condition, stride = kept
    query = (
        select(Metric.step, Metric.loss, Metric.tokens_per_s, Metric.mfu, Metric.values["mem_gib"].as_float())
        .where(*where)
        .where(condition)
        .order_by(Metric.step, Metric.id)
    )
    newest: dict[int, tuple[Any, ...]] = {}
    for row in session.execute(query):
        newest[row[0]] = tuple(row)  # a step logged again by a resumed attempt: its newest value
    if not newest:
        return empty
    steps, losses, rates, mfus, memory = (list(column) for column in zip(*newest.values(), strict=True))
    return MetricSeriesView(
        job_id=job_id,
        kind=kind,
        step=steps,
        loss=losses,
        tokens_per_s=rates,
        mfu=mfus,
        mem_gib=memory,
        stride=stride,
        last_step=steps[-1],
    )
