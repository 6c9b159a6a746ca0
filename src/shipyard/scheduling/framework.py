"""The scheduling framework's extension points, in the Kubernetes scheduler's shape.

A cycle runs its phases in this order (``cycle.Cycle.run``):

1. **pre-filter** — each job's accelerator types narrowed to those with the device memory it
   needs (``cycle.fit_device_memory``);
2. **admit** — quotas and borrowing (``quota.admit``);
3. **policy** — the allocation of shares of time per accelerator type (``policies``);
4. **filter** — which nodes may take a job's *new* gang: a ``Filter`` plugin answers a ``Status``
   for a node it turns away (a cordoned node, a node the engine refuses); a gang already running
   keeps its devices, as a Kubernetes taint without ``NoExecute`` leaves running pods alone;
5. **place** — which of the nodes left a gang gets: a ``Placer`` plugin;
6. **resize** — elastic jobs, placed at their smallest gang, grow into the devices the round
   left idle where it pays for the resize within a horizon, and give back what others need
   (``elastic``).

Plugins are registered by name (``FILTERS``, ``PLACERS``) and grouped into a ``Profile``, one
for the cluster and optionally one per queue. Everything here is pure: the live agent and the
simulator run the same plugins on the same ``Node`` (with its labels and schedulable flag).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from shipyard.errors import InvalidSpec
from shipyard.scheduling.model import Job, Level, Node
from shipyard.scheduling.status import Reason, Status

RACK_KEYS = ("switch", "rack")
"""Labels naming a node's leaf of the network (its top-of-rack switch), closest first: nodes that
share one talk without crossing the fabric."""


def rack_of(node: Node) -> str | None:
    """The node's rack (or leaf switch), None when its labels do not say."""
    return next((node.labels[key] for key in RACK_KEYS if node.labels.get(key)), None)


def level_of(node_ids: Sequence[str], nodes: Mapping[str, Node]) -> Level:
    """How far a gang on these nodes (one entry per device) spreads: one node, one rack, or over
    the fabric. Nodes whose labels name no rack count as one rack (the spread figure alone)."""
    distinct = set(node_ids)
    if len(distinct) <= 1:
        return "node"
    racks = {rack_of(nodes[n]) if n in nodes else None for n in distinct}
    return "fabric" if len(racks) > 1 else "rack"


class Filter(Protocol):
    """Whether a node may take a job's new gang: None, or why not."""

    @property
    def name(self) -> str: ...

    def __call__(self, job: Job, node: Node) -> Status | None: ...


class Placer(Protocol):
    """The nodes a gang gets among ``nodes`` (all of its type, each passed every filter), one
    entry per device, taking them from ``node_free``; None when they cannot hold it."""

    @property
    def name(self) -> str: ...

    def __call__(
        self, job: Job, nodes: Sequence[Node], node_free: dict[str, int]
    ) -> tuple[str, ...] | None: ...


@dataclass(frozen=True, slots=True)
class NodeSchedulable:
    """Turns away a node marked unschedulable: cordoned by its health (low disk, a failing GPU),
    drained by an administrator, or refused by its engine (a Slurm node in ``DRAIN``)."""

    name: str = "node_schedulable"

    def __call__(self, job: Job, node: Node) -> Status | None:  # noqa: ARG002 (a node-only filter)
        return None if node.schedulable else cordoned(node)


def cordoned(node: Node) -> Status:
    return Status(Reason.CORDONED, f"{node.id} is cordoned: {node.unschedulable}")


@dataclass(frozen=True, slots=True)
class Pack:
    """Best fit on one node; otherwise the emptiest nodes first (fewest nodes spanned). A gang of
    whole nodes gets the fullest nodes that each hold ``per_node`` devices, or nothing."""

    name: str = "pack"

    def __call__(self, job: Job, nodes: Sequence[Node], node_free: dict[str, int]) -> tuple[str, ...] | None:
        if job.per_node and job.per_node < job.devices:
            return _whole_nodes(job, nodes, node_free)
        # (free, id) pairs compared as tuples: thousands of leases a cycle each look at every
        # node of their type, and a key function per node was most of a cycle's placement.
        single = [(free, n.id) for n in nodes if (free := node_free[n.id]) >= job.devices]
        if single:
            _, node_id = min(single)
            node_free[node_id] -= job.devices
            return (node_id,) * job.devices
        if job.per_node or sum(node_free[n.id] for n in nodes) < job.devices:
            return None
        return _spread(job.devices, nodes, node_free)


