"""The resize phase: elastic jobs grow into the devices a round leaves idle, and give them back.

An elastic job (``Job.sizes``) goes through quota admission, the policy and placement at its
smallest size, its guaranteed gang; what it holds beyond that is borrowed from devices nobody
else was given this round, as a Kueue workload borrows a cohort's idle quota. After placement
this phase gives each leased elastic job the size worth most over the next ``horizon_s``: its
throughput at that size (measured at each count, interpolated between), less the seconds a
resize costs it (``Job.resize_s``: checkpoint, restart, reload) when the size differs from the
one it runs at. A resize therefore happens only when it pays for itself within the horizon, and
a job keeps its size while nothing else needs the devices. The global batch never changes: only
how many devices share it.

Growth takes devices on the nodes the job holds first, then the fewest other nodes of its type
(a live job's gang stays on one node: ``Job.per_node``; one placed over several nodes keeps its
size here, joint sizing resizes it on whole nodes). Every change comes with the words
``jobs show`` prints: what it was, what it is, and why.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shipyard.scheduling.framework import level_of
from shipyard.scheduling.model import Job, Lease, Level, Node, Throughputs

HORIZON_S = 600.0
"""How far ahead a resize must pay for itself. A resize costs tens of seconds to minutes, and on
a busy cluster the next arrivals undo it within minutes, however long the job has left. Measured
with the joint program on Sia's newTrace workload 1: 0.893 h average JCT and 3.7 restarts per job
at ten minutes, against 0.924 h and 4.4 at half an hour and 0.944 h and 5.2 charging the job's
whole remaining time (docs/benchmarks/elastic.md). The greedy phase shares it, not measured there."""


@dataclass(frozen=True, slots=True)
class Resize:
    """One elastic job's change of size this round."""

    job_id: str
    accelerator_type: str
    before: int
    after: int
    why: str
    moved_from: str | None = None
    """The type it ran on, where it moves to another."""

    def describe(self) -> str:
        if self.moved_from is not None:
            return f"moved {self.before} {self.moved_from} → {self.after} {self.accelerator_type}: {self.why}"
        verb = "grew" if self.after > self.before else "shrunk"
        return f"{verb} {self.before}→{self.after} {self.accelerator_type}: {self.why}"


class Curves:
    """Each (job type, accelerator type)'s steps/s by gang size, from the throughputs: measured
    counts as given, counts between them interpolated, counts beyond the largest measured not
    assumed faster than it."""

    def __init__(self, throughputs: Throughputs) -> None:
        self.throughputs = throughputs
        self._counts: dict[tuple[str, str], list[int]] = {}
        for job_type, devices, accelerator_type in throughputs.packed:
            self._counts.setdefault((job_type, accelerator_type), []).append(devices)
        for counts in self._counts.values():
            counts.sort()

    def rate(self, job: Job, accelerator_type: str, devices: int, level: Level = "node") -> float:
        counts = self._counts.get((job.job_type, accelerator_type), [])
        if not job.elastic or not counts or devices in counts:  # a rigid job: the figures as given
            return self.throughputs.of(job, accelerator_type, level=level, devices=devices)
        at = bisect.bisect_left(counts, devices)
        if at == 0:  # below the smallest measured count: no faster per device than it
            return (
                self.throughputs.of(job, accelerator_type, level=level, devices=counts[0])
                * devices
                / counts[0]
            )
        if at == len(counts):
            return self.throughputs.of(job, accelerator_type, level=level, devices=counts[-1])
        low, high = counts[at - 1], counts[at]
        r_low = self.throughputs.of(job, accelerator_type, level=level, devices=low)
        r_high = self.throughputs.of(job, accelerator_type, level=level, devices=high)
        return r_low + (r_high - r_low) * (devices - low) / (high - low)


