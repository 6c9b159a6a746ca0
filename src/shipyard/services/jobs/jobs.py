"""Job use cases: submit, list, show, cancel, logs."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Connection, String, Table, func, insert, or_, select, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload

from shipyard import audit
from shipyard.auth import Permission
from shipyard.db import AgentStatus, Artifact, Attempt, Database, Job, Metric, rows_changed
from shipyard.db.base import utcnow
from shipyard.db.pipeline import pipelined
from shipyard.domain import ExitReason, JobState
from shipyard.domain.transitions import job_transition
from shipyard.errors import Conflict, InvalidSpec
from shipyard.executors.processes import has_ended
from shipyard.scheduling.status import Reason
from shipyard.schemas.documents import read_document_file
from shipyard.schemas.estimate import Estimate
from shipyard.schemas.jobspec import STORE_SCHEME, JobSpec, parse_job_spec, stored_job_spec, validate_job_spec
from shipyard.schemas.views import ArtifactView, AttemptView, JobDetail, JobView
from shipyard.services.accounts import rbac
from shipyard.services.caches.submitted_jobs import aware
from shipyard.services.context import ServiceContext
from shipyard.services.estimates import plan_gaps
from shipyard.services.jobs import metric_series
from shipyard.services.jobs.access import CANCEL, allowed_job, find_job
from shipyard.services.jobs.submission_checks import Checked, check_submission
from shipyard.services.jobs.summaries import summarize

_log = logging.getLogger("shipyard.jobs")
_JOBS = cast(Table, Job.__table__)


def load_spec_file(path: Path) -> JobSpec:
    """Read and validate a job spec file; relative paths inside it are taken from its folder."""
    spec = parse_job_spec(read_document_file(path), source=str(path))
    return absolutize(spec, path.resolve().parent)


def absolutize(spec: JobSpec, base: Path) -> JobSpec:
    def resolve(p: str) -> str:
        expanded = Path(p).expanduser()
        return str(expanded if expanded.is_absolute() else base / expanded)

    document = spec.model_dump(mode="json", by_alias=True)
    document["data"]["paths"] = [p if p.startswith(STORE_SCHEME) else resolve(p) for p in spec.data.paths]
    if spec.data.tokenizer.path:
        document["data"]["tokenizer"]["path"] = resolve(spec.data.tokenizer.path)
    if spec.model.local_path:
        document["model"]["path"] = resolve(spec.model.local_path)
    return validate_job_spec(document)


def submit(
    ctx: ServiceContext,
    spec: JobSpec,
    *,
    resume: bool = False,
    resume_from: str | None = None,
) -> JobView:
    """Validate everything that can be known before launch, then queue the job (the server
    batches the writes of concurrent submissions: ``submissions.SubmissionWriter``)."""
    # The run directory is made by the agent that launches the job, on its own node.
    [view] = insert_jobs(ctx.db, [check_submission(ctx, spec, resume, resume_from)])
    if ctx.start_agent is not None:
        ctx.start_agent(ctx.settings)
    return view


def require_submitter(ctx: ServiceContext) -> None:
    """Refuse a caller who may submit jobs to no project before its spec is even read."""
    with ctx.db.read() as session:
        rbac.require_somewhere(ctx, session, Permission.JOB_SUBMIT, "jobs")


def submitted_before(ctx: ServiceContext, key: str, spec: JobSpec) -> JobView | None:
    """The caller's job that a submission with idempotency ``key`` created, if one did (the
    request is a retry whose answer was lost); a key sent with another job's spec is refused."""
    with ctx.db.read() as session:
        job = session.scalar(select(Job).where(Job.owner == ctx.actor.name, Job.idempotency_key == key))
        if job is None:
            return None
        if (job.name, job.project) != (spec.name, spec.project):
            raise Conflict(
                f"idempotency key {key!r} already created job {job.id} ({job.project}/{job.name}), "
                f"not {spec.project}/{spec.name}",
                hint="send a new key for each new submission; the same key only to retry one",
            )
        return _view(job, stored_job_spec(job.spec))


AGENT_SILENT_S = 10.0
"""No agent pass for this long (and at least five of the slowest poll intervals): none schedules."""
STANDBY_LOOKS = 3
"""Poll intervals waited after the agent that scheduled is known dead (a standby of another
home looks for the lead once in each)."""


