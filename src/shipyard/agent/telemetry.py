"""What the platform measures about itself: each agent's last pass (how long scheduling took,
devices in use, vendor utilization), and the figures ``/metrics`` exports for Prometheus."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Integer, cast, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from shipyard.db import AgentStatus, Attempt, ClusterNode, DeviceSample, Job
from shipyard.db.base import utcnow
from shipyard.domain import JobState
from shipyard.executors import NodeInventory
from shipyard.executors.local import NODE_NAME_ENV
from shipyard.hardware import VendorQueries
from shipyard.hardware.health import disk_problems
from shipyard.hardware.telemetry import FIGURES, HostSampler
from shipyard.services.context import ServiceContext

_log = logging.getLogger("shipyard.telemetry")
WAIT_WINDOW = timedelta(hours=1)
"""Queue-wait quantiles cover the jobs that started within this window."""
QUANTILES = (0.5, 0.9, 0.99)


def node_problems(ctx: ServiceContext) -> list[str]:
    """Why this machine should take no new attempts now (empty: none)."""
    queries = ctx.vendor_queries or VendorQueries()
    problems = disk_problems(ctx.settings.runs_dir, ctx.settings.min_free_disk_gib)
    problems += [f"accelerator {index}: {why}" for index, why in sorted(queries.health().items())]
    return problems


def record_pass(
    ctx: ServiceContext,
    agent_id: str,
    *,
    pass_s: float,
    schedule_s: float,
    problems: Sequence[str] = (),
    nodes: Sequence[NodeInventory] | None = None,
) -> None:
    """Overwrite the status of each node up (``nodes``, as the pass read them) with what the pass
    just did, in a few statements however many nodes. In a transaction of its own, after the
    pass's: losing a race for a row (two agents of one host sharing a database) costs one
    report, never the pass."""
    queries = ctx.vendor_queries or VendorQueries()
    utilization = {str(index): round(busy, 4) for index, busy in queries.utilization().items()}
    up = [node for node in (ctx.executor.nodes() if nodes is None else nodes) if node.up]
    now = utcnow()
    try:
        with ctx.db.transaction() as session:
            held = _held_by_node(session)
            rows = [
                {
                    "node": node.id, "agent_id": agent_id, "last_pass_at": now, "pass_s": pass_s,
                    "schedule_s": schedule_s, "devices": _devices(node, held.get(node.id, {})),
                    "utilization": utilization or None, "problems": list(problems) or None,
                }
                for node in up
            ]  # fmt: skip
            ids = [row["node"] for row in rows]
            known = set(session.scalars(select(AgentStatus.node).where(AgentStatus.node.in_(ids))))
            if fresh := [row for row in rows if row["node"] not in known]:
                session.execute(insert(AgentStatus), fresh)
            if seen := [row for row in rows if row["node"] in known]:
                session.execute(update(AgentStatus), seen)  # one UPDATE by key, many rows
    except IntegrityError:
        _log.info("another agent reported for this node at the same moment; this pass's report is dropped")


class _Sampling:
    """This process's device sampling: when it last sampled and purged, and the host's counters."""

    def __init__(self) -> None:
        self.sampled_at = 0.0
        self.purged_at = 0.0
        self.host = HostSampler()


_sampling = _Sampling()
PURGE_EVERY_S = 3600.0
COMPACT_AFTER_S = 86400.0
COMPACT_TO_S = 60.0
"""Samples older than a day are kept as one average a minute: a month of 5-second samples of 64
devices is 2.9 million rows rather than 33 million."""


def sample_devices(ctx: ServiceContext, nodes: Sequence[NodeInventory]) -> int:
    """Record what this machine's devices are doing (its CPU from ``/proc``, its accelerators from
    their vendor's counters), at most every ``telemetry_interval_s``, when this machine is one of
    the executor's nodes; drop samples past the retention. Returns the samples written."""
    interval = ctx.settings.telemetry_interval_s
    now = time.time()
    node = os.environ.get(NODE_NAME_ENV) or socket.gethostname()
    if interval <= 0 or now - _sampling.sampled_at < interval or node not in {n.id for n in nodes}:
        return 0
    _sampling.sampled_at = now
    try:
        readings = [_sampling.host.sample(), *(ctx.vendor_queries or VendorQueries()).telemetry()]
    except OSError as exc:  # a /proc or vendor tool that does not answer costs this sample only
        _log.warning("could not sample this node's devices: %s", exc)
        return 0
    rows = [{"node": node, "at": now, **dataclasses.asdict(reading)} for reading in readings]
    with ctx.db.transaction() as session:
        session.execute(insert(DeviceSample), rows)
        if now - _sampling.purged_at >= PURGE_EVERY_S:
            _sampling.purged_at = now
            oldest = now - ctx.settings.telemetry_retention_days * 86400
            session.execute(delete(DeviceSample).where(DeviceSample.at < oldest))
            compact_samples(session, now)
    return len(rows)


def compact_samples(session: Session, now: float) -> int:
    """Replace the samples of the two hours before the last day by one average per node, device and
    minute (two hours: an agent that missed an hourly turn still compacts everything once; a
    minute already compacted is rewritten as itself). Returns the rows written."""
    until = (now - COMPACT_AFTER_S) // COMPACT_TO_S * COMPACT_TO_S
    window = (DeviceSample.at >= until - 2 * PURGE_EVERY_S, DeviceSample.at < until)
    minute = cast(DeviceSample.at / COMPACT_TO_S, Integer)
    averaged = session.execute(
        select(
            DeviceSample.node, DeviceSample.device, func.avg(DeviceSample.at),
            *(func.avg(getattr(DeviceSample, figure)) for figure in FIGURES), func.max(DeviceSample.throttle),
        ).where(*window).group_by(DeviceSample.node, DeviceSample.device, minute)
    ).all()  # fmt: skip
    if not averaged:
        return 0
    session.execute(delete(DeviceSample).where(*window))
    rows = [
        {
            "node": node,
            "device": device,
            "at": at,
            **dict(zip(FIGURES, figures, strict=True)),
            "throttle": throttle,
        }
        for node, device, at, *figures, throttle in averaged
    ]
    session.execute(insert(DeviceSample), rows)
    return len(rows)