def resize(
    jobs: Sequence[Job],
    nodes: Sequence[Node],
    leases: Mapping[str, Lease],
    throughputs: Throughputs,
    *,
    horizon_s: float = HORIZON_S,
) -> tuple[dict[str, Lease], dict[str, Resize]]:
    """The round's leases with every leased elastic job at its best size, and the resizes."""
    curves = Curves(throughputs)
    by_node = {n.id: n for n in nodes}
    node_free = {n.id: n.devices if n.schedulable else 0 for n in nodes}
    for lease in leases.values():
        for node_id in lease.nodes:
            node_free[node_id] = node_free.get(node_id, 0) - 1
    out = dict(leases)
    elastic = [j for j in jobs if j.elastic and j.id in leases]
    kinds = sorted({n.accelerator_type for n in nodes})

    def worth(job: Job, kind: str, devices: int, level: Level) -> float:
        """Steps per second on ``devices`` of ``kind`` over the horizon (or until the job ends, if
        sooner), the seconds a resize or move to it would cost counted as seconds of no step."""
        rate = curves.rate(job, kind, devices, level)
        if rate <= 0:
            return 0.0
        held = len(job.nodes) if job.running_on is not None else 0
        cost = job.resize_s if held and (kind != job.running_on or devices != held) else 0.0
        span = min(horizon_s, job.remaining_steps / rate + cost)
        return rate * max(0.0, span - cost) / span if span > 0 else rate

    # Greedy by the relative gain per device taken (steps of different jobs do not compare; how
    # much faster each gets does), as Sia's and Pollux's goodput-per-GPU ranking: each step
    # grows one job on its type, or moves it once to another type's idle devices, wherever that
    # is worth most.
    moved: set[str] = set()
    stuck: set[str] = set()
    while True:
        best: tuple[float, Job, str, int] | None = None
        for job in elastic:
            if job.id in stuck:
                continue
            lease = out[job.id]
            if job.per_node and len(set(lease.nodes)) > 1:
                continue  # a live gang over nodes stays as placed: growing it here could be uneven
            now = len(lease.nodes)
            here = worth(job, lease.accelerator_type, now, lease.level)
            for kind in kinds:
                if not job.allows(kind) or (kind != lease.accelerator_type and job.id in moved):
                    continue
                same = kind == lease.accelerator_type
                room = (
                    _room(lease, job, node_free, by_node) if same else _room_on(kind, job, node_free, by_node)
                )
                for size in job.sizes:
                    added = size - now if same else size
                    if added <= 0 or added > room:
                        continue
                    if same and not _stays_compact(lease, job, size, node_free, by_node):
                        continue
                    level: Level = lease.level if same else ("node" if job.per_node else "rack")
                    gain = (worth(job, kind, size, level) - here) / added / (here or 1e-9)
                    if gain > 0 and (best is None or gain > best[0]):
                        best = (gain, job, kind, size)
        if best is None:
            break
        _, job, kind, size = best
        lease = out[job.id]
        if kind == lease.accelerator_type:
            out[job.id] = _grow(lease, job, size - len(lease.nodes), node_free, by_node)
            if len(out[job.id].nodes) < size:  # the room was not where the gang may grow: never
                stuck.add(job.id)  # choose it again, or the loop would choose it forever
        else:
            for node_id in lease.nodes:
                node_free[node_id] += 1
            empty = Lease(job_id=job.id, accelerator_type=kind, nodes=(), level="node")
            out[job.id] = _grow(empty, job, size, node_free, by_node, one_node=bool(job.per_node))
            moved.add(job.id)
    return out, explained(elastic, out, leases, jobs)


def _stays_compact(
    lease: Lease, job: Job, size: int, node_free: Mapping[str, int], by_node: Mapping[str, Node]
) -> bool:
    """Whether growing to ``size`` keeps a gang that fits its nodes on them: a gang split over more
    nodes than it needs runs slower, and its next change moves it."""
    own = set(lease.nodes)
    if job.per_node or size > sum(by_node[n].devices for n in own):
        return True
    return size - len(lease.nodes) <= sum(max(0, node_free.get(n, 0)) for n in own)