def revive_agent(ctx: ServiceContext) -> None:
    """Start the home's agent again if jobs are queued or running (or this process sees a
    cluster through the agent's record, which must stay current) and no agent has scheduled
    for a while (its machine rebooted, its cluster's head was away), or a few polls after the
    last one, of this host, ended (it was killed): the new one adopts the attempts that still
    run and the restart policy requeues the others. A standby agent of the same database
    (another home) that took the lead counts as serving them."""
    if ctx.start_agent is None:
        return
    with ctx.db.read() as session:
        live = session.scalar(
            select(Job.id).where(Job.state.in_([JobState.QUEUED, JobState.RUNNING])).limit(1)
        )
        last = session.execute(
            select(AgentStatus.agent_id, AgentStatus.last_pass_at).order_by(AgentStatus.last_pass_at.desc())
        ).first()
    if live is None and not ctx.reads_recorded_inventory:
        return
    silent = max(AGENT_SILENT_S, 5 * ctx.settings.agent_max_poll_s)
    if last is not None and _ended_here(last.agent_id):
        # Known dead, not just quiet: only a standby's next look (one poll) is waited for, so
        # that one that takes the lead is not raced by a new agent.
        silent = STANDBY_LOOKS * ctx.settings.agent_poll_s
    if last is not None and (utcnow() - aware(last.last_pass_at)).total_seconds() < silent:
        return
    ctx.start_agent(ctx.settings)


def _ended_here(agent_id: str) -> bool:
    """Whether ``agent_id`` (``host:pid``) was an agent of this host whose process has ended (or
    is a zombie nobody reaped): then none schedules now, and there is no silence to wait out,
    which only tells that an agent of another host stopped."""
    host, _, pid = agent_id.rpartition(":")
    return host == os.uname().nodename and pid.isdigit() and has_ended(int(pid))


def write(connection: Connection, batch: list[Checked]) -> list[JobView]:
    """Queue checked submissions in the caller's transaction: the jobs in one multi-row insert,
    then their audit records (last, so the audit head, which every append locks, is held only
    until the commit). Core statements only: the hottest write needs no ORM session."""
    ids = _new_job_ids([a.spec.name for a in batch])
    now = utcnow()
    rows, views, entries = [], [], []
    for job_id, checked in zip(ids, batch, strict=True):
        spec, request, ctx = checked.spec, checked.request, checked.ctx
        row = {
            "id": job_id,
            "name": spec.name,
            "project": spec.project,
            "queue": spec.queue,
            "priority": spec.priority,
            "state": JobState.QUEUED,
            "spec": spec.model_dump(mode="json", by_alias=True),
            "devices": request.devices,
            "accelerator_types": list(request.accelerator_types),
            "run_dir": str(ctx.settings.runs_dir / job_id),
            "resume_from": str(checked.resume_from) if checked.resume_from else None,
            "pending_reason": "waiting for the local agent to pick it up",
            "pending_code": Reason.WAITING.value,
            "estimate": None
            if checked.estimate is None
            else checked.estimate.model_dump(mode="json", exclude_none=True),
            "owner": ctx.actor.name,
            "submitted_at": now,
            "idempotency_key": checked.idempotency_key,
        }
        rows.append(row)
        views.append(_view(Job(**row), spec).model_copy(update={"warnings": list(checked.warnings)}))
        detail = {"project": spec.project, "queue": spec.queue, "devices": request.devices}
        entries.append(audit.Entry(ctx.actor, "job.submit", f"job/{job_id}", detail=detail))
    with pipelined(connection):  # three round trips instead of six on PostgreSQL
        connection.execute(insert(_JOBS), rows)
        audit.append_all(connection, batch[0].ctx.audit_key, entries)
    return views


ID_DRAWS = 3


def insert_jobs(db: Database, batch: list[Checked]) -> list[JobView]:
    """``write`` in a transaction of its own. An id already taken fails the insert on the key;
    the batch is then written again, with ids drawn anew."""
    for _ in range(ID_DRAWS - 1):
        with contextlib.suppress(IntegrityError), db.begin() as connection:
            return write(connection, batch)
    with db.begin() as connection:
        return write(connection, batch)


def _new_job_ids(names: list[str]) -> list[str]:
    """NAME-8 hex digits each (6 digits collided within a few thousand submissions). Not looked
    up first: two jobs of one name draw the same id about once in four billion, and then the
    insert fails on the key and the submission is written again with new ids."""
    while True:
        candidates = [f"{name}-{secrets.token_hex(4)}" for name in names]
        if len(set(candidates)) == len(candidates):
            return candidates


