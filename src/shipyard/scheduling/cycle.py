"""The scheduling cycle, the one entry point of the live agent, the simulator and the benchmarks:
its phases in order (``framework``), the policy solved when the jobs change, the round's leases
from ``rounds.place_round``, and elastic jobs resized into what the round left idle
(``elastic``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shipyard.scheduling.elastic import HORIZON_S, Resize, resize
from shipyard.scheduling.framework import DEFAULT_PROFILE, Profile, rack_of
from shipyard.scheduling.model import Allocation, Job, Lease, Node, PolicyInput, RoundPlan, Throughputs
from shipyard.scheduling.policies import Policy
from shipyard.scheduling.quota import Admission, Queues, admit
from shipyard.scheduling.rounds import Received, place_round
from shipyard.scheduling.sizing import DEFAULT_SIZING, Believed, Sizing, resize_jointly
from shipyard.scheduling.status import Reason, Status


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
    resizes: Mapping[str, Resize] = field(default_factory=dict)
    """Elastic jobs whose size changes this round, and why (``elastic``)."""


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
    """Gavel's order of placement: one pass per type, in this order (see ``rounds.place_round``)."""
    ledger: TimeSinceSolve | None = None
    """Gavel's count of the time each job received since the last solve, by which the round
    mechanism ranks jobs (else: time run since arrival, from the jobs themselves)."""
    profile: Profile = DEFAULT_PROFILE
    """The filter and place plugins (``framework``) for every queue without its own."""
    queue_profiles: Mapping[str, Profile] = field(default_factory=dict)
    horizon_s: float = HORIZON_S
    """How far ahead an elastic job's resize must pay for itself (``elastic``)."""
    sizing: Sizing = DEFAULT_SIZING
    """How elastic jobs get their sizes: grown greedily from the gang the policy placed
    (``elastic``), or all sized at once by one program (``sizing``: its objective's name)."""
    believed: Believed | None = None
    """What Sia's program believes of each job's speed (the simulator's ``sim.sia_beliefs``);
    None: the throughputs. Only ``sizing="sia"`` reads it."""
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
        as_running = jobs
        jobs = [_at_smallest(job) for job in jobs]
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
        leases: dict[str, Lease] = dict(plan.leases)
        resizes: dict[str, Resize] = {}
        preempted = plan.preempted
        if any(job.elastic for job in as_running):
            admitted = [j for j in as_running if j.id in job_set or j.id in plan.leases]
            leases, resizes = self._sized(admitted, nodes, plan, throughputs, now_s)
            ran = (j.id for j in as_running if j.running_on is not None)
            preempted = tuple(sorted(job_id for job_id in ran if job_id not in leases))
            for job_id in plan.leases.keys() - leases.keys():  # sized out (Sia's program decides who runs)
                reasons[job_id] = Status(Reason.RANKED_BEHIND, SIZED_OUT_MESSAGE)
        plan = RoundPlan(leases=leases, preempted=preempted, pending_reasons=reasons)
        return Decision(plan=plan, admission=admission, solved=solved, resizes=resizes)

    def _sized(
        self,
        jobs: Sequence[Job],
        nodes: Sequence[Node],
        plan: RoundPlan,
        throughputs: Throughputs,
        now_s: float,
    ) -> tuple[dict[str, Lease], dict[str, Resize]]:
        """The leases with the elastic jobs at their sizes (``sizing``), and the resizes."""
        if self.sizing == "greedy":
            return resize(jobs, nodes, plan.leases, throughputs, horizon_s=self.horizon_s)
        return resize_jointly(
            jobs,
            nodes,
            plan.leases,
            throughputs,
            now_s=now_s,
            objective=self.sizing,
            horizon_s=self.horizon_s,
            believed=self.believed,
        )


def _at_smallest(job: Job) -> Job:
    """An elastic job as admission, the policy and placement see it: its smallest gang, a running
    one keeping that many of its devices (the rest are borrowed, and the resize phase returns them
    where nothing else needs them)."""
    if not job.elastic or len(job.nodes) <= job.devices:
        return job
    return dataclasses.replace(job, nodes=job.nodes[: job.devices])


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


SIZED_OUT_MESSAGE = "waiting: the elastic jobs' sizing gave this round's devices to jobs with more to gain"
RECLAIMED_MESSAGE = "preempted: its queue borrowed quota that the owner needs back"
