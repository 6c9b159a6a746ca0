"""The live side of the scheduler: a snapshot of this node's jobs and devices from the database,
handed to the same ``schedule``/``run_cycle`` the simulator drives.

Throughputs come from the planner's estimate stored at submit (steps/s on the accelerator type it
planned for, scaled by peak FLOPS to the other types), replaced by the measured median once a job
has run on a type. Quotas are the queue configuration in force (``services/queues.py``).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shipyard.db import Attempt, Job, Metric
from shipyard.domain import JobState
from shipyard.hardware import Device
from shipyard.scheduling import model
from shipyard.scheduling.cycle import schedule
from shipyard.scheduling.model import RoundPlan
from shipyard.scheduling.policies import STRICT_ORDER_POLICIES, policy_named
from shipyard.scheduling.quota import Admission
from shipyard.schemas.jobspec import total_steps
from shipyard.services import rbac
from shipyard.services.context import ServiceContext
from shipyard.services.queues import load_queues

NODE = "local"


def _capacity(devices: list[Device]) -> dict[str, int]:
    capacity: dict[str, int] = {}
    for device in devices:
        size = device.cores if device.accelerator_type == "cpu" else 1
        capacity[device.accelerator_type] = capacity.get(device.accelerator_type, 0) + size
    return capacity


def _peaks(devices: list[Device]) -> dict[str, float]:
    peaks: dict[str, float] = {}
    for device in devices:
        per_unit = (
            device.peak_bf16_tflops / device.cores
            if device.accelerator_type == "cpu"
            else device.peak_bf16_tflops
        )
        peaks[device.accelerator_type] = max(per_unit, 1e-6)
    return peaks


@dataclass(frozen=True, slots=True)
class Submitted:
    """What never changes once a job is submitted: its columns, and what the scheduler needs of
    its spec and estimate. Read once per job, not on every pass."""

    project: str
    queue: str
    priority: int
    devices: int
    accelerator_types: tuple[str, ...]
    submitted_at: datetime
    demand: int
    """Devices of the gang; on the CPU, cores (devices x cores per device)."""
    batch_tokens: int
    planned_on: str | None
    planned_tokens_per_s: float
    never_ran: model.Job
    """The job as the scheduler sees it until it first runs (most waiting jobs)."""


@dataclass(frozen=True, slots=True)
class LiveJob:
    """A queued or running job on one pass: what changes is read every pass (building whole ORM
    objects for thousands of waiting jobs took half of a pass); jobs the agent changes are then
    loaded as ORM objects on their own."""

    id: str
    state: str
    pending_reason: str | None
    cancel_requested: bool
    submitted: Submitted


_IS_LIVE = Job.state.in_([JobState.QUEUED, JobState.RUNNING])
_LIVE = select(Job.id, Job.state, Job.pending_reason, Job.cancel_requested).where(_IS_LIVE)


def snapshot(
    session: Session, devices: list[Device], now: datetime
) -> tuple[list[model.Job], list[model.Node], model.Throughputs, dict[str, LiveJob]]:
    # A handful of queries per cycle whatever the queue's length (one query per job made a cycle
    # over 5,000 queued jobs take seconds): the jobs' state; what never changes, once per job;
    # the attempts of live jobs in one query (most queued jobs have none); last steps and
    # measured rates grouped.
    rows = session.execute(_LIVE).all()
    _remember_submitted(session, [job_id for job_id, *_ in rows if job_id not in _SUBMITTED])
    if len(_SUBMITTED) > _MAX_REMEMBERED:  # forget jobs that ended
        current = {job_id for job_id, *_ in rows}
        for job_id in [k for k in _SUBMITTED if k not in current]:
            del _SUBMITTED[job_id]
    attempts: dict[str, list[Attempt]] = {}
    for attempt in session.scalars(
        select(Attempt).join(Job, Job.id == Attempt.job_id).where(_IS_LIVE).order_by(Attempt.number)
    ):
        attempts.setdefault(attempt.job_id, []).append(attempt)
    peaks = _peaks(devices)
    last_steps = _last_steps(session, list(attempts))
    measured = _measured_rates(session, list(attempts))
    packed: dict[tuple[str, int, str], float] = {}
    jobs, live = [], {}
    for job_id, state, pending_reason, cancel_requested in rows:
        submitted = _SUBMITTED[job_id]
        live[job_id] = LiveJob(job_id, state, pending_reason, cancel_requested, submitted)
        for accelerator_type, rate in _rates(submitted, peaks, measured.get(job_id, {})).items():
            packed[(job_id, submitted.demand, accelerator_type)] = rate
        tried = attempts.get(job_id)
        if not tried:
            jobs.append(submitted.never_ran)
            continue
        running = next((a for a in tried if a.state == JobState.RUNNING), None)
        attained: dict[str, float] = {}
        for attempt in tried:
            end = attempt.finished_at or now
            seconds = (_aware(end) - _aware(attempt.started_at)).total_seconds()
            attained[attempt.accelerator_type] = attained.get(attempt.accelerator_type, 0.0) + max(
                seconds, 0.0
            )
        jobs.append(
            dataclasses.replace(
                submitted.never_ran,
                steps_done=float(last_steps.get(job_id, 0)),
                attained_s=attained,
                running_on=running.accelerator_type if running else None,
                nodes=(_node_id(running.accelerator_type),) * submitted.demand if running else (),
            )
        )
    # This machine's devices of one type form one node of the snapshot (the local executor picks
    # the concrete devices, preferring an NVLink island).
    memory: dict[str, float] = {}
    for device in devices:
        memory[device.accelerator_type] = min(
            memory.get(device.accelerator_type, device.memory_gib), device.memory_gib
        )
    nodes = [
        model.Node(id=_node_id(k), accelerator_type=k, devices=n, memory_gib=memory[k])
        for k, n in _capacity(devices).items()
    ]
    return jobs, nodes, model.Throughputs(packed=packed), live


def _node_id(accelerator_type: str) -> str:
    return f"{NODE}/{accelerator_type}"


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


_SUBMITTED: dict[str, Submitted] = {}
"""By job id."""
_MAX_REMEMBERED = 65536
_CHUNK = 500
"""Ids per ``IN (...)`` query."""
_SUBMITTED_COLUMNS = (
    Job.id,
    Job.project,
    Job.queue,
    Job.priority,
    Job.devices,
    Job.accelerator_types,
    Job.submitted_at,
    Job.spec[("resources", "cpus_per_device")].as_integer(),
    Job.spec[("resources", "min_memory_gib")].as_float(),
    Job.spec[("training", "steps")].as_integer(),
    Job.spec[("training", "tokens")].as_integer(),
    Job.spec[("training", "global_batch_tokens")].as_integer(),
    Job.estimate["accelerator"].as_string(),
    Job.estimate["tokens_per_s"].as_float(),
)
"""Only these fields of the JSON documents: decoding and validating whole specs and estimates was
most of what reading a new job cost."""


def _remember_submitted(session: Session, job_ids: list[str]) -> None:
    for start in range(0, len(job_ids), _CHUNK):
        query = select(*_SUBMITTED_COLUMNS).where(Job.id.in_(job_ids[start : start + _CHUNK]))
        for row in session.execute(query):
            (job_id, project, queue, priority, devices, types, submitted_at) = row[:7]
            (cpus, memory, steps, tokens, batch, planned_on, planned_rate) = row[7:]
            demand = devices * (cpus or 1) if types == ["cpu"] else devices
            _SUBMITTED[job_id] = Submitted(
                project=project,
                queue=queue,
                priority=priority,
                devices=devices,
                accelerator_types=tuple(types),
                submitted_at=submitted_at,
                demand=demand,
                batch_tokens=batch,
                planned_on=planned_on,
                planned_tokens_per_s=planned_rate or 0.0,
                never_ran=model.Job(
                    id=job_id,
                    job_type=job_id,
                    devices=demand,
                    arrival_s=_aware(submitted_at).timestamp(),
                    total_steps=float(total_steps(steps, tokens, batch)),
                    accelerator_types=tuple(types),
                    priority=2.0**priority,
                    queue=queue,
                    min_memory_gib=memory or 0.0,
                ),
            )


def _last_steps(session: Session, job_ids: list[str]) -> dict[str, int]:
    if not job_ids:
        return {}
    rows = session.execute(
        select(Metric.job_id, func.max(Metric.step))
        .where(Metric.job_id.in_(job_ids), Metric.kind == "train")
        .group_by(Metric.job_id)
    )
    return {job_id: int(step or 0) for job_id, step in rows}


def _measured_rates(session: Session, job_ids: list[str]) -> dict[str, dict[str, list[float]]]:
    """Tokens/s of every training step each job's attempts reported, by accelerator type."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(Attempt.job_id, Attempt.accelerator_type, Metric.tokens_per_s)
        .join(Metric, Metric.attempt_id == Attempt.id)
        .where(Attempt.job_id.in_(job_ids), Metric.kind == "train", Metric.tokens_per_s.is_not(None))
    )
    measured: dict[str, dict[str, list[float]]] = {}
    for job_id, accelerator_type, tokens_per_s in rows:
        if tokens_per_s is not None:
            measured.setdefault(job_id, {}).setdefault(accelerator_type, []).append(float(tokens_per_s))
    return measured


