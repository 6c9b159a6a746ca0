"""The simulator and the live agent decide alike: a short simulated run on a cluster with two
queues of a cohort is recorded round by round, and each round's snapshot is written into a real
database, where the live scheduler (``plan_round``: the agent's decision) must give the same
leases, preemptions and reasons. The node's eight H200s are a fake vendor answer (this machine has
no GPU); nothing is launched."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import delete, update

from shipyard.agent.scheduler import executor_node, plan_round, snapshot
from shipyard.db import Attempt, Job, Metric
from shipyard.domain import JobState
from shipyard.executors import capacity_of
from shipyard.scheduling import model
from shipyard.scheduling.policies import DEFAULT_POLICY, policy_named
from shipyard.schemas.jobspec import validate_job_spec
from shipyard.services.cluster.queues import load_queues
from shipyard.services.context import ServiceContext, open_context
from shipyard.services.jobs import jobs
from shipyard.settings import Settings
from shipyard.sim.simulator import SimConfig, simulate
from shipyard.sim.workload import TraceJob
from tests.builders import spec_dict
from tests.unit.test_services import h200_node

QUEUES = """\
clusterQueues:
  - {name: research, cohort: lab, nominal: {h200: 6}}
  - {name: prod, cohort: lab, nominal: {h200: 4}, borrowingLimit: {h200: 0}}
localQueues: {research: research, prod: prod}
"""
# (queue, devices, priority, steps per second): more work than eight devices hold at once, and
# quotas that promise more than eight, so jobs wait on quota and on the policy's choice, borrow
# from the cohort, and finish at different rounds.
JOBS = [
    ("research", 4, 0, 1.0),
    ("research", 2, 0, 0.5),
    ("prod", 2, 5, 1.0),
    ("research", 1, 0, 0.25),
    ("prod", 4, 0, 0.5),
    ("research", 2, 1, 1.0),
    ("prod", 1, 0, 1.0),
]
STEPS = 1440  # whole numbers of steps per round at every rate: the live side counts integer steps
START = datetime(2026, 12, 1, tzinfo=UTC)


def _submit(ctx: ServiceContext) -> list[str]:
    ids = []
    for i, (queue, devices, priority, _) in enumerate(JOBS):
        spec = spec_dict(
            f"job{i}",
            queue=queue,
            priority=priority,
            training={"steps": STEPS},
            resources={"accelerator": "h200", "devices": devices},
        )
        ids.append(jobs.submit(ctx, validate_job_spec(spec)).id)
    with ctx.db.transaction() as session:  # all there at the first round; each job's rate chosen
        for i, job_id in enumerate(ids):
            job = session.get_one(Job, job_id)
            batch = job.spec["training"]["global_batch_tokens"]
            job.submitted_at = START
            job.estimate = {**job.estimate, "accelerator": "h200", "tokens_per_s": batch * JOBS[i][3]}
    return ids


def _write_round(ctx: ServiceContext, ids: list[str], now_s: float, snap: Sequence[model.Job]) -> None:
    """The database as the agent would find it had the simulated rounds run on this node."""
    now = datetime.fromtimestamp(now_s, UTC)
    live = {int(j.id): j for j in snap}
    with ctx.db.transaction() as session:
        session.execute(delete(Metric))
        session.execute(delete(Attempt))
        for index, job_id in enumerate(ids):
            job = live.get(index)
            if job is None:  # every job arrived at the start: it finished
                session.execute(update(Job).where(Job.id == job_id).values(state=JobState.SUCCEEDED))
                continue
            running = job.running_on is not None
            session.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(state=JobState.RUNNING if running else JobState.QUEUED, pending_reason=None)
            )
            last = None
            for number, (kind, seconds) in enumerate(sorted(job.attained_s.items()), start=1):
                here = running and kind == job.running_on
                attempt = Attempt(
                    job_id=job_id,
                    number=number,
                    state=JobState.RUNNING if here else JobState.SUCCEEDED,
                    accelerator_type=kind,
                    device_ids=[],
                    threads_per_process=1,
                    node=executor_node(job.nodes[0]) if here else None,
                    log_path="-",
                    started_at=now - timedelta(seconds=seconds),
                    finished_at=None if here else now,
                )
                session.add(attempt)
                session.flush()
                last = attempt
            if last is not None and job.steps_done:
                step = round(job.steps_done)
                session.add(Metric(job_id=job_id, attempt_id=last.id, kind="train", step=step, values={}))


def _decisions(plan: model.RoundPlan, name: dict[str, str]) -> tuple[dict, set[str], dict]:
    leases = {name[i]: (lease.accelerator_type, sorted(lease.nodes)) for i, lease in plan.leases.items()}
    reasons = {name[i]: reason.code for i, reason in plan.pending_reasons.items()}
    return leases, {name[i] for i in plan.preempted}, reasons


def test_a_short_simulated_run_decides_as_the_live_agent_on_every_snapshot(tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES)
    settings = Settings(home=tmp_path, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
    ctx = open_context(settings, vendor_queries=h200_node(8))
    ids = _submit(ctx)
    inventory = list(ctx.executor.nodes())
    with ctx.db.read() as session:  # the live view of the jobs: their rates, memory and nodes
        first, nodes, throughputs, _ = snapshot(session, inventory, START, ctx.submitted_jobs)
        queues = load_queues(session, ctx.settings.home, capacity_of(inventory))
    by_id = {j.id: j for j in first}
    trace = [
        TraceJob(job_type=j.job_type, devices=j.devices, total_steps=j.total_steps, arrival_s=j.arrival_s,
                 priority=j.priority, accelerator_types=j.accelerator_types, queue=j.queue,
                 min_memory_gib=j.min_memory_gib)
        for j in (by_id[job_id] for job_id in ids)
    ]  # fmt: skip
    rounds: list[tuple[float, list[model.Job], model.RoundPlan]] = []
    simulate(
        trace,
        nodes,
        throughputs,
        policy_named(DEFAULT_POLICY),
        SimConfig(round_s=ctx.settings.round_s, queues=queues, spread_slowdown=False),
        on_round=lambda now_s, snap, plan: rounds.append((now_s, list(snap), plan)),
    )
    assert len(rounds) >= 6  # jobs waited, ran, finished over several rounds

    sim_name = {str(i): job_id for i, job_id in enumerate(ids)}
    live_name = {job_id: job_id for job_id in ids}
    seen_codes: set[str] = set()
    for now_s, snap, plan in rounds:
        _write_round(ctx, ids, now_s, snap)
        with ctx.db.transaction() as session:
            decision, _ = plan_round(ctx, session, datetime.fromtimestamp(now_s, UTC))
        expected = _decisions(plan, sim_name)
        assert _decisions(decision.plan, live_name) == expected, f"round at {now_s - rounds[0][0]:.0f} s"
        seen_codes |= {str(code) for code in expected[2].values()}
    # Jobs waited on quota, borrowed quota was reclaimed, and the policy moved jobs.
    assert {"quota_exhausted", "reclaimed"} <= seen_codes
    assert any(plan.preempted for _, _, plan in rounds)
    ctx.close()
