"""The round mechanism: from an allocation (shares of time) to the leases of the next round.

Each round, a job's priority on a type is its allocated share divided by the share it has
received so far (Gavel's mechanism): jobs behind their allocation go first. Gangs are all or
nothing on one type; a job that keeps its type keeps its exact devices (lease extension, no
restart); new gangs go where the profile's placer puts them (``framework``) among the nodes its
filters leave: by default the fullest node that fits them, and only when no single node can hold
them over several, in the fewest racks, where they run slower.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from shipyard.scheduling.framework import DEFAULT_PROFILE, Profile, cordoned, level_of
from shipyard.scheduling.model import Allocation, Job, Lease, Node, RoundPlan, Throughputs
from shipyard.scheduling.reasons import pending_reasons
from shipyard.scheduling.status import Status

NEVER_RECEIVED = 1e9
"""Priority of a share allocated but never yet received: it goes before every other."""

Received = Mapping[str, Mapping[str, float]]
"""job id -> accelerator type -> share of that type's time the job has had."""


def place_round(
    jobs: Sequence[Job],
    nodes: Sequence[Node],
    allocation: Allocation,
    *,
    now_s: float,
    round_s: float,
    backfill: Throughputs | None = None,
    never_backfill: Collection[str] = (),
    received: Received | None = None,
    behind: Received | None = None,
    type_passes: Sequence[str] | None = None,
    profile: Profile = DEFAULT_PROFILE,
    queue_profiles: Mapping[str, Profile] | None = None,
) -> RoundPlan:
    """The leases of the next round for ``jobs`` on ``nodes`` under ``allocation``: the round
    mechanism, then the filter and place extension points (``profile``, or the job's queue's in
    ``queue_profiles``).

    ``received``: the share of each type's time each job has had, where the caller counts it
    otherwise (Gavel's mechanism: since the allocation was last reset); by default, the time it
    ran on the type over the time since it arrived. ``behind``: seconds each job is behind its
    allocation on each type, which orders jobs of equal rank (most behind first).

    With ``backfill`` (the throughputs), devices the allocation leaves idle this round go to
    waiting jobs, on the type each runs fastest; they hold them one round only, after every
    allocated job was placed, so they never delay one (Gavel's mechanism does the same). Jobs in
    ``never_backfill`` (say, preempted to give quota back) get nothing beyond their allocation.

    ``type_passes`` (Gavel's mechanism): instead of one ranking of all (job, type) pairs, one
    pass per type in this order over every job, by its rank on that type; with ``backfill``, jobs
    with no share there fill that type's devices left over in the same pass (oldest first).
    """
    by_id = {j.id: j for j in jobs}
    capacity: dict[str, int] = {}
    for node in nodes:
        capacity[node.accelerator_type] = capacity.get(node.accelerator_type, 0) + node.devices

    def rank(job: Job, accelerator_type: str) -> float:
        """Allocated share over received share: who is furthest behind goes first (0: no share)."""
        share = allocation.get(job.id, {}).get(accelerator_type, 0.0)
        if share <= 0 or not job.allows(accelerator_type):
            return 0.0
        if received is None:
            had = job.attained_s.get(accelerator_type, 0.0) / max(now_s - job.arrival_s, round_s)
        else:
            had = received.get(job.id, {}).get(accelerator_type, 0.0)
        return share / had if had > 0 else NEVER_RECEIVED * share

    def lag(job: Job, accelerator_type: str) -> float:
        return 0.0 if behind is None else behind.get(job.id, {}).get(accelerator_type, 0.0)

    free = dict(capacity)
    if type_passes is None:
        candidates = sorted(
            (-rank(job, k), -lag(job, k), job.running_on != k, job.arrival_s, job.id, k)
            for job_id, shares in allocation.items()
            if (job := by_id.get(job_id)) is not None
            for k in shares
            if rank(job, k) > 0
        )
        order = [(by_id[job_id], k) for *_, job_id, k in candidates]
    else:
        order = _by_type_passes(jobs, type_passes, rank, lag, backfill, never_backfill)
        backfill = None  # the passes filled each type
    # Choose (job, type) pairs by counting devices per type, then place them on nodes: jobs that
    # keep their lease first, so their devices are not handed to someone else.
    chosen: dict[str, str] = {}
    for job, accelerator_type in order:
        if job.id in chosen or free.get(accelerator_type, 0) < job.devices:
            continue
        free[accelerator_type] -= job.devices
        chosen[job.id] = accelerator_type

    node_free = {n.id: n.devices for n in nodes}
    leases: dict[str, Lease] = {}
    place = _Placement(nodes, profile, queue_profiles or {}, node_free)
    for job_id, accelerator_type in chosen.items():
        job = by_id[job_id]
        if job.running_on == accelerator_type and _fits_again(job, node_free):
            leases[job_id] = place.extend(job)
    for job_id, accelerator_type in chosen.items():
        if job_id in leases:
            continue
        if (lease := place(by_id[job_id], accelerator_type)) is not None:
            leases[job_id] = lease

    if backfill is not None:
        waiting = [j for j in jobs if j.id not in leases and j.id not in never_backfill]
        _backfill(waiting, allocation, backfill, place, leases)

    preempted = tuple(sorted(j.id for j in jobs if j.running_on is not None and j.id not in leases))
    waiting = [j for j in jobs if j.id not in leases]
    return RoundPlan(
        leases=leases,
        preempted=preempted,
        pending_reasons=pending_reasons(waiting, nodes, node_free, place.refusals()),
    )