def _rates(job: Submitted, peaks: dict[str, float], measured: dict[str, list[float]]) -> dict[str, float]:
    """Steps/s per accelerator type: measured where the job ran, else the planner's estimate
    scaled by peak FLOPS, else the peak alone (only the ratios between types matter then)."""
    allowed = [k for k in job.accelerator_types if k in peaks]
    base_type, batch_tokens = job.planned_on, job.batch_tokens
    base_rate = job.planned_tokens_per_s / batch_tokens
    rates = {}
    for accelerator_type in allowed:
        if base_type in peaks and base_rate > 0:
            rates[accelerator_type] = base_rate * peaks[accelerator_type] / peaks[base_type]
        else:
            rates[accelerator_type] = peaks[accelerator_type]
    for accelerator_type, values in measured.items():
        if accelerator_type in rates and values:
            rates[accelerator_type] = statistics.median(values) / batch_tokens
    return rates


def plan_round(
    ctx: ServiceContext, session: Session, now: datetime
) -> tuple[RoundPlan, Admission, dict[str, LiveJob]]:
    """The scheduler's decision for this node now."""
    devices = ctx.executor.devices
    jobs, nodes, throughputs, rows = snapshot(session, devices, now)
    queues = load_queues(session, ctx.settings.home, _capacity(devices))
    plan, admission = schedule(
        jobs,
        nodes,
        throughputs,
        policy_named(ctx.settings.policy),
        queues,
        now_s=now.timestamp(),
        round_s=ctx.settings.round_s,
        backfill=ctx.settings.policy not in STRICT_ORDER_POLICIES,
    )
    return plan, admission, rows


