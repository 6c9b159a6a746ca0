"""The scheduler's decision carried out: the attempts of the jobs it leases claimed and recorded,
the ones it drops preempted once they held their devices for a round, and every waiting job told why."""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session

from shipyard.agent import launching
from shipyard.agent.endings import launched
from shipyard.agent.handles import handle_of
from shipyard.agent.scheduler import LiveJob, executor_node, plan_round
from shipyard.db import Attempt, Job, rows_changed
from shipyard.domain import JobState
from shipyard.domain.transitions import job_transition
from shipyard.executors.base import (
    Busy,
    DevicePicker,
    NodeInventory,
    place_now,
)
from shipyard.scheduling.elastic import Resize
from shipyard.scheduling.status import Reason, Status
from shipyard.services.caches.submitted_jobs import aware
from shipyard.services.context import ServiceContext

_log = logging.getLogger("shipyard.agent")


WAITING = Status(Reason.WAITING, "waiting for the scheduler")


def start_leased(
    ctx: ServiceContext,
    session: Session,
    agent_id: str,
    running: list[Attempt],
    known: list[NodeInventory],
    cordoned: dict[str, list[str]],
) -> tuple[dict[str, LiveJob], list[launching.Prepared], list[Attempt]]:
    """Ask the scheduler which jobs run now (no new gang on a ``cordoned`` node); claim and record
    the attempts of those it leases, preempt those it drops (once they held their devices for a
    round), and tell every waiting job why it waits. Returns the live jobs as the scheduler read
    them, the attempts to hand to the engine, and those to stop, once the transaction is
    committed (the engine is not asked inside it)."""
    now = ctx.clock.now()
    decision, rows = plan_round(ctx, session, now, known, cordoned)
    plan = decision.plan
    # What the running attempts hold, where Shipyard picks the devices (an engine that picks its
    # own keeps its own account).
    busy: dict[str, Busy] = {}
    picks = isinstance(ctx.executor, DevicePicker)
    for attempt in running if picks else ():
        busy.setdefault(handle_of(ctx, attempt).node, Busy()).hold(
            attempt.accelerator_type, attempt.device_ids
        )
    running_of = {attempt.job_id: attempt for attempt in running}
    preempted = [
        running_of[job_id]
        for job_id in plan.preempted
        if job_id in running_of and _preempt_if_due(ctx, running_of[job_id], now)
    ]
    preempted += [
        running_of[job_id]
        for job_id, change in decision.resizes.items()
        if job_id in running_of and _resize_if_due(ctx, running_of[job_id], change, now)
    ]
    queued = sorted(
        (r for r in rows.values() if r.state == JobState.QUEUED),
        key=lambda r: (r.submitted.submitted_at, r.id),
    )
    reasons: dict[str, Status] = {}
    prepared: list[launching.Prepared] = []
    for waiting in queued:
        if waiting.restart_at is not None and aware(waiting.restart_at) > now:
            continue  # backing off: it keeps the restart policy's reason, which says until when
        lease = plan.leases.get(waiting.id)
        if lease is None:
            reasons[waiting.id] = plan.pending_reasons.get(waiting.id, WAITING)
            continue
        nodes = {executor_node(n) for n in lease.nodes}  # never a cordoned one: the cycle filtered them
        # The lease's type, and the resources the job was submitted with (read once per job):
        # thousands of leases that wait on a busy cluster must not each load their job's spec.
        request = dataclasses.replace(waiting.submitted.request, accelerator_types=[lease.accelerator_type])
        if waiting.submitted.never_ran.elastic:  # the size and layout the scheduler gave it
            machines, per_node = waiting.submitted.layout_on(lease.nodes)
            request = dataclasses.replace(request, nodes=machines, devices=per_node)
        placed = place_now(ctx.executor, request, busy, on=nodes)
        if isinstance(placed, Status):
            reasons[waiting.id] = Status(Reason.UNPLACEABLE, f"0/{len(nodes)} nodes: {placed.message}")
            continue
        job = session.get_one(Job, waiting.id)
        if not claim(session, job, now):
            continue  # cancelled between our read and now
        launching.crash_point(ctx, "claimed")
        prepared.append(launching.prepare(ctx, job, placed, agent_id))
        if picks:
            ids = placed.core_ids if placed.accelerator_type == "cpu" else placed.device_ids
            busy.setdefault(placed.node, Busy()).hold(placed.accelerator_type, ids)
    changed = [
        {"job_id": job_id, "reason": reason.message, "code": reason.code.value}
        for job_id, reason in reasons.items()
        if (rows[job_id].pending_reason, rows[job_id].pending_code) != (reason.message, reason.code)
    ]
    if changed:  # most reasons stay as they were from one pass to the next
        session.execute(_SET_REASON, changed)
    return rows, prepared, preempted


_JOBS = cast(Table, Job.__table__)
_SET_REASON = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("job_id"), _JOBS.c.state == JobState.QUEUED)
    .values(pending_reason=bindparam("reason"), pending_code=bindparam("code"))
)


def _preempt_if_due(ctx: ServiceContext, attempt: Attempt, now: datetime) -> bool:
    """Preempt the attempt once it held its devices a round; whether it is to be stopped."""
    if (now - aware(attempt.started_at)).total_seconds() < ctx.settings.round_s:
        return False
    return preempt(attempt)


def _resize_if_due(ctx: ServiceContext, attempt: Attempt, change: Resize, now: datetime) -> bool:
    """Resize the elastic job once its attempt held its devices a round: it checkpoints, ends
    with the kind ``resized`` and requeues, and the scheduler places it at its new size."""
    if (now - aware(attempt.started_at)).total_seconds() < ctx.settings.round_s or not preempt(attempt):
        return False
    attempt.job.resize_message = change.describe()
    return True


def preempt(attempt: Attempt) -> bool:
    """Record that the attempt is to stop for another (``_stop_if_cancelled`` then sends SIGTERM:
    the runtime checkpoints, then exits, and the job requeues to resume); whether it was newly
    asked to."""
    job = attempt.job
    if not launched(attempt) or job.preempt_requested or job.cancel_requested:
        return False
    job.preempt_requested = True
    return True


def claim(session: Session, job: Job, now: datetime) -> bool:
    """queued -> running, only if nobody changed the job since we read it (a cancel, say).

    On PostgreSQL the row is first locked with ``FOR UPDATE SKIP LOCKED``: an agent never waits
    on a job another agent is claiming, it moves on (SQLite has one writer at a time anyway).
    """
    free = session.scalar(
        select(Job.id).where(Job.id == job.id, Job.state == JobState.QUEUED).with_for_update(skip_locked=True)
    )
    if free is None:
        session.refresh(job)
        return False
    claimed = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.state == JobState.QUEUED, Job.cancel_requested.is_(False))
        .values(**job_transition(JobState.QUEUED, JobState.RUNNING, at=now))
        # The job is refreshed below: matching the update against every object of the session
        # (thousands in a pass) would only cost time.
        .execution_options(synchronize_session=False)
    )
    session.refresh(job)
    return rows_changed(claimed)