MAX_LISTED = 1000
"""Most jobs one listing returns."""
SUMMARY_POINTS = 1000
"""Training steps a job's summary is computed from, at most (an even sample of longer runs)."""
MAX_OFFSET = 2**62
"""Largest log offset asked for: inside a 64-bit file position."""


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a listing shows: every field left empty matches all."""

    state: str | None = None
    project: str | None = None
    queue: str | None = None
    owner: str | None = None
    accelerator_type: str | None = None
    """Jobs that may run on this type (a job that names none may run on any)."""


def list_jobs(
    ctx: ServiceContext,
    *,
    state: str | None = None,
    limit: int = 50,
    offset: int = 0,
    where: JobFilter | None = None,
) -> list[JobView]:
    """The newest jobs first, those the caller may read, ``offset`` of them skipped (pages)."""
    if not 1 <= limit <= MAX_LISTED:
        raise InvalidSpec(
            f"--limit must be 1 to {MAX_LISTED}, got {limit}",
            hint="narrow the list with --state instead",
        )
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidSpec(f"offset {offset} is out of range", hint="give a number of jobs to skip, from 0")
    where = where or JobFilter(state=state)
    with ctx.db.read() as session:
        query = select(Job).order_by(Job.submitted_at.desc(), Job.id.desc()).limit(limit).offset(offset)
        if not ctx.actor.is_admin:  # the jobs of one's projects, and one's own
            projects = list(rbac.projects_of(session, ctx.actor))
            query = query.where(or_(Job.project.in_(projects), Job.owner == ctx.actor.name))
        if where.state:
            if where.state not in set(JobState):
                raise InvalidSpec(
                    f"unknown job state {where.state!r}", hint=f"use one of: {', '.join(JobState)}"
                )
            query = query.where(Job.state == where.state)
        for column, value in (
            (Job.project, where.project),
            (Job.queue, where.queue),
            (Job.owner, where.owner),
        ):
            if value:
                query = query.where(column == value)
        if where.accelerator_type:
            named = sql_cast(Job.accelerator_types, String)
            quoted = json.dumps(where.accelerator_type)
            query = query.where(or_(named.contains(quoted), named == "[]"))
        jobs = list(session.scalars(query))
        latest = _latest_metrics(session, jobs)  # one query, not two per job
        return [_view(job, latest=latest.get(job.id)) for job in jobs]


def get(ctx: ServiceContext, job_id: str) -> JobDetail:
    with ctx.db.read() as session:
        # The attempts come with the job, in one query: a view shows them all.
        job = allowed_job(ctx, session, job_id, Permission.JOB_READ, joinedload(Job.attempts))
        metrics, summary = _summarized(ctx, session, job)
        artifacts = session.scalars(select(Artifact).where(Artifact.job_id == job.id).order_by(Artifact.id))
        return JobDetail(
            **_view(job, latest={m.kind: m for m in metrics}).model_dump(),  # the newest of each kind
            attempts=[AttemptView.model_validate(a, from_attributes=True) for a in job.attempts],
            artifacts=[ArtifactView.model_validate(a, from_attributes=True) for a in artifacts],
            spec=job.spec,
            summary=summary,
            estimate=Estimate.stored(job.estimate),
            plan_gaps=_plan_gaps(session, job, summary),
        )


def _plan_gaps(session: Session, job: Job, summary: dict[str, float]) -> list[str]:
    """Which of the planner's assumptions a measurement far from its estimate shows to be off."""
    estimate = Estimate.stored(job.estimate)
    if estimate is None or "tokens_per_s" not in summary or not job.attempts:
        return []
    attempt = job.attempts[-1]
    _, plan = estimate.on(attempt.accelerator_type)
    until = attempt.finished_at or utcnow()
    others = session.scalar(
        select(func.count(func.distinct(Attempt.job_id))).where(
            Attempt.node == attempt.node,
            Attempt.job_id != job.id,
            Attempt.started_at < until,
            or_(Attempt.finished_at.is_(None), Attempt.finished_at > attempt.started_at),
        )
    )
    world = summary.get("world_size")
    measured = plan_gaps.Measured(
        tokens_per_s=summary.get("tokens_per_s"),
        mfu=summary.get("mfu"),
        memory_gib=summary.get("memory_gib"),
        flops_per_token=summary.get("flops_per_token"),
        world_size=int(world) if world else None,
        accelerator_type=attempt.accelerator_type,
        threads_per_process=attempt.threads_per_process,
        others_on_node=int(others or 0),
    )
    return plan_gaps.explain(plan, measured)