class _Placement:
    """One round's placement: each type's nodes that pass the filters of the job's profile,
    and the profile's placer over them, taking devices from ``node_free``."""

    def __init__(
        self,
        nodes: Sequence[Node],
        profile: Profile,
        queue_profiles: Mapping[str, Profile],
        node_free: dict[str, int],
    ) -> None:
        self.by_id = {n.id: n for n in nodes}
        self.profile, self.queue_profiles, self.node_free = profile, queue_profiles, node_free
        self.nodes_of: dict[str, list[Node]] = {}  # once per type, not once per job over every node
        for node in nodes:
            self.nodes_of.setdefault(node.accelerator_type, []).append(node)
        self.refused: dict[str, Status] = {}
        """Nodes a filter turned away for some job this round, with its reason (the pending
        reasons name them)."""

    def refusals(self) -> dict[str, Status]:
        """Every node a filter turned away this round, and every unschedulable node."""
        refused = dict(self.refused)
        for node in self.by_id.values():
            if not node.schedulable and node.id not in refused:
                refused[node.id] = cordoned(node)
        return refused

    def extend(self, job: Job) -> Lease:
        """The running job keeps its devices (the filters judge new gangs only)."""
        assert job.running_on is not None
        for node_id in job.nodes:
            self.node_free[node_id] -= 1
        return self._lease(job, job.running_on, job.nodes)

    def __call__(self, job: Job, accelerator_type: str) -> Lease | None:
        profile = self.queue_profiles.get(job.queue, self.profile)
        nodes = self.nodes_of.get(accelerator_type, [])
        if profile.filters:
            kept = []
            for node in nodes:
                if (why := profile.refusal(job, node)) is None:
                    kept.append(node)
                else:
                    self.refused.setdefault(node.id, why)
            nodes = kept
        placed = profile.placer(job, nodes, self.node_free)
        return None if placed is None else self._lease(job, accelerator_type, placed)

    def _lease(self, job: Job, accelerator_type: str, nodes: tuple[str, ...]) -> Lease:
        return Lease(
            job_id=job.id, accelerator_type=accelerator_type, nodes=nodes, level=level_of(nodes, self.by_id)
        )


def _by_type_passes(
    jobs: Sequence[Job],
    type_passes: Sequence[str],
    rank: Callable[[Job, str], float],
    lag: Callable[[Job, str], float],
    backfill: Throughputs | None,
    never_backfill: Collection[str],
) -> list[tuple[Job, str]]:
    """(job, type) in the order Gavel's mechanism considers them: type by type, each type's jobs
    by rank, then how far behind, then arrival."""
    order = []
    for k in type_passes:
        ranked = []
        for job in jobs:
            r = rank(job, k)
            if r > 0 or (
                backfill is not None
                and job.id not in never_backfill
                and job.allows(k)
                and backfill.of(job, k) > 0
            ):
                ranked.append((-r, -lag(job, k), job.arrival_s, job.id, job))
        order += [(job, k) for *_, job in sorted(ranked, key=lambda e: e[:4])]
    return order


def _backfill(
    jobs: Sequence[Job],
    allocation: Allocation,
    throughputs: Throughputs,
    place: _Placement,
    leases: dict[str, Lease],
) -> None:
    """Idle devices to ``jobs``: running ones keep theirs, then the most allocated, then the oldest."""
    node_free = place.node_free
    free = {k: sum(node_free[n.id] for n in of_type) for k, of_type in place.nodes_of.items()}

    def order(job: Job) -> tuple[int, float, float, str]:
        return (job.running_on is None, -sum(allocation.get(job.id, {}).values()), job.arrival_s, job.id)

    for job in sorted(jobs, key=order):
        if not any(free.values()):
            return
        if job.running_on is not None and _fits_again(job, node_free):
            free[job.running_on] -= job.devices
            leases[job.id] = place.extend(job)
            continue
        fitting = [k for k in free if free[k] >= job.devices and job.allows(k) and throughputs.of(job, k) > 0]
        for accelerator_type in sorted(fitting, key=lambda k: (-throughputs.of(job, k), k)):
            if (lease := place(job, accelerator_type)) is not None:
                free[accelerator_type] -= job.devices
                leases[job.id] = lease
                break


def _fits_again(job: Job, node_free: Mapping[str, int]) -> bool:
    need: dict[str, int] = {}
    for node_id in job.nodes:
        need[node_id] = need.get(node_id, 0) + 1
    return bool(job.nodes) and all(node_free.get(n, 0) >= c for n, c in need.items())
