"""The round mechanism: from an allocation (shares of time) to the leases of the next round.

Each round, a job's priority on a type is its allocated share divided by the share it has
received so far (Gavel's mechanism): jobs behind their allocation go first. Gangs are all or
nothing on one type; a job that keeps its type keeps its exact devices (lease extension, no
restart); new gangs go where the profile's placer puts them (``framework``) among the nodes its
filters leave: by default the fullest node that fits them, and only when no single node can hold
them over several, in the fewest racks, where they run slower.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from shipyard.scheduling.framework import DEFAULT_PROFILE, Profile, cordoned, level_of, rack_of
from shipyard.scheduling.model import Allocation, Job, Lease, Node, PolicyInput, RoundPlan, Throughputs
from shipyard.scheduling.policies import Policy
from shipyard.scheduling.quota import Admission, Queues, admit
from shipyard.scheduling.reasons import pending_reasons
from shipyard.scheduling.status import Reason, Status

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


def fit_device_memory(
    jobs: Sequence[Job], nodes: Sequence[Node]
) -> tuple[list[Job], dict[str, Status], dict[str, str]]:
    """Narrow each job's accelerator types to those whose devices have the memory it asks for.

    A type counts with its smallest node. Returns the jobs that can still run (with the narrowed
    list, so policies and placement never see a type that is too small), the reasons of those
    that cannot, and a note per narrowed job to add to its reason should it wait.
    """
    memory: dict[str, float] = {}
    for node in nodes:
        if node.memory_gib is not None:
            memory[node.accelerator_type] = min(
                memory.get(node.accelerator_type, node.memory_gib), node.memory_gib
            )
    nodes_of_type: dict[str, int] = {}
    for node in nodes:
        nodes_of_type[node.accelerator_type] = nodes_of_type.get(node.accelerator_type, 0) + 1
    kept: list[Job] = []
    reasons: dict[str, Status] = {}
    notes: dict[str, str] = {}
    for job in jobs:
        if not job.min_memory_gib:  # most jobs: nothing to narrow
            kept.append(job)
            continue
        types = {k for k in nodes_of_type if job.allows(k)}
        big_enough = sorted(k for k in types if memory.get(k, float("inf")) >= job.min_memory_gib)
        if len(big_enough) == len(types):
            kept.append(job)
        elif big_enough:
            kept.append(dataclasses.replace(job, accelerator_types=tuple(big_enough)))
            left_out = ", ".join(f"{k} has {memory[k]:g}" for k in sorted(types - set(big_enough)))
            notes[job.id] = f"too little memory per device on {left_out} GiB, needs {job.min_memory_gib:g}"
        else:
            small = sum(nodes_of_type[k] for k in types)
            largest = max(memory[k] for k in types)
            reasons[job.id] = Status(
                Reason.INSUFFICIENT_MEMORY,
                f"0/{len(nodes)} nodes: {small} insufficient device memory "
                f"(needs {job.min_memory_gib:g} GiB per device, the largest here has {largest:g} GiB)",
            )
    return kept, reasons, notes


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """One cycle's outcome: the round's leases and reasons, and the quota admission behind them."""

    plan: RoundPlan
    admission: Admission
    solved: bool
    """Whether the policy was solved this cycle (else the last allocation was reused)."""


class TimeSinceSolve:
    """Gavel's count of time received (``scheduler.py``: ``_update_priorities``,
    ``_reset_time_run_so_far``): each job's seconds on each type since the policy was last solved,
    with ``credit_s`` given to every job on every type then and on its arrival; a job's share of a
    type is its seconds over the type's total. At each solve the time a job fell behind its
    allocation is added to ``behind``, which orders jobs of equal rank."""

    def __init__(self, credit_s: float) -> None:
        self.credit_s = credit_s
        self.job_s: dict[str, dict[str, float]] = {}
        self.type_s: dict[str, float] = {}
        self.behind: dict[str, dict[str, float]] = {}

    def arrive(self, jobs: Sequence[Job], capacity: Mapping[str, int]) -> None:
        """Forget jobs that are gone; credit new ones (not in the types' totals until a solve)."""
        current = {j.id for j in jobs}
        self.job_s = {i: s for i, s in self.job_s.items() if i in current}
        self.behind = {i: s for i, s in self.behind.items() if i in current}
        for job in jobs:
            self.job_s.setdefault(job.id, dict.fromkeys(capacity, self.credit_s))

    def settle(self, allocation: Allocation, elapsed_s: float) -> None:
        """At a solve: what each job should have had under ``allocation`` minus what it had goes
        into ``behind``; every count restarts from the credit."""
        for job_id, by_type in self.job_s.items():
            lags = self.behind.setdefault(job_id, {})
            for k, seconds in by_type.items():
                owed = allocation.get(job_id, {}).get(k, 0.0) * elapsed_s
                lags[k] = lags.get(k, 0.0) + owed - (seconds - self.credit_s)
                by_type[k] = self.credit_s
        types = {k for by_type in self.job_s.values() for k in by_type}
        self.type_s = {k: self.credit_s * len(self.job_s) for k in types}

    def ran(self, job_id: str, accelerator_type: str, seconds: float) -> None:
        if job_id in self.job_s:
            self.job_s[job_id][accelerator_type] = self.job_s[job_id].get(accelerator_type, 0.0) + seconds
        self.type_s[accelerator_type] = self.type_s.get(accelerator_type, 0.0) + seconds

    def shares(self) -> Received:
        return {
            i: {k: t / self.type_s[k] if self.type_s.get(k) else 0.0 for k, t in by_type.items()}
            for i, by_type in self.job_s.items()
        }


@dataclass(slots=True, kw_only=True)
class Cycle:
    """The whole scheduling cycle, the one entry point of the live agent, the simulator and the
    benchmarks: memory fit, quota admission, the policy's allocation, the round's leases (with
    idle devices backfilled unless the policy's order must hold), and a reason for every job
    left waiting.

    A cycle that lives across rounds (the simulator's) re-solves a policy only when the set of
    jobs changed, unless the policy asks to be solved every round; one made per pass (the live
    agent's) always solves.
    """

    policy: Policy
    queues: Queues | None = None
    round_s: float
    prices: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0
    resolve_after_s: float = 0.0
    """A changed set of jobs re-solves the policy only once this long has passed since the last
    solve (Gavel's simulator: 1,920 s); until then new jobs run only on devices left idle."""
    type_passes: Sequence[str] | None = None
    """Gavel's order of placement: one pass per type, in this order (see ``place_round``)."""
    ledger: TimeSinceSolve | None = None
    """Gavel's count of the time each job received since the last solve, by which the round
    mechanism ranks jobs (else: time run since arrival, from the jobs themselves)."""
    profile: Profile = DEFAULT_PROFILE
    """The filter and place plugins (``framework``) for every queue without its own."""
    queue_profiles: Mapping[str, Profile] = field(default_factory=dict)
    _allocation: Allocation = field(default_factory=dict, init=False, repr=False)
    _solved_for: frozenset[str] | None = field(default=None, init=False, repr=False)
    _solved_at: float | None = field(default=None, init=False, repr=False)

    def run(
        self,
        jobs: Sequence[Job],
        nodes: Sequence[Node],
        throughputs: Throughputs,
        *,
        now_s: float,
    ) -> Decision:
        capacity, node_devices, rack_devices = _sizes(jobs, nodes)
        jobs, too_small, narrowed = fit_device_memory(jobs, nodes)
        admission = admit(jobs, self.queues or Queues.unlimited(capacity))
        candidates = [j for j in admission.jobs if j.id not in admission.reclaimed]
        job_set = frozenset(j.id for j in candidates)
        waited = self._solved_at is None or now_s - self._solved_at >= self.resolve_after_s
        solved = self.policy.every_round or (job_set != self._solved_for and waited)
        if self.ledger is not None:
            self.ledger.arrive(admission.jobs, capacity)
        if solved:
            if self.ledger is not None:
                self.ledger.settle(self._allocation, now_s - (self._solved_at or 0.0))
            self._solved_at = now_s
            inp = PolicyInput(
                jobs=candidates,
                capacity=capacity,
                throughputs=throughputs,
                prices=self.prices,
                now_s=now_s,
                seed=self.seed,
                node_devices=node_devices,
                rack_devices=rack_devices,
            )
            self._allocation, self._solved_for = self.policy(inp), job_set
        plan = place_round(
            admission.jobs,
            nodes,
            self._allocation,
            now_s=now_s,
            round_s=self.round_s,
            backfill=None if self.policy.strict_order else throughputs,
            never_backfill=admission.reclaimed,
            received=None if self.ledger is None else self.ledger.shares(),
            behind=None if self.ledger is None else self.ledger.behind,
            type_passes=self.type_passes,
            profile=self.profile,
            queue_profiles=self.queue_profiles,
        )
        reasons = dict(plan.pending_reasons)
        reasons.update(admission.reasons)
        for job_id, note in narrowed.items():
            if job_id in reasons:
                reasons[job_id] = reasons[job_id].noted(note)
        reasons.update(too_small)
        for job_id in admission.reclaimed:
            reasons[job_id] = Status(Reason.RECLAIMED, RECLAIMED_MESSAGE)
        plan = RoundPlan(leases=plan.leases, preempted=plan.preempted, pending_reasons=reasons)
        return Decision(plan=plan, admission=admission, solved=solved)


def _sizes(
    jobs: Sequence[Job], nodes: Sequence[Node]
) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Devices of each type the policy may hand out (a node no new gang may use counts only the
    devices its running gangs keep), the most one node holds, and the most one rack holds
    (empty where no node's labels name a rack)."""
    held: dict[str, int] = {}
    for job in jobs:
        for node_id in job.nodes:
            held[node_id] = held.get(node_id, 0) + 1
    capacity: dict[str, int] = {}
    node_devices: dict[str, int] = {}
    racks: dict[tuple[str, str], int] = {}
    for node in nodes:
        kind = node.accelerator_type
        usable = node.devices if node.schedulable else min(node.devices, held.get(node.id, 0))
        capacity[kind] = capacity.get(kind, 0) + usable
        node_devices[kind] = max(node_devices.get(kind, 0), node.devices)
        if (rack := rack_of(node)) is not None:
            racks[(kind, rack)] = racks.get((kind, rack), 0) + usable
    rack_devices: dict[str, int] = {}
    for (kind, _), devices in racks.items():
        rack_devices[kind] = max(rack_devices.get(kind, 0), devices)
    return capacity, node_devices, rack_devices


RECLAIMED_MESSAGE = "preempted: its queue borrowed quota that the owner needs back"
