"""Where ``shipyard jobs`` sends its work: the embedded platform, or the server at
``SHIPYARD_URL`` (after ``shipyard login``) through the Python client. One interface, so each
command is written once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from shipyard.cli._remote import client, server_url
from shipyard.daemon.supervisor import Supervisor
from shipyard.schemas.views import JobDetail, JobView
from shipyard.services.context import ServiceContext
from shipyard.services.jobs import jobs as job_service
from shipyard.services.jobs import logs as log_service


class Jobs(Protocol):
    def submit(self, spec: Path, *, resume: bool, resume_from: str | None) -> JobView: ...
    def list(self, state: str | None, limit: int) -> list[JobView]: ...
    def get(self, job_id: str) -> JobDetail: ...
    def status(self, job_id: str) -> JobView: ...
    def cancel(self, job_id: str) -> JobView: ...
    def log(
        self, job_id: str, offset: int, *, must_exist: bool, attempt: int | None = None
    ) -> log_service.LogChunk: ...


class Embedded:
    def __init__(self, ctx: ServiceContext | None = None) -> None:
        from shipyard.services.context import open_context

        self.ctx = ctx or open_context(start_agent=Supervisor())

    def submit(self, spec: Path, *, resume: bool, resume_from: str | None) -> JobView:
        return job_service.submit(
            self.ctx, job_service.load_spec_file(spec), resume=resume, resume_from=resume_from
        )

    def list(self, state: str | None, limit: int) -> list[JobView]:
        job_service.revive_agent(self.ctx)  # whoever looks at the jobs keeps them served
        return job_service.list_jobs(self.ctx, state=state, limit=limit)

    def get(self, job_id: str) -> JobDetail:
        job_service.revive_agent(self.ctx)
        return job_service.get(self.ctx, job_id)

    def status(self, job_id: str) -> JobView:
        job_service.revive_agent(self.ctx)
        return job_service.status(self.ctx, job_id)

    def cancel(self, job_id: str) -> JobView:
        return job_service.cancel(self.ctx, job_id)

    def log(
        self, job_id: str, offset: int, *, must_exist: bool, attempt: int | None = None
    ) -> log_service.LogChunk:
        return log_service.read_log(self.ctx, job_id, offset, must_exist=must_exist, attempt=attempt)


class Remote:
    """The server checks and runs everything; paths in a spec must exist where it runs (a shared
    filesystem), or name ``store:`` datasets."""

    def __init__(self) -> None:
        self.client = client()

    def submit(self, spec: Path, *, resume: bool, resume_from: str | None) -> JobView:
        document = job_service.load_spec_file(spec).model_dump(mode="json", by_alias=True)
        return self.client.submit_job(document, resume=resume, resume_from=resume_from)

    def list(self, state: str | None, limit: int) -> list[JobView]:
        return self.client.list_jobs(state, limit)

    def get(self, job_id: str) -> JobDetail:
        return self.client.get_job(job_id)

    def status(self, job_id: str) -> JobView:
        return self.get(job_id)

    def cancel(self, job_id: str) -> JobView:
        return self.client.cancel_job(job_id)

    def log(
        self, job_id: str, offset: int, *, must_exist: bool, attempt: int | None = None
    ) -> log_service.LogChunk:
        del must_exist  # the server answers an empty chunk for a job that has not started
        chunk = self.client.job_logs(job_id, offset, attempt=attempt)
        return log_service.LogChunk(chunk.data.encode(), chunk.next_offset, chunk.job_ended)


@contextmanager
def jobs() -> Iterator[Jobs]:
    """The configured server's jobs, else the embedded platform's; closed after the command."""
    if server_url():
        remote = Remote()
        with remote.client:
            yield remote
        return
    embedded = Embedded()
    try:
        yield embedded
    finally:
        embedded.ctx.close()