def _room_on(kind: str, job: Job, node_free: Mapping[str, int], by_node: Mapping[str, Node]) -> int:
    """Devices a new gang of the job could take on another type: on one node where it must stay
    on one, else on all of that type's nodes."""
    free = [max(0, f) for n, f in node_free.items() if by_node[n].accelerator_type == kind]
    return max(free, default=0) if job.per_node else sum(free)


def _room(lease: Lease, job: Job, node_free: Mapping[str, int], by_node: Mapping[str, Node]) -> int:
    """Devices the gang could add: on its own nodes where it must stay on one, else on any node
    of its type that takes new gangs."""
    own = set(lease.nodes)
    if job.per_node:
        return sum(max(0, node_free.get(n, 0)) for n in own)
    kind = lease.accelerator_type
    return sum(max(0, free) for n, free in node_free.items() if by_node[n].accelerator_type == kind)


def _grow(
    lease: Lease,
    job: Job,
    more: int,
    node_free: dict[str, int],
    by_node: Mapping[str, Node],
    *,
    one_node: bool = False,
) -> Lease:
    """``more`` devices added to the lease: on the nodes it held before this round first (what it
    gets back there is no move), then its nodes, then the nodes with most free (``one_node``: a
    new gang, all on the node of its type with most free)."""
    kind = lease.accelerator_type
    held = list(job.nodes) if job.running_on == kind else []
    for node_id in lease.nodes:  # what the lease has already is not to be taken again
        if node_id in held:
            held.remove(node_id)
    added: list[str] = []
    for node_id in held:
        if more and node_free.get(node_id, 0) > 0:
            node_free[node_id] -= 1
            added.append(node_id)
            more -= 1
    own = list(dict.fromkeys(lease.nodes + tuple(added)))
    others = sorted(
        (n for n, node in by_node.items() if node.accelerator_type == kind and n not in own),
        key=lambda n: (-node_free.get(n, 0), n),
    )
    others = others[:1] if one_node and not own else ([] if job.per_node or one_node else others)
    for node_id in own + others:
        while more and node_free.get(node_id, 0) > 0:
            node_free[node_id] -= 1
            added.append(node_id)
            more -= 1
    nodes = tuple(sorted(lease.nodes + tuple(added)))
    return Lease(
        job_id=lease.job_id,
        accelerator_type=lease.accelerator_type,
        nodes=nodes,
        level=level_of(nodes, by_node),
    )


def explained(
    elastic: Sequence[Job], out: Mapping[str, Lease], placed: Mapping[str, Lease], jobs: Sequence[Job]
) -> dict[str, Resize]:
    """Each change of size against the size the job ran at, in words."""
    resizes: dict[str, Resize] = {}
    for job in elastic:
        lease = out[job.id]
        before = len(job.nodes) if job.running_on is not None else 0
        after = len(lease.nodes)
        if before and job.running_on != lease.accelerator_type:
            why = f"{after} idle devices there run it faster; the gain pays for its {job.resize_s:.0f} s move"
            resizes[job.id] = Resize(job.id, lease.accelerator_type, before, after, why, job.running_on)
            continue
        if not before or before == after:
            continue
        if after > before:
            idle = f"{after - before} idle device{'s' * (after - before > 1)}"
            why = f"{idle}; the gain pays for its {job.resize_s:.0f} s resize"
        else:
            newcomers = sorted(
                j.id
                for j in jobs
                if j.id in placed
                and j.id != job.id
                and set(placed[j.id].nodes) & set(job.nodes)
                and not set(j.nodes) & set(job.nodes)
            )
            if newcomers:
                why = f"its devices went to {', '.join(newcomers)}; grows back when they are free"
            else:  # measured: more devices did not make it faster
                why = f"it runs as fast on {after} as on {before}, and the others are free for other jobs"
        resizes[job.id] = Resize(job.id, lease.accelerator_type, before, after, why)
    return resizes