@dataclass(frozen=True, slots=True)
class Topology:
    """As ``Pack`` on one node; a gang that must span nodes goes to the fewest racks: the rack
    that holds it with the least room to spare, else racks with the most room first. Within a
    node the executor then prefers an NVLink island (``executors.base``)."""

    name: str = "topology"

    def __call__(self, job: Job, nodes: Sequence[Node], node_free: dict[str, int]) -> tuple[str, ...] | None:
        whole = bool(job.per_node and job.per_node < job.devices)
        if not whole and any(node_free[n.id] >= job.devices for n in nodes):
            return Pack()(job, nodes, node_free)
        racks: dict[str | None, list[Node]] = {}
        for node in nodes:
            racks.setdefault(rack_of(node), []).append(node)

        def room(members: Sequence[Node]) -> int:
            """Devices of the gang one rack can hold."""
            if whole:
                return job.per_node * sum(node_free[n.id] >= job.per_node for n in members)
            return 0 if job.per_node else sum(node_free[n.id] for n in members)

        holding = [(room(m), str(rack), m) for rack, m in racks.items() if room(m) >= job.devices]
        if holding:
            return Pack()(job, min(holding, key=lambda e: e[:2])[2], node_free)
        # Over several racks: the roomiest racks first, the emptiest nodes first within each.
        rack_room = {rack: room(members) for rack, members in racks.items()}
        roomiest = sorted(
            nodes, key=lambda n: (-rack_room[rack_of(n)], str(rack_of(n)), -node_free[n.id], n.id)
        )
        if whole:
            return _whole_nodes(job, roomiest, node_free, keep_order=True)
        if job.per_node or sum(node_free[n.id] for n in nodes) < job.devices:
            return None
        return _spread(job.devices, roomiest, node_free, keep_order=True)


def _whole_nodes(
    job: Job, nodes: Sequence[Node], node_free: dict[str, int], *, keep_order: bool = False
) -> tuple[str, ...] | None:
    """``node_count`` nodes that each hold ``per_node`` devices (the fullest such first, unless
    the caller ordered them), or None."""
    fitting = [n for n in nodes if node_free[n.id] >= job.per_node]
    if not keep_order:
        fitting.sort(key=lambda n: (node_free[n.id], n.id))
    if len(fitting) < job.node_count:
        return None
    chosen = fitting[: job.node_count]
    for node in chosen:
        node_free[node.id] -= job.per_node
    return tuple(node.id for node in chosen for _ in range(job.per_node))


def _spread(
    devices: int, nodes: Sequence[Node], node_free: dict[str, int], *, keep_order: bool = False
) -> tuple[str, ...]:
    """``devices`` taken from the emptiest nodes first (or in the caller's order)."""
    ordered = list(nodes) if keep_order else sorted(nodes, key=lambda n: (-node_free[n.id], n.id))
    placed: list[str] = []
    for node in ordered:
        take = min(node_free[node.id], devices - len(placed))
        placed += [node.id] * take
        node_free[node.id] -= take
        if len(placed) == devices:
            break
    return tuple(placed)


FILTERS: Mapping[str, Filter] = {f.name: f for f in (NodeSchedulable(),)}
PLACERS: Mapping[str, Placer] = {p.name: p for p in (Pack(), Topology())}


@dataclass(frozen=True, slots=True)
class Profile:
    """The plugins one cycle (or one queue's jobs) runs: its filters, then its placer."""

    filters: tuple[Filter, ...] = (NodeSchedulable(),)
    placer: Placer = Topology()

    @property
    def names(self) -> dict[str, object]:
        return {"filters": [f.name for f in self.filters], "placer": self.placer.name}

    def refusal(self, job: Job, node: Node) -> Status | None:
        """The first filter's reason to turn the node away for the job's new gang, if any."""
        for check in self.filters:
            if (why := check(job, node)) is not None:
                return why
        return None


def profile_named(placer: str = "topology", filters: Sequence[str] = ("node_schedulable",)) -> Profile:
    """The profile of these registered plugins; an unknown name is refused with the known ones."""
    unknown = [name for name in filters if name not in FILTERS]
    if unknown:
        raise InvalidSpec(
            f"unknown scheduling filter {unknown[0]!r}", hint=f"use one of: {', '.join(FILTERS)}"
        )
    if placer not in PLACERS:
        raise InvalidSpec(f"unknown placement {placer!r}", hint=f"use one of: {', '.join(PLACERS)}")
    return Profile(filters=tuple(FILTERS[name] for name in filters), placer=PLACERS[placer])


DEFAULT_PROFILE = Profile()


def queue_profiles(placements: Mapping[str, str], cluster: Profile = DEFAULT_PROFILE) -> dict[str, Profile]:
    """Each queue's profile where its configuration names a placer (``Queues.placements``): the
    cluster's filters, that placer."""
    return {
        queue: Profile(filters=cluster.filters, placer=PLACERS[name]) for queue, name in placements.items()
    }
