"""Jobs: submit, list, inspect, cancel, and their logs (a chunk, or followed as it is written)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from shipyard.api.deps import (
    LogOffset,
    Name,
    Reader,
    Served,
    Writer,
    checked_name,
    links,
    still_authenticated,
)
from shipyard.api.errors import PROBLEM_RESPONSES
from shipyard.errors import ShipyardError
from shipyard.schemas.requests import Submission
from shipyard.schemas.views import DeviceSeriesView, JobDetail, JobView, LogChunkView, MetricSeriesView
from shipyard.services.cluster import telemetry as device_telemetry
from shipyard.services.jobs import jobs as job_service
from shipyard.services.jobs import logs as log_service
from shipyard.services.jobs import metric_series, submissions

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], responses=PROBLEM_RESPONSES)
JOB_LINKS = links(201, {"job_id": "id"}, "getJob", "cancelJob", "jobLogs", "streamJobLogs")
LOG_POLL_S = 0.5
"""How often a log stream looks for new bytes."""


Filter = Annotated[str | None, Query(max_length=64)]


@router.get("", operation_id="listJobs", response_model=list[JobView])
def list_jobs(
    ctx: Reader,
    state: Annotated[str | None, Query(max_length=16)] = None,
    limit: Annotated[int, Query(ge=1, le=job_service.MAX_LISTED)] = 50,
    offset: Annotated[int, Query(ge=0, le=job_service.MAX_OFFSET)] = 0,
    project: Filter = None,
    queue: Filter = None,
    owner: Filter = None,
    accelerator_type: Filter = None,
) -> list[JobView]:
    """The newest jobs first; ``offset`` pages through the rest."""
    where = job_service.JobFilter(state, project, queue, owner, accelerator_type)
    return job_service.list_jobs(ctx, limit=limit, offset=offset, where=where)


IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=r"^[A-Za-z0-9._:-]{1,128}$",
        description="The client's name for this submission: sent again (a retry after a lost "
        "answer), it answers the job the first request created instead of creating another",
    ),
]


@router.post("", operation_id="submitJob", response_model=JobView, status_code=201, responses=JOB_LINKS)
async def submit_job(
    body: Submission, ctx: Writer, served: Served, idempotency_key: IdempotencyKey = None
) -> JobView:
    # Validated, checked and written by the process's submission writer, in its own thread: no
    # document, however large or wrong, costs the event loop more than reading its JSON.
    submission = submissions.Submission(ctx, body.spec, body.resume, body.resume_from, idempotency_key)
    return await asyncio.wrap_future(served.writer.submit(submission))


@router.get("/{job_id}", operation_id="getJob", response_model=JobDetail)
def get_job(job_id: Name, ctx: Reader) -> JobDetail:
    return job_service.get(ctx, checked_name(job_id))


@router.post("/{job_id}/cancel", operation_id="cancelJob", response_model=JobView)
def cancel_job(job_id: Name, ctx: Writer) -> JobView:
    return job_service.cancel(ctx, checked_name(job_id))


@router.get("/{job_id}/metrics", operation_id="jobMetrics", response_model=MetricSeriesView)
def job_metrics(
    job_id: Name,
    ctx: Reader,
    kind: Annotated[str, Query(max_length=16)] = "train",
    max_points: Annotated[int, Query(ge=1, le=metric_series.MAX_POINTS)] = 2000,
    after_step: Annotated[int, Query(ge=-1, le=2**31 - 1)] = -1,
) -> MetricSeriesView:
    """A job's loss, tokens/s, MFU and memory by step, downsampled to ``max_points`` (the
    dashboard's curves); ``after_step`` asks only for what a chart lacks."""
    return metric_series.series(
        ctx, checked_name(job_id), kind=kind, max_points=max_points, after_step=after_step
    )


@router.get("/{job_id}/telemetry", operation_id="jobTelemetry", response_model=list[DeviceSeriesView])
def job_telemetry(
    job_id: Name,
    ctx: Reader,
    max_points: Annotated[int, Query(ge=2, le=device_telemetry.MAX_POINTS)] = 300,
) -> list[DeviceSeriesView]:
    """The devices each attempt held, over its run: a job starved on input shows idle devices, a
    throttling GPU its reason."""
    return device_telemetry.job_telemetry(ctx, checked_name(job_id), max_points=max_points)


@router.get("/{job_id}/logs", operation_id="jobLogs", response_model=LogChunkView)
def job_logs(
    job_id: Name,
    ctx: Reader,
    offset: LogOffset = 0,
    attempt: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
) -> LogChunkView:
    """A chunk of the newest attempt's log (``attempt``: that attempt's) from ``offset`` on."""
    chunk = log_service.read_log(ctx, checked_name(job_id), offset, must_exist=False, attempt=attempt)
    return LogChunkView(
        data=chunk.data.decode("utf-8", "replace"), next_offset=chunk.next_offset, job_ended=chunk.job_ended
    )


@router.get(
    "/{job_id}/logs/stream",
    operation_id="streamJobLogs",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/plain": {}}}},
)
async def stream_job_logs(
    job_id: Name, ctx: Reader, served: Served, request: Request, offset: LogOffset = 0
) -> StreamingResponse:
    """The log from ``offset`` on as it is written, until the job ends (``curl -N``). The
    permission and the job's existence are checked before the first byte, and again, with the
    caller's token, at every look for more: a revoked token or a role taken away ends the stream."""
    first = await run_in_threadpool(log_service.read_log, ctx, checked_name(job_id), offset, must_exist=False)
    release = served.streams.acquire(ctx.actor.name)

    async def tail() -> AsyncIterator[bytes]:
        chunk = first
        while True:
            if chunk.data:
                yield chunk.data
            if chunk.job_ended:
                return
            await asyncio.sleep(LOG_POLL_S)
            try:
                await still_authenticated(request)
                chunk = await run_in_threadpool(
                    log_service.read_log, ctx, job_id, chunk.next_offset, must_exist=False
                )
            except ShipyardError:  # the credential or the role is gone: the stream ends here
                return

    return HeldStream(tail(), release, media_type="text/plain; charset=utf-8")


class HeldStream(StreamingResponse):
    """A stream that gives back the caller's place (``PerUser``) however it ends."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None], **options: Any) -> None:
        super().__init__(content, **options)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
