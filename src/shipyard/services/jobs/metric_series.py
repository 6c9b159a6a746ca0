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

from sqlalchemy import BindParameter, bindparam, func, select
from sqlalchemy.orm import Session

from shipyard.auth import Permission
from shipyard.db import Metric, MetricPoint
from shipyard.errors import InvalidSpec
from shipyard.schemas.views import MetricNamesView, MetricSeriesView, PointSeriesView
from shipyard.services.context import ServiceContext
from shipyard.services.jobs.access import allowed_job

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


# The time series of named scalars: any number the runtime logged, each on its own steps.

MAX_JOBS = 20
MAX_NAMES = 32


def metric_names(ctx: ServiceContext, job_ids: list[str]) -> list[MetricNamesView]:
    """For each job, the names of the series it logged and what turns a step into tokens."""
    _check_counts(job_ids, ["-"])
    with ctx.db.read() as session:
        jobs = [allowed_job(ctx, session, job_id, Permission.JOB_READ) for job_id in dict.fromkeys(job_ids)]
        views = []
        for job in jobs:
            names = session.scalars(
                select(MetricPoint.name).where(MetricPoint.job_id == job.id).group_by(MetricPoint.name)
            )
            views.append(
                MetricNamesView(
                    job_id=job.id, job_name=job.name, state=job.state, names=sorted(names),
                    tokens_per_step=_tokens_per_step(job.spec),
                )
            )  # fmt: skip
        return views


def points(
    ctx: ServiceContext, job_ids: list[str], names: list[str], *, max_points: int = 1000, after_step: int = -1
) -> list[PointSeriesView]:
    """Each job's series of each name after ``after_step``, at most ``max_points`` points each.
    Past that, the steps are cut into buckets and each keeps its first and last point and its
    lowest and highest value (``low``/``high``): a spike between kept points is never hidden."""
    _check_counts(job_ids, names)
    if not 2 <= max_points <= MAX_POINTS:
        raise InvalidSpec(f"max_points must be 2 to {MAX_POINTS}, got {max_points}", hint="ask for fewer")
    with ctx.db.read() as session:
        for job_id in dict.fromkeys(job_ids):
            allowed_job(ctx, session, job_id, Permission.JOB_READ)
        return [
            _points_of(session, job_id, name, max_points, after_step)
            for job_id in dict.fromkeys(job_ids)
            for name in dict.fromkeys(names)
        ]


def _check_counts(job_ids: list[str], names: list[str]) -> None:
    if not 1 <= len(job_ids) <= MAX_JOBS:
        raise InvalidSpec(f"name 1 to {MAX_JOBS} jobs, got {len(job_ids)}", hint="pass `job` once per job")
    if not 1 <= len(names) <= MAX_NAMES:
        raise InvalidSpec(
            f"name 1 to {MAX_NAMES} series, got {len(names)}", hint="pass `name` once per series"
        )


def _tokens_per_step(spec: Any) -> int | None:
    training = spec.get("training") if isinstance(spec, dict) else None
    value = training.get("global_batch_tokens") if isinstance(training, dict) else None
    return value if isinstance(value, int) else None


def _points_of(session: Session, job_id: str, name: str, max_points: int, after_step: int) -> PointSeriesView:
    where = (MetricPoint.job_id == job_id, MetricPoint.name == name, MetricPoint.step > after_step)
    view = PointSeriesView(job_id=job_id, name=name, step=[], value=[], at=[], bucket_steps=1, last_step=None)
    # The first max_points + 1 points along the index: all of a short series (a live chart's next
    # points), or the proof that a long one must be cut into buckets.
    rows = session.execute(
        select(MetricPoint.step, MetricPoint.value, MetricPoint.at)
        .where(*where)
        .order_by(MetricPoint.step, MetricPoint.id)
        .limit(max_points + 1)
    ).all()
    newest = {row.step: row for row in rows}  # a step a resumed attempt logged again: its newest value
    if len(rows) <= max_points:
        ordered = list(newest.values())
        if not ordered:
            return view
        return view.model_copy(
            update={
                "step": [row.step for row in ordered], "value": [row.value for row in ordered],
                "at": [row.at for row in ordered], "last_step": ordered[-1].step,
            }
        )  # fmt: skip
    first = rows[0].step
    last = session.scalar(select(func.max(MetricPoint.step)).where(*where))
    assert last is not None
    width = math.ceil((last - first + 1) / (max_points // 2))  # two points (first and last) a bucket
    bucket = (MetricPoint.step - first) // width
    buckets = session.execute(
        select(
            func.min(MetricPoint.step), func.max(MetricPoint.step), func.min(MetricPoint.value),
            func.max(MetricPoint.value),
        ).where(*where).group_by(bucket).order_by(func.min(MetricPoint.step))
    ).all()  # fmt: skip
    # The steps are written into the statement (numbers only): bound, the driver prepares the
    # statement after a few calls, and PostgreSQL's generic plan of it took 2.5 s, not 10 ms.
    ends: BindParameter[list[int]] = bindparam(
        "ends", sorted({step for row in buckets for step in row[:2]}), literal_execute=True
    )
    at_ends = {
        row.step: row
        for row in session.execute(
            select(MetricPoint.step, MetricPoint.value, MetricPoint.at)
            .where(*where, MetricPoint.step.in_(ends))
            .order_by(MetricPoint.id)
        )
    }
    kept = [
        (at_ends[step], low, high)
        for first_step, last_step, low, high in buckets
        for step in dict.fromkeys((first_step, last_step))
    ]
    return view.model_copy(
        update={
            "step": [row.step for row, _, _ in kept], "value": [row.value for row, _, _ in kept],
            "at": [row.at for row, _, _ in kept], "low": [low for _, low, _ in kept],
            "high": [high for _, _, high in kept], "bucket_steps": width, "last_step": kept[-1][0].step,
        }
    )  # fmt: skip
