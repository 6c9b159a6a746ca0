"""The live side of the scheduler: a snapshot of the jobs (from the database) and of the
executor's nodes (its inventory), handed to the same ``Cycle`` the simulator drives.

Throughputs come from the planner's estimate stored at submit (steps/s on the accelerator type it
planned for, scaled by peak FLOPS to the other types), replaced by the measured median once a job
has run on a type. Quotas are the queue configuration in force (``services/cluster/queues.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from shipyard.agent import speeds
from shipyard.db import Attempt, Job
from shipyard.domain import JobState
from shipyard.executors import NodeInventory, capacity_of, devices_of
from shipyard.hardware import Device
from shipyard.hardware.catalog import AcceleratorSpec
from shipyard.scheduling import model
from shipyard.scheduling.cycle import Cycle, Decision
from shipyard.scheduling.framework import profile_named, queue_profiles
from shipyard.scheduling.policies import policy_named
from shipyard.scheduling.quota import NO_LIMIT, Queues, Usage, usage_of
from shipyard.scheduling.sizing import live_sizing
from shipyard.scheduling.status import Reason, Status
from shipyard.schemas.views import PendingJobView, QueueStatusView, QueueUsageView
from shipyard.services.accounts import rbac
from shipyard.services.caches.submitted_jobs import Submitted, SubmittedJobs, aware
from shipyard.services.cluster.queues import load_queues
from shipyard.services.context import ServiceContext
from shipyard.services.estimates.planning import hardware_catalog


def scheduling_node(node: str, accelerator_type: str) -> str:
    """The scheduler's node for one accelerator type of an executor's node: the scheduler sees
    one accelerator type per node, so a machine with GPUs and CPU cores is two of them."""
    return f"{node}/{accelerator_type}"


def executor_node(scheduling_node_id: str) -> str:
    """The executor's node that a scheduler's node belongs to."""
    return scheduling_node_id.rpartition("/")[0]


def _peaks(devices: list[Device]) -> dict[str, float]:
    peaks: dict[str, float] = {}
    for device in devices:
        # A CPU without bf16 units trains in fp32 (precision auto): its faster peak counts.
        best = max(device.peak_bf16_tflops, device.peak_fp32_tflops)
        per_unit = best / device.cores if device.accelerator_type == "cpu" else best
        peaks[device.accelerator_type] = max(per_unit, 1e-6)
    return peaks


@dataclass(frozen=True, slots=True)
class LiveJob:
    """A queued or running job on one pass: what changes is read every pass (building whole ORM
    objects for thousands of waiting jobs took half of a pass); jobs the agent changes are then
    loaded as ORM objects on their own."""

    id: str
    state: str
    pending_reason: str | None
    pending_code: str | None
    cancel_requested: bool
    restart_at: datetime | None
    """Until when a job the restart policy requeued waits (its backoff); the scheduler skips it."""
    submitted: Submitted


_IS_LIVE = Job.state.in_([JobState.QUEUED, JobState.RUNNING])
_ATTEMPT_COLUMNS = (
    Attempt.id,
    Attempt.job_id,
    Attempt.state,
    Attempt.accelerator_type,
    Attempt.node,
    Attempt.started_at,
    Attempt.finished_at,
    Attempt.world_size,
    Attempt.exit_reason,
    Attempt.signalled_at,
)
"""What a snapshot reads of the live jobs' attempts: not whole rows, whose documents (devices,
health, inputs) took a third of the snapshot to decode for 2,000 running jobs."""
_LIVE = select(
    Job.id, Job.state, Job.pending_reason, Job.pending_code, Job.cancel_requested, Job.restart_at
).where(_IS_LIVE)


def snapshot(
    session: Session,
    inventory: list[NodeInventory],
    now: datetime,
    submitted_jobs: SubmittedJobs,
    cordoned: Mapping[str, Sequence[str]] | None = None,
    resize_cost_s: float = 60.0,
) -> tuple[list[model.Job], list[model.Node], model.Throughputs, dict[str, LiveJob]]:
    """What the cycle sees: the live jobs, the nodes (one per machine and accelerator type, with
    the machine's labels, unschedulable where ``cordoned`` names the machine's problems), and the
    throughputs."""
    # A handful of queries per cycle whatever the queue's length (one query per job made a cycle
    # over 5,000 queued jobs take seconds): the jobs' state; what never changes, once per job;
    # the attempts of live jobs in one query (most queued jobs have none); last steps and
    # measured rates grouped.
    rows = session.execute(_LIVE).all()
    submitted_jobs.remember(session, [job_id for job_id, *_ in rows])
    attempts: dict[str, list[Any]] = {}  # rows of _ATTEMPT_COLUMNS
    for attempt in session.execute(
        select(*_ATTEMPT_COLUMNS).join(Job, Job.id == Attempt.job_id).where(_IS_LIVE).order_by(Attempt.number)
    ):
        attempts.setdefault(attempt.job_id, []).append(attempt)
    peaks = _peaks(devices_of(inventory))
    # Where attempts that recorded no node ran: the agent's own machine.
    home = inventory[0].id if inventory else ""
    last_steps = speeds.last_steps(session, list(attempts))
    measured = speeds.measured_rates(session, list(attempts))
    elastic_ids = [i for i in attempts if submitted_jobs[i].never_ran.elastic]
    size_rates = speeds.measured_size_rates(session, elastic_ids)
    resize_starts = speeds.first_steps(session, [a.id for i in elastic_ids for a in attempts[i]])
    packed: dict[tuple[str, int, str], float] = {}
    jobs, live = [], {}
    for job_id, state, pending_reason, pending_code, cancel_requested, restart_at in rows:
        submitted = submitted_jobs[job_id]
        live[job_id] = LiveJob(
            job_id, state, pending_reason, pending_code, cancel_requested, restart_at, submitted
        )
        if restart_at is not None and aware(restart_at) > now:
            continue  # waits out its restart backoff: nothing to schedule yet
        tried = attempts.get(job_id)
        elastic = submitted.never_ran.elastic
        if not elastic:
            for accelerator_type, rate in speeds.type_rates(
                submitted, peaks, measured.get(job_id, {})
            ).items():
                packed[(job_id, submitted.demand, accelerator_type)] = rate
        else:
            packed.update(speeds.size_rates(submitted, peaks, size_rates.get(job_id, {})))
        resize_s = speeds.resize_cost(tried or [], resize_starts) if elastic else None
        never_ran = dataclasses.replace(submitted.never_ran, resize_s=resize_s or resize_cost_s)
        if not tried:
            jobs.append(never_ran)
            continue
        running = next((a for a in tried if a.state == JobState.RUNNING), None)
        attained: dict[str, float] = {}
        for attempt in tried:
            end = attempt.finished_at or now
            seconds = (aware(end) - aware(attempt.started_at)).total_seconds()
            attained[attempt.accelerator_type] = attained.get(attempt.accelerator_type, 0.0) + max(
                seconds, 0.0
            )
        jobs.append(
            dataclasses.replace(
                never_ran,
                steps_done=float(last_steps.get(job_id, 0)),
                attained_s=attained,
                running_on=running.accelerator_type if running else None,
                nodes=_lease_nodes(
                    running.node or home, running.accelerator_type, submitted, running.world_size
                )
                if running
                else (),
            )
        )
    # The devices of one type on one machine form one node of the snapshot (the executor picks
    # the concrete devices, preferring an NVLink island).
    ours: dict[str, int] = {}
    for job in jobs:
        for node_id in job.nodes:
            ours[node_id] = ours.get(node_id, 0) + 1
    nodes = []
    for machine in inventory:
        memory = machine.memory_gib()
        for kind, count in machine.capacity().items():
            node_id = scheduling_node(machine.id, kind)
            # What others hold on a shared cluster is not the scheduler's to give out.
            foreign = max(0, machine.in_use.get(kind, 0) - ours.get(node_id, 0))
            nodes.append(
                model.Node(
                    id=node_id,
                    accelerator_type=kind,
                    devices=count - foreign,
                    memory_gib=memory[kind],
                    labels=machine.labels,
                    unschedulable="; ".join((cordoned or {}).get(machine.id, ())),
                )
            )
    return jobs, nodes, model.Throughputs(packed=packed), live


def _lease_nodes(
    nodes: str, accelerator_type: str, submitted: Submitted, world_size: int | None
) -> tuple[str, ...]:
    """The scheduler's nodes a running attempt holds: one entry per device, on each of its nodes
    (an elastic job's as many as its attempt's size)."""
    machines = nodes.split(",")
    demand = world_size * submitted.unit if world_size and submitted.never_ran.elastic else submitted.demand
    per_node = demand // len(machines)
    return tuple(scheduling_node(m, accelerator_type) for m in machines for _ in range(per_node))


def plan_round(
    ctx: ServiceContext,
    session: Session,
    now: datetime,
    known: Sequence[NodeInventory] | None = None,
    cordoned: Mapping[str, Sequence[str]] | None = None,
) -> tuple[Decision, dict[str, LiveJob]]:
    """The scheduler's decision for the executor's nodes now (a fresh cycle: the policy is
    solved on every pass), over ``known`` nodes when the caller read them already; machines in
    ``cordoned`` take no new gang (the framework's ``node_schedulable`` filter)."""
    known = list(ctx.executor.known_nodes()) if known is None else known
    inventory = [node for node in known if node.up]
    jobs, nodes, throughputs, rows = snapshot(
        session, inventory, now, ctx.submitted_jobs, cordoned, ctx.settings.resize_cost_s
    )
    queues = load_queues(session, ctx.settings.home, capacity_of(inventory))
    profile = profile_named(ctx.settings.placement)
    cycle = Cycle(
        policy=policy_named(ctx.settings.policy),
        queues=queues,
        round_s=ctx.settings.round_s,
        prices=_prices(hardware_catalog(ctx.settings), {node.accelerator_type for node in nodes}),
        profile=profile,
        queue_profiles=queue_profiles(queues.placements(), profile),
        sizing=live_sizing(ctx.settings.sizing),
    )
    decision = cycle.run(jobs, nodes, throughputs, now_s=now.timestamp())
    down = [node for node in known if not node.up]
    return _waiting_for_down_nodes(decision, down, rows), rows


_NEVER_ON_THESE_NODES = (Reason.NO_SUCH_ACCELERATOR, Reason.GANG_TOO_LARGE, Reason.INSUFFICIENT_MEMORY)


def _waiting_for_down_nodes(
    decision: Decision, down: Sequence[NodeInventory], rows: Mapping[str, LiveJob]
) -> Decision:
    """A job that no node up could ever run, while nodes with its accelerator types are down,
    waits for them and says so (a node that restarts is not a reason to refuse the job)."""
    if not down:
        return decision
    reasons = dict(decision.plan.pending_reasons)
    for job_id, reason in decision.plan.pending_reasons.items():
        wanted = set(rows[job_id].submitted.accelerator_types)
        named = sorted(node.id for node in down if wanted & node.capacity().keys())
        if reason.code in _NEVER_ON_THESE_NODES and named:
            reasons[job_id] = Status(
                Reason.NODES_DOWN,
                f"{reason.message}; node{'s' * (len(named) > 1)} {', '.join(named)} with its "
                "accelerator type is down: it waits for it to rejoin",
            )
    plan = dataclasses.replace(decision.plan, pending_reasons=reasons)
    return dataclasses.replace(decision, plan=plan)


def _prices(rows: Mapping[str, AcceleratorSpec], accelerator_types: set[str]) -> dict[str, float]:
    """Dollars per device-hour of the types at hand, from the catalog and ``hardware.yaml``
    (what ``max_throughput_per_dollar`` and cost reports weigh), where they give one."""
    return {
        kind: price
        for kind in accelerator_types
        if kind in rows and (price := rows[kind].hourly_usd) is not None
    }


def queue_status(ctx: ServiceContext, *, replan: bool = True) -> QueueStatusView:
    """Status jobs with the scheduler's reason (those of projects the caller reads), and quota,
    usage and borrowing per queue. Without ``replan``: the reasons the agent last recorded and
    the usage of the running attempts, read rather than planned (a page's view of a long queue,
    in milliseconds; a job the agent has not looked at yet says so)."""
    if not replan:
        return _recorded_queue_status(ctx)
    with ctx.db.transaction() as session:
        decision, rows = plan_round(ctx, session, datetime.now(UTC))
        plan = decision.plan
        readable = None if ctx.actor.is_admin else set(rbac.projects_of(session, ctx.actor))
        pending = [
            PendingJobView(
                id=row.id,
                project=row.submitted.project,
                queue=row.submitted.queue,
                priority=row.submitted.priority,
                devices=row.submitted.devices,
                accelerator_types=list(row.submitted.accelerator_types),
                submitted_at=aware(row.submitted.submitted_at).isoformat(),
                **_reason(row, plan.pending_reasons.get(row.id)),
            )
            for row in sorted(rows.values(), key=lambda r: (r.submitted.submitted_at, r.id))
            if row.state == JobState.QUEUED and (readable is None or row.submitted.project in readable)
        ]
        queues = load_queues(session, ctx.settings.home, capacity_of(ctx.executor.nodes()))
    return QueueStatusView(pending=pending, queues=_usage_views(queues, decision.admission.usage))


def _recorded_queue_status(ctx: ServiceContext) -> QueueStatusView:
    with ctx.db.read() as session:
        readable = None if ctx.actor.is_admin else set(rbac.projects_of(session, ctx.actor))
        query = select(Job).where(Job.state == JobState.QUEUED).order_by(Job.submitted_at, Job.id)
        if readable is not None:
            query = query.where(Job.project.in_(readable))
        pending = [
            PendingJobView(
                id=job.id,
                project=job.project,
                queue=job.queue,
                priority=job.priority,
                devices=job.devices,
                accelerator_types=list(job.accelerator_types),
                submitted_at=aware(job.submitted_at).isoformat(),
                reason=job.pending_reason or "",
                reason_code=job.pending_code or Reason.WAITING,
            )
            for job in session.scalars(query)
        ]
        running = session.execute(
            select(Job.queue, Attempt.accelerator_type, func.sum(Job.devices))
            .join(Attempt, Attempt.job_id == Job.id)
            .where(Job.state == JobState.RUNNING, Attempt.state == JobState.RUNNING)
            .group_by(Job.queue, Attempt.accelerator_type)
        ).all()
        queues = load_queues(session, ctx.settings.home, capacity_of(ctx.executor.nodes()))
    used: dict[str, dict[str, int]] = {name: {} for name in queues.cluster_queues}
    for queue, accelerator_type, devices in running:
        if (cq := queues.cluster_queue_named(queue)) is not None:
            used[cq.name][accelerator_type] = used[cq.name].get(accelerator_type, 0) + int(devices or 0)
    return QueueStatusView(pending=pending, queues=_usage_views(queues, usage_of(queues, used)))


def _usage_views(queues: Queues, usage: Usage) -> list[QueueUsageView]:
    return [
        QueueUsageView(
            name=cq.name,
            cohort=cq.cohort,
            nominal={k: v for k, v in cq.nominal.items() if v < NO_LIMIT},
            used=dict(usage.used.get(cq.name, {})),
            borrowed=dict(usage.borrowed.get(cq.name, {})),
            local_queues=sorted(k for k, v in queues.local_queues.items() if v == cq.name),
        )
        for cq in queues.cluster_queues.values()
    ]


def _reason(row: LiveJob, planned: Status | None) -> dict[str, str]:
    """What the agent last recorded for a waiting job, else what this cycle says."""
    if row.pending_reason:
        return {"reason": row.pending_reason, "reason_code": row.pending_code or Reason.WAITING}
    if planned is not None:
        return {"reason": planned.message, "reason_code": planned.code}
    return {"reason": "", "reason_code": Reason.WAITING}
