"""Finding a job for a caller: it exists, and the caller holds the permission it needs on it."""

from __future__ import annotations

from typing import Literal

from sqlalchemy.orm import Session
from sqlalchemy.orm.interfaces import ORMOption

from shipyard.auth import Permission
from shipyard.db import Job
from shipyard.errors import NotFound
from shipyard.services.accounts import rbac
from shipyard.services.context import ServiceContext

Cancel = Literal["job.cancel"]
CANCEL: Cancel = "job.cancel"
"""To cancel a job: ``job.cancel.own`` for one's own, ``job.cancel.any`` for another's."""


def allowed_job(
    ctx: ServiceContext, session: Session, job_id: str, permission: Permission | Cancel, *options: ORMOption
) -> Job:
    """The job, if the caller may ``permission`` it (``CANCEL``: any job, or one's own). A job
    the caller may not even read is answered as one that does not exist."""
    job = find_job(session, job_id, *options)
    own = job.owner == ctx.actor.name
    if isinstance(permission, Permission):
        wanted = permission
    else:
        wanted = Permission.JOB_CANCEL_OWN if own else Permission.JOB_CANCEL_ANY
    if own and wanted in (Permission.JOB_READ, Permission.JOB_LOGS, Permission.JOB_CANCEL_OWN):
        return job
    resource = f"job/{job_id}"
    if own:
        rbac.require(ctx, session, wanted, resource, job.project)
    else:
        rbac.require_visible(
            ctx, session, wanted, resource, job.project, seen_with=Permission.JOB_READ, missing=no_job(job_id)
        )
    return job


def find_job(session: Session, job_id: str, *options: ORMOption) -> Job:
    job = session.get(Job, job_id, options=options)
    if job is None:
        raise no_job(job_id)
    return job


def no_job(job_id: str) -> NotFound:
    return NotFound(f"no job with id {job_id!r}", hint="`shipyard jobs list` shows job ids")


def may_cancel(ctx: ServiceContext, session: Session, job: Job) -> bool:
    """Whether ``cancel`` would be allowed (so a page offers it), without auditing a refusal."""
    own = job.owner == ctx.actor.name  # as ``allowed_job``: one's own job needs no role
    return own or rbac.allowed(session, ctx.actor, Permission.JOB_CANCEL_ANY, job.project)
