"""A job's training log, read from where its attempt ran: the newest attempt's, or any earlier one's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shipyard.auth import Permission
from shipyard.domain import JobState
from shipyard.errors import Conflict, InvalidSpec, NotFound
from shipyard.services.context import ServiceContext
from shipyard.services.jobs.access import allowed_job
from shipyard.services.jobs.jobs import MAX_OFFSET


@dataclass(frozen=True, slots=True)
class LogChunk:
    data: bytes
    next_offset: int
    job_ended: bool


def read_log(
    ctx: ServiceContext, job_id: str, offset: int = 0, *, must_exist: bool = True, attempt: int | None = None
) -> LogChunk:
    """The bytes of an attempt's log (default: the newest's) from ``offset`` on (empty while the
    job waits)."""
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidSpec(f"log offset {offset} is out of range", hint="give a byte offset from 0")
    with ctx.db.transaction() as session:
        job = allowed_job(ctx, session, job_id, Permission.JOB_LOGS)
        ended = JobState(job.state).is_final
        if not job.attempts:
            if must_exist:
                raise Conflict(
                    f"job {job_id} has not started yet ({job.pending_reason or job.state})",
                    hint=f"wait, or run `shipyard jobs logs {job_id} --follow`",
                )
            return LogChunk(b"", offset, ended)
        chosen = (
            job.attempts[-1]
            if attempt is None
            else next((a for a in job.attempts if a.number == attempt), None)
        )
        if chosen is None:
            raise NotFound(
                f"job {job_id} has no attempt {attempt}", hint=f"its attempts are 1 to {len(job.attempts)}"
            )
        node, path = chosen.node, Path(chosen.log_path)
    data = ctx.executor.read_log(node, path, offset)
    return LogChunk(data, offset + len(data), ended)