def cancel(ctx: ServiceContext, job_id: str) -> JobView:
    """A queued job is cancelled at once; a running one is asked to checkpoint and stop.

    The agent may start the job at the same moment, so each change is a guarded UPDATE on the
    state read: whichever writer comes second sees zero rows and looks again.
    """
    with ctx.db.transaction() as session:
        allowed_job(ctx, session, job_id, CANCEL)
        queued = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.state == JobState.QUEUED)
            .values(
                **job_transition(
                    JobState.QUEUED, JobState.CANCELLED, at=utcnow(), exit_reason=ExitReason.CANCELLED
                )
            )
        )
        if not rows_changed(queued):
            running = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.state == JobState.RUNNING)
                .values(cancel_requested=True)
            )
            if not rows_changed(running):
                state = session.scalar(select(Job.state).where(Job.id == job_id))
                raise Conflict(
                    f"job {job_id} already {state}", hint="only queued or running jobs can be cancelled"
                )
        audit.append(session, ctx.audit_key, ctx.actor, "job.cancel", f"job/{job_id}")
        session.expire_all()
        view = _current_view(session, job_id)
    if ctx.start_agent is not None and view.state == JobState.RUNNING:
        ctx.start_agent(ctx.settings)  # its agent stops the attempt at once, not at its next poll
    return view


def _waits(job: Job) -> bool:
    """Queued here, or admitted and held in its engine's own queue (a Slurm allocation)."""
    return job.state == JobState.QUEUED or job.pending_code == Reason.HELD_BY_ENGINE


_SUMMARIES: OrderedDict[tuple[Any, ...], tuple[list[Metric], dict[str, float]]] = OrderedDict()
_SUMMARIES_KEPT = 64
_summaries_lock = threading.Lock()


def _summarized(ctx: ServiceContext, session: Session, job: Job) -> tuple[list[Metric], dict[str, float]]:
    """The job's records (every one but the training steps, of which an even sample: a long run's
    million steps would take seconds to read) and its summary. Kept for the next reader until the
    agent ingests more of its metrics or its state changes: twenty people watching one job cost
    one read, not twenty."""
    key = (ctx.settings.db_url, job.id, job.state, tuple((a.id, a.metrics_offset) for a in job.attempts))
    with _summaries_lock:
        if (known := _SUMMARIES.get(key)) is not None:
            _SUMMARIES.move_to_end(key)
            return known
    others = session.scalars(
        select(Metric).where(Metric.job_id == job.id, Metric.kind != "train").order_by(Metric.id)
    )
    train = metric_series.sampled(session, job.id, "train", SUMMARY_POINTS)
    metrics = sorted([*others, *train], key=lambda m: m.id)
    summary = summarize(job, metrics)
    with _summaries_lock:
        _SUMMARIES[key] = (metrics, summary)
        while len(_SUMMARIES) > _SUMMARIES_KEPT:
            _SUMMARIES.popitem(last=False)
    return metrics, summary


def _view(job: Job, spec: JobSpec | None = None, latest: Mapping[str, Metric] | None = None) -> JobView:
    """The job as callers see it. ``latest``: its newest metric of each kind (none for a job made
    just now, whose ``spec`` is given so that it is not validated again)."""
    latest = latest or {}
    last_train, last_eval = latest.get("train"), latest.get("eval")
    spec = spec or stored_job_spec(job.spec)
    return JobView(
        id=job.id,
        name=job.name,
        project=job.project,
        queue=job.queue,
        priority=job.priority,
        state=job.state,
        pending_reason=job.pending_reason if _waits(job) else None,
        pending_code=job.pending_code if _waits(job) else None,
        devices=job.devices,
        accelerator_types=job.accelerator_types,
        step=last_train.step if last_train else 0,
        total_steps=spec.training.total_steps,
        loss=last_train.loss if last_train else None,
        eval_loss=last_eval.loss if last_eval else None,
        tokens_per_s=last_train.tokens_per_s if last_train else None,
        exit_reason=job.exit_reason,
        message=job.message,
        hint=job.hint,
        run_dir=job.run_dir,
        resume_from=job.resume_from,
        submitted_at=job.submitted_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )


def _latest_metrics(session: Session, jobs: list[Job]) -> dict[str, dict[str, Metric]]:
    """Each job's newest training and evaluation metric, in one query for all of them."""
    if not jobs:
        return {}
    newest = (
        select(func.max(Metric.id))
        .where(Metric.job_id.in_([job.id for job in jobs]), Metric.kind.in_(("train", "eval")))
        .group_by(Metric.job_id, Metric.kind)
    )
    latest: dict[str, dict[str, Metric]] = {}
    for metric in session.scalars(select(Metric).where(Metric.id.in_(newest))):
        latest.setdefault(metric.job_id, {})[metric.kind] = metric
    return latest


def _current_view(session: Session, job_id: str) -> JobView:
    job = find_job(session, job_id)
    return _view(job, latest=_latest_metrics(session, [job]).get(job.id))


def status(ctx: ServiceContext, job_id: str) -> JobView:
    """The job's state and latest progress (cheaper than ``get``)."""
    with ctx.db.read() as session:
        return _current_view(session, job_id)
