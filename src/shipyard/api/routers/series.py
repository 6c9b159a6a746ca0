"""Metric series: any scalar the runtime logged, of any jobs the caller may read (a chart, an
overlay of runs, a notebook's analysis)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from shipyard.api.deps import Reader, checked_name
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.schemas.views import MetricNamesView, PointSeriesView
from shipyard.services.jobs import metric_series

router = APIRouter(prefix="/api/v1/series", tags=["metrics"], responses=PROBLEM_RESPONSES)

JobIds = Annotated[list[str], Query(alias="job", min_length=1, max_length=metric_series.MAX_JOBS)]
SeriesNames = Annotated[list[str], Query(alias="name", min_length=1, max_length=metric_series.MAX_NAMES)]


@router.get("", operation_id="metricSeries", response_model=list[PointSeriesView])
def series(
    ctx: Reader,
    job_ids: JobIds,
    names: SeriesNames,
    max_points: Annotated[int, Query(ge=2, le=metric_series.MAX_POINTS)] = 1000,
    after_step: Annotated[int, Query(ge=-1, le=2**62)] = -1,
) -> list[PointSeriesView]:
    """Each named series of each job (``job`` and ``name`` repeated), at most ``max_points``
    points each: past that, each bucket of steps keeps its first and last point and its lowest
    and highest value. ``after_step`` asks only for what a chart lacks."""
    return metric_series.points(ctx, _checked(job_ids), names, max_points=max_points, after_step=after_step)


@router.get("/names", operation_id="metricNames", response_model=list[MetricNamesView])
def names(ctx: Reader, job_ids: JobIds) -> list[MetricNamesView]:
    """The names of the series each job logged."""
    return metric_series.metric_names(ctx, _checked(job_ids))


def _checked(job_ids: list[str]) -> list[str]:
    return [checked_name(job_id) for job_id in job_ids]