def queue_status(ctx: ServiceContext) -> dict[str, Any]:
    """Pending jobs with the scheduler's reason (those of projects the caller reads), and quota,
    usage and borrowing per queue."""
    with ctx.db.transaction() as session:
        plan, admission, rows = plan_round(ctx, session, datetime.now(UTC))
        readable = None if ctx.actor.is_admin else set(rbac.projects_of(session, ctx.actor))
        pending = [
            {
                "id": row.id,
                "project": row.submitted.project,
                "queue": row.submitted.queue,
                "priority": row.submitted.priority,
                "devices": row.submitted.devices,
                "accelerator_types": list(row.submitted.accelerator_types),
                "submitted_at": _aware(row.submitted.submitted_at).isoformat(),
                "reason": row.pending_reason or plan.pending_reasons.get(row.id, ""),
            }
            for row in sorted(rows.values(), key=lambda r: (r.submitted.submitted_at, r.id))
            if row.state == JobState.QUEUED and (readable is None or row.submitted.project in readable)
        ]
        queues = load_queues(session, ctx.settings.home, _capacity(ctx.executor.devices))
    usage = admission.usage
    cluster_queues = [
        {
            "name": cq.name,
            "cohort": cq.cohort,
            "nominal": {k: v for k, v in cq.nominal.items() if v < 10**9},
            "used": dict(usage.used.get(cq.name, {})),
            "borrowed": dict(usage.borrowed.get(cq.name, {})),
            "local_queues": sorted(k for k, v in queues.local_queues.items() if v == cq.name),
        }
        for cq in queues.cluster_queues.values()
    ]
    return {"pending": pending, "queues": cluster_queues}
