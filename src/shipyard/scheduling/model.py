"""What the scheduler sees: jobs with their progress, nodes with their devices, throughputs.

Plain, immutable data: the live daemon builds it from the database, the simulator from its own
state. Nothing here reads a clock or a file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from shipyard.scheduling.status import Status

Level = Literal["node", "rack", "fabric"]
"""How far a gang spreads: on one node, over nodes of one rack (one leaf switch), or over the
fabric between racks. Each step out is slower: more of its gradients cross slower links."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A job as the scheduler sees it at one moment."""

    id: str
    job_type: str
    """Key of the throughput matrix (a model, or a Gavel job type)."""
    devices: int
    """Gang size: all devices at once, of one accelerator type, or none."""
    arrival_s: float
    total_steps: float
    steps_done: float = 0.0
    accelerator_types: tuple[str, ...] = ()
    """Types the job may run on; empty means any."""
    priority: float = 1.0
    """Weight: 1 is normal; larger is more important."""
    queue: str = "default"
    attained_s: Mapping[str, float] = field(default_factory=dict)
    """Seconds run so far on each accelerator type (all devices of the gang together)."""
    running_on: str | None = None
    """Accelerator type of the current lease, if running."""
    nodes: tuple[str, ...] = ()
    """Nodes of the current lease."""
    min_memory_gib: float = 0.0
    """Memory each device must have (0: any)."""
    per_node: int = 0
    """Devices on each node of the gang: a live job runs its processes on whole nodes of this
    size (``devices`` / ``per_node`` of them); 0: the gang may be split any way (simulated)."""
    sizes: tuple[int, ...] = ()
    """An elastic job's device counts, smallest first (``devices`` is the smallest: the gang the
    policy and quotas see); the resize phase grows it into devices left idle. Empty: rigid."""
    resize_s: float = 0.0
    """Seconds one resize costs it (checkpoint, restart on the new gang, reload), as measured."""
    restarts: int = 0
    """Times it restarted so far (resized, moved, resumed): joint sizing's reallocation factor."""
    largest_run: int = 0
    """The most devices it has run on (0: it never ran): how far Sia's sizing lets it grow."""
    restarting: bool = False
    """Still restarting on its lease (checkpoint restore under way): Sia's sizing keeps it there."""

    @property
    def node_count(self) -> int:
        """Nodes the gang spans when it runs on whole nodes (1 when it may be split any way)."""
        return self.devices // self.per_node if self.per_node else 1

    @property
    def elastic(self) -> bool:
        return len(self.sizes) > 1

    @property
    def remaining_steps(self) -> float:
        return max(0.0, self.total_steps - self.steps_done)

    def allows(self, accelerator_type: str) -> bool:
        return not self.accelerator_types or accelerator_type in self.accelerator_types


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    id: str
    accelerator_type: str
    devices: int
    memory_gib: float | None = None
    """Memory per device; None when unknown (then no job is turned away for memory)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Failure and topology domains (``rack``, ``switch``, ``ib_fabric``...), as its executor reports."""
    unschedulable: str = ""
    """Why no new gang may land here (cordoned, drained, refused by its engine); empty: it may.
    Gangs running here keep their devices."""

    @property
    def schedulable(self) -> bool:
        return not self.unschedulable


@dataclass(frozen=True, slots=True)
class Throughputs:
    """Steps per second of each job type on each accelerator type, per gang, at each ``Level``.

    ``spread`` holds the (lower) figure when a gang spans nodes of one rack, ``fabric`` when it
    spans racks; absent means the level below's. A job type measured on one device only (not
    data-parallel) runs a larger gang no faster than one device.
    """

    packed: Mapping[tuple[str, int, str], float]
    """(job_type, devices, accelerator_type) -> steps/s with the gang on one node."""
    spread: Mapping[tuple[str, int, str], float] = field(default_factory=dict)
    fabric: Mapping[tuple[str, int, str], float] = field(default_factory=dict)

    def of(
        self, job: Job, accelerator_type: str, *, level: Level = "node", devices: int | None = None
    ) -> float:
        """``devices``: the gang's size where it is not ``job.devices`` (an elastic job's)."""
        key = (job.job_type, devices or job.devices, accelerator_type)
        if level == "fabric" and key in self.fabric:
            return self.fabric[key]
        if level != "node" and key in self.spread:
            return self.spread[key]
        if key in self.packed:
            return self.packed[key]
        return self.packed.get((job.job_type, 1, accelerator_type), 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyInput:
    jobs: Sequence[Job]
    capacity: Mapping[str, int]
    """Devices per accelerator type."""
    throughputs: Throughputs
    prices: Mapping[str, float] = field(default_factory=dict)
    """Dollars per device-hour by accelerator type."""
    now_s: float = 0.0
    seed: int = 0
    node_devices: Mapping[str, int] = field(default_factory=dict)
    """The most devices one node of each type holds: a larger gang must spread over nodes, and
    runs at its spread throughput there. Absent: no gang is known to spread."""
    rack_devices: Mapping[str, int] = field(default_factory=dict)
    """The most devices one rack of each type holds: a larger gang spreads over the fabric.
    Absent: racks are not known, and a spread gang is valued at its one-rack figure."""

    def rate(self, job: Job, accelerator_type: str) -> float:
        """The job's steps/s on that type as it will run there, at the level it must spread to."""
        level: Level = "node"
        if job.devices > self.node_devices.get(accelerator_type, job.devices):
            level = "fabric" if job.devices > self.rack_devices.get(accelerator_type, job.devices) else "rack"
        return self.throughputs.of(job, accelerator_type, level=level)


Allocation = Mapping[str, Mapping[str, float]]
"""job id -> accelerator type -> share of time the job should run there (each job sums to <= 1)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    job_id: str
    accelerator_type: str
    nodes: tuple[str, ...]
    """One entry per device (a node id repeats for each device used there)."""
    level: Level = "node"
    """How far the gang spreads (``framework.level_of``)."""

    @property
    def spread(self) -> bool:
        return len(set(self.nodes)) > 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundPlan:
    """What runs in the next round, and why the rest waits."""

    leases: Mapping[str, Lease]
    preempted: tuple[str, ...]
    """Jobs running now that do not run next round: checkpoint, then stop."""
    pending_reasons: Mapping[str, Status]
