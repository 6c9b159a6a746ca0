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
(a live job's gang stays on one node: ``Job.per_node``). Every change comes with the words
``jobs show`` prints: what it was, what it is, and why.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shipyard.scheduling.framework import level_of
from shipyard.scheduling.model import Job, Lease, Level, Node, Throughputs

HORIZON_S = 1800.0
"""How far ahead a resize must pay for itself (Sia's and Pollux's rounds look one to a few
minutes ahead; a resize costs tens of seconds to minutes, so half an hour keeps it from
thrashing while still taking a gain that lasts)."""


@dataclass(frozen=True, slots=True)
class Resize:
    """One elastic job's change of size this round."""

    job_id: str
    accelerator_type: str
    before: int
    after: int
    why: str

    def describe(self) -> str:
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
    sizes = {j.id: len(leases[j.id].nodes) for j in elastic}

    def worth(job: Job, devices: int) -> float:
        """Steps per second at this size over the horizon (or until the job ends, if sooner),
        the seconds a resize to it would cost counted as seconds of no step."""
        lease = out[job.id]
        level = level_of(lease.nodes, by_node) if devices == len(lease.nodes) else lease.level
        rate = curves.rate(job, lease.accelerator_type, devices, level)
        if rate <= 0:
            return 0.0
        held = len(job.nodes) if job.running_on == lease.accelerator_type else 0
        cost = job.resize_s if held and devices != held else 0.0
        span = min(horizon_s, job.remaining_steps / rate + cost)
        return rate * max(0.0, span - cost) / span if span > 0 else rate

    # Greedy by worth gained per device added, as Sia's and Pollux's goodput-per-GPU ranking:
    # each step moves one job to its next size that fits and is worth more than its present one.
    while True:
        best: tuple[float, Job, int] | None = None
        for job in elastic:
            now = sizes[job.id]
            here = worth(job, now)
            room = _room(out[job.id], job, node_free, by_node)
            for size in job.sizes:
                if size <= now or size - now > room:
                    continue
                gain = (worth(job, size) - here) / (size - now)
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, job, size)
        if best is None:
            break
        _, job, size = best
        out[job.id] = _grow(out[job.id], job, size - sizes[job.id], node_free, by_node)
        sizes[job.id] = size
    return out, _explained(elastic, out, leases, jobs)


def _room(lease: Lease, job: Job, node_free: Mapping[str, int], by_node: Mapping[str, Node]) -> int:
    """Devices the gang could add: on its own nodes where it must stay on one, else on any node
    of its type that takes new gangs."""
    own = set(lease.nodes)
    if job.per_node:
        return sum(max(0, node_free.get(n, 0)) for n in own)
    kind = lease.accelerator_type
    return sum(max(0, free) for n, free in node_free.items() if by_node[n].accelerator_type == kind)


def _grow(lease: Lease, job: Job, more: int, node_free: dict[str, int], by_node: Mapping[str, Node]) -> Lease:
    """``more`` devices added to the lease: on its nodes first, then the nodes with most free."""
    own = list(dict.fromkeys(lease.nodes))
    others = (
        []
        if job.per_node
        else sorted(
            (
                n
                for n, node in by_node.items()
                if node.accelerator_type == lease.accelerator_type and n not in own
            ),
            key=lambda n: (-node_free.get(n, 0), n),
        )
    )
    added: list[str] = []
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


def _explained(
    elastic: Sequence[Job], out: Mapping[str, Lease], placed: Mapping[str, Lease], jobs: Sequence[Job]
) -> dict[str, Resize]:
    """Each change of size against the size the job ran at, in words."""
    resizes: dict[str, Resize] = {}
    for job in elastic:
        lease = out[job.id]
        before = len(job.nodes) if job.running_on == lease.accelerator_type else 0
        after = len(lease.nodes)
        if not before or before == after:
            continue
        if after > before:
            why = f"{after - before} idle devices; the gain pays for its {job.resize_s:.0f} s resize"
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