_recorded: dict[str, tuple[list[NodeInventory], dict[str, dict[str, Any]]]] = {}
"""What this process last recorded of each node, per database (a pass writes what changed)."""


def record_inventory(ctx: ServiceContext, known: Sequence[NodeInventory]) -> None:
    """Record the nodes the engine knows (down ones too) for the processes that do not ask the
    engine (the API server: ``executors/recorded.py``); only what changed since the last pass,
    and the nodes the engine forgot are dropped."""
    last_read, last = _recorded.get(ctx.settings.db_url, ([], {}))
    if list(known) == last_read:
        return  # the usual pass: nothing to write, nothing to convert
    now = {node.id: node.record() for node in known}
    try:
        _write_inventory(ctx, now, last)
    except IntegrityError:  # another agent of the database wrote it at the same moment
        _log.info("another agent recorded the nodes at the same moment; this pass's record is dropped")
        return
    _recorded[ctx.settings.db_url] = (list(known), now)


def _write_inventory(
    ctx: ServiceContext, now: dict[str, dict[str, Any]], last: dict[str, dict[str, Any]]
) -> None:
    with ctx.db.transaction() as session:
        stored = set(session.scalars(select(ClusterNode.node)))
        gone = stored - set(now)
        if gone:
            session.execute(delete(ClusterNode).where(ClusterNode.node.in_(gone)))
        changed = [
            {"node": node, "inventory": record, "recorded_at": utcnow()}
            for node, record in now.items()
            if node not in stored or last.get(node) != record
        ]
        if fresh := [row for row in changed if row["node"] not in stored]:
            session.execute(insert(ClusterNode), fresh)
        if seen := [row for row in changed if row["node"] in stored]:
            session.execute(update(ClusterNode), seen)


def _held_by_node(session: Session) -> dict[str, dict[str, int]]:
    """Devices (cores for ``cpu``) the running attempts hold, per node and type: one query."""
    held: dict[str, dict[str, int]] = {}
    running = select(Attempt.node, Attempt.accelerator_type, Attempt.device_ids).where(
        Attempt.state == JobState.RUNNING
    )
    for nodes, accelerator_type, device_ids in session.execute(running):
        for node in (nodes or "").split(","):
            counts = held.setdefault(node, {})
            counts[accelerator_type] = counts.get(accelerator_type, 0) + len(device_ids)
    return held


def _devices(node: NodeInventory, held: dict[str, int]) -> dict[str, dict[str, int]]:
    """Per type, the node's devices and those in use: as its engine counts them where it does
    (a cluster shared with others), else as the running attempts hold them."""
    in_use = node.in_use or held
    totals = {kind: {"total": count, "in_use": 0} for kind, count in node.capacity().items()}
    for kind, count in in_use.items():
        totals.setdefault(kind, {"total": 0, "in_use": 0})["in_use"] = count
    return totals


@dataclass(frozen=True, slots=True)
class ClusterMetrics:
    jobs_by_state: dict[str, int]
    oldest_queued_wait_s: float
    queue_wait_s: dict[float, float]
    """Quantile -> seconds from submission to start, over jobs started within ``WAIT_WINDOW``."""
    agents: list[dict[str, Any]]
    stragglers: list[tuple[str, int, float]] = field(default_factory=list)
    """(job, rank, its compute per step over the ranks' median) of running attempts."""


def cluster_metrics(ctx: ServiceContext) -> ClusterMetrics:
    now = utcnow()
    with ctx.db.transaction() as session:
        by_state = session.execute(select(Job.state, func.count()).group_by(Job.state))
        counts = {str(state): int(n) for state, n in by_state}
        oldest = session.scalar(select(func.min(Job.submitted_at)).where(Job.state == JobState.QUEUED))
        started = session.execute(
            select(Job.submitted_at, Job.started_at).where(Job.started_at >= now - WAIT_WINDOW)
        ).all()
        agents = [
            {
                "node": a.node,
                "pass_s": a.pass_s,
                "schedule_s": a.schedule_s,
                "age_s": (now - a.last_pass_at).total_seconds(),
                "devices": a.devices,
                "utilization": a.utilization or {},
            }
            for a in session.scalars(select(AgentStatus).order_by(AgentStatus.node))
        ]
        stragglers = [
            (job_id, int(s["rank"]), float(s["ratio"]))
            for job_id, health in session.execute(
                select(Attempt.job_id, Attempt.health).where(
                    Attempt.state == JobState.RUNNING, Attempt.health.is_not(None)
                )
            )
            for s in (health or {}).get("stragglers", [])
        ]
    waits = sorted(_seconds(start - submit) for submit, start in started if start is not None)
    return ClusterMetrics(
        jobs_by_state={state.value: counts.get(state.value, 0) for state in JobState},
        oldest_queued_wait_s=_seconds(now - oldest) if oldest else 0.0,
        queue_wait_s=_quantiles(waits),
        agents=agents,
        stragglers=stragglers,
    )


def _seconds(delta: timedelta) -> float:
    return max(delta.total_seconds(), 0.0)


def _quantiles(values: list[float]) -> dict[float, float]:
    if not values:
        return {}
    if len(values) == 1:
        return dict.fromkeys(QUANTILES, values[0])
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {q: cuts[round(q * 100) - 1] for q in QUANTILES}
