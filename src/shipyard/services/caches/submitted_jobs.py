"""What the scheduler reads of a job once, when it first sees it: its columns and the few fields of
its spec and estimate that scheduling needs. They never change after submission, and reading them
for thousands of waiting jobs on every pass was most of a pass."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from shipyard.db import Job
from shipyard.executors.base import Request
from shipyard.scheduling import model
from shipyard.schemas.jobspec import stored_job_spec
from shipyard.schemas.layout import total_steps


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
    """Devices of the gang over all its nodes; on the CPU, cores (devices x cores per device)."""
    batch_tokens: int
    planned_on: str | None
    planned_tokens_per_s: float
    shape_tokens_per_s: Mapping[str, float]
    """What earlier jobs of its shape measured, by accelerator type (``with_measurements``)."""
    never_ran: model.Job
    """The job as the scheduler sees it until it first runs (most waiting jobs)."""
    request: Request
    """What it asks of an executor (its resources), to place a lease without reading its spec."""
    unit: int = 1
    """Scheduler devices per training process: its cores on the CPU, else 1."""

    def layout_on(self, lease_nodes: Sequence[str]) -> tuple[int, int]:
        """(nodes, training processes per node) of a gang leased ``lease_nodes`` (a scheduler node
        per device): where an elastic job runs is the scheduler's choice, not its spec's."""
        machines = len(set(lease_nodes))
        return machines, len(lease_nodes) // self.unit // machines


MAX_REMEMBERED = 65536
"""Past this many, the jobs no longer live are forgotten."""
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
    Job.spec[("resources", "nodes")].as_integer(),
    Job.spec[("resources", "min_memory_gib")].as_float(),
    Job.spec[("resources", "min_devices")].as_integer(),
    Job.spec[("resources", "min_nodes")].as_integer(),
    Job.spec[("training", "steps")].as_integer(),
    Job.spec[("training", "tokens")].as_integer(),
    Job.spec[("training", "global_batch_tokens")].as_integer(),
    Job.estimate["accelerator"].as_string(),
    Job.estimate["tokens_per_s"].as_float(),
    Job.estimate["measured_tokens_per_s"],
)
"""Only these fields of the JSON documents: decoding and validating whole specs and estimates was
most of what reading a new job cost."""


class SubmittedJobs:
    """What was read of each job, by id, kept for the life of a process (its ``ServiceContext``):
    the agent's passes and the server's queue views read each job once."""

    def __init__(self) -> None:
        self._by_id: dict[str, Submitted] = {}
        self._lock = threading.Lock()

    def __getitem__(self, job_id: str) -> Submitted:
        return self._by_id[job_id]

    def remember(self, session: Session, live: list[str]) -> None:
        """Read the jobs of ``live`` not seen yet; forget ended ones once there are many."""
        unseen = [job_id for job_id in live if job_id not in self._by_id]
        read = dict(_read(session, unseen))
        with self._lock:
            self._by_id.update(read)
            if len(self._by_id) > MAX_REMEMBERED:
                current = set(live)
                self._by_id = {k: v for k, v in self._by_id.items() if k in current}


def aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _read(session: Session, job_ids: list[str]) -> Iterator[tuple[str, Submitted]]:
    for start in range(0, len(job_ids), _CHUNK):
        query = select(*_SUBMITTED_COLUMNS).where(Job.id.in_(job_ids[start : start + _CHUNK]))
        for row in session.execute(query):
            (job_id, project, queue, priority, devices, types, submitted_at) = row[:7]
            (cpus, node_count, memory, fewest_devices, fewest_nodes, steps, tokens, batch) = row[7:15]
            (planned_on, planned_rate, shape_rates) = row[15:]
            # Each node runs ``devices`` processes; on the CPU each holds its cores.
            unit = (cpus or 1) if types == ["cpu"] else 1
            per_node = devices * unit
            demand = per_node * (node_count or 1)
            # An elastic job: the scheduler sees each size it may run at, in devices over all its
            # nodes, and places it at the smallest first (rare: its spec is read).
            sizes: tuple[int, ...] = ()
            gang_nodes, gang_devices = node_count or 1, devices
            if fewest_devices is not None or fewest_nodes is not None:
                layouts = _layouts_of(session, job_id)
                sizes = tuple(n * d * unit for n, d in layouts)
                gang_nodes, gang_devices = layouts[0]
                per_node = gang_devices * unit
            yield (
                job_id,
                Submitted(
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
                    shape_tokens_per_s=shape_rates or {},
                    unit=unit,
                    request=Request(  # the smallest gang: an elastic job's runs are sized as leased
                        accelerator_types=tuple(types),
                        devices=gang_devices,
                        nodes=gang_nodes,
                        cpus_per_device=cpus,
                        min_memory_gib=memory or 0.0,
                    ),
                    never_ran=model.Job(
                        id=job_id,
                        job_type=job_id,
                        devices=sizes[0] if sizes else demand,
                        sizes=sizes,
                        arrival_s=aware(submitted_at).timestamp(),
                        total_steps=float(total_steps(steps, tokens, batch)),
                        accelerator_types=tuple(types),
                        priority=2.0**priority,
                        queue=queue,
                        min_memory_gib=memory or 0.0,
                        per_node=per_node,
                    ),
                ),
            )


def _layouts_of(session: Session, job_id: str) -> list[tuple[int, int]]:
    """The (nodes, devices per node) an elastic job may run at, smallest first, as its spec
    allows them."""
    return stored_job_spec(session.get_one(Job, job_id).spec).elastic_layouts
