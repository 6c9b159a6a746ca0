"""A discrete-event simulator that drives the scheduler's own ``Cycle`` with a virtual clock.

Rounds of ``round_s``: at each round boundary the arrived jobs go through the same cycle as the
live agent's (memory fit, quota admission, the policy, the round's leases; the policy re-solved
when the set of jobs changed, or every round for those that ask), and the simulated executor
advances each leased job by its throughput on that type (the spread figure when its gang spans
nodes) for the round, minus the restart cost when its lease changed. A job that finishes
mid-round frees its devices at the next round, as in Gavel. Preemption checkpoints first: no
completed step is ever lost.
"""

from __future__ import annotations

import bisect
import dataclasses
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shipyard.scheduling.cycle import Cycle, TimeSinceSolve
from shipyard.scheduling.elastic import HORIZON_S, Curves
from shipyard.scheduling.framework import DEFAULT_PROFILE, Profile, queue_profiles
from shipyard.scheduling.model import Allocation, Job, Lease, Node, PolicyInput, RoundPlan, Throughputs
from shipyard.scheduling.policies import Policy
from shipyard.scheduling.quota import Queues
from shipyard.scheduling.sizing import DEFAULT_SIZING, Believed, Sizing
from shipyard.sim.workload import TraceJob


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    round_s: float = 360.0
    restart_cost_s: float = 0.0
    window: tuple[int, int] | None = None
    """Measure jobs [start, end) in arrival order; stop once they all finished."""
    seed: int = 0
    prices: Mapping[str, float] = field(default_factory=dict)
    spread_slowdown: bool = True
    """A gang spread over nodes runs at the file's unconsolidated throughput. Gavel's simulator
    always uses the consolidated one; turn this off to compare with its published figures."""
    queues: Queues | None = None
    """Quotas, as the live agent's queue configuration (None: no quota)."""
    # Gavel's round mechanism, each part on its own (all three: ``GAVEL_MECHANISM``).
    resolve_after_s: float = 0.0
    """A changed set of jobs re-solves the policy only this long after the last solve."""
    received_since_solve: bool = False
    """Rank jobs by their share of each type's time since the last solve, half a round credited
    to each job on each type then (else: the time run on the type since arrival)."""
    round_ends_at_last_finish: bool = False
    """A round lasts until the last of its jobs stops (at most ``round_s``), not ``round_s``."""
    types_in_turn: bool = False
    """Place jobs type by type, fastest type first, each type's devices filled before the next
    is looked at (else: one ranking of every job on every type)."""
    profile: Profile = DEFAULT_PROFILE
    """The filter and place plugins the cycle runs (``scheduling.framework``)."""
    resize_horizon_s: float = HORIZON_S
    """How far ahead an elastic job's resize must pay for itself (``scheduling.elastic``)."""
    sizing: Sizing = DEFAULT_SIZING
    """How the cycle sizes elastic jobs (``Cycle.sizing``)."""
    node_moves_free: bool = False
    """A gang moved to other nodes of its type, as many devices on each, does not restart (Sia's
    job model compares devices per node, not which nodes: ``job.py: reallocate``)."""
    beliefs: Beliefs | None = None
    """What Sia's sizing knows of each job's speed (``sia_beliefs``); None: the true curves."""
    first_start_costs: bool = False
    """A job's first start costs its restart seconds too (Sia's job model: ``job.py`` sets
    ``rescale_time`` on every new placement, the first included)."""


Config = tuple[str, int]
"""(accelerator type, devices)."""


class Beliefs(Protocol):
    """A sizing's own knowledge of each job's speed, learned from where the job ran."""

    def ran(self, index: int, gpu: str, count: int) -> None: ...

    def restart_s(self, index: int) -> float: ...

    def rates(
        self, index: int, configs: Sequence[tuple[str, int]]
    ) -> Mapping[tuple[str, int], float] | None: ...


GAVEL_MECHANISM = {
    "resolve_after_s": 1920.0,
    "received_since_solve": True,
    "round_ends_at_last_finish": True,
    "types_in_turn": True,
}
"""SimConfig's options that make the round mechanism Gavel's simulator's (``scheduler.py``:
``_update_priorities``, ``_reset_time_run_so_far``, ``simulate``)."""


@dataclass(slots=True)
class _State:
    index: int
    trace: TraceJob
    steps_done: float = 0.0
    attained: dict[str, float] = field(default_factory=dict)
    lease: Lease | None = None
    started: bool = False
    finish_s: float | None = None
    restarts: int = 0
    largest_run: int = 0
    owed_s: float = 0.0
    """Seconds of a restart not yet paid: one longer than a round stops the next rounds too."""

    def snapshot(self) -> Job:
        t = self.trace
        return Job(
            id=str(self.index),
            job_type=t.job_type,
            devices=t.devices,
            arrival_s=t.arrival_s,
            total_steps=t.total_steps,
            steps_done=self.steps_done,
            accelerator_types=t.accelerator_types,
            priority=t.priority,
            queue=t.queue,
            min_memory_gib=t.min_memory_gib,
            sizes=t.sizes,
            resize_s=t.resize_s,
            restarts=self.restarts,
            largest_run=self.largest_run,
            restarting=self.owed_s > 0 and self.lease is not None,
            attained_s=self.attained,
            running_on=self.lease.accelerator_type if self.lease else None,
            nodes=self.lease.nodes if self.lease else (),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    jobs_measured: int
    avg_jct_h: float
    p50_jct_h: float
    p99_jct_h: float
    makespan_h: float
    utilization: float
    device_hours: float
    restarts_per_job: float
    worst_ftf_rho: float
    cost_usd: float
    policy_solve_ms_p50: float
    policy_solve_ms_max: float
    rounds: int
    simulated_h: float
    avg_jct_h_by_queue: Mapping[str, float] = field(default_factory=dict)
    """Where jobs waited in several queues: the average JCT of each queue's measured jobs."""

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


def simulate(
    jobs: Sequence[TraceJob],
    nodes: Sequence[Node],
    throughputs: Throughputs,
    policy: Policy,
    config: SimConfig,
    progress: Callable[[int, int], None] | None = None,
    on_round: Callable[[float, Sequence[Job], RoundPlan], None] | None = None,
) -> SimResult:
    """Run until every measured job finished; ``progress(done, total)`` hears of each completion,
    ``on_round(now_s, jobs, plan)`` of each round's snapshot and the cycle's plan for it."""
    states = [_State(index=i, trace=t) for i, t in enumerate(sorted(jobs, key=lambda j: j.arrival_s))]
    capacity: dict[str, int] = {}
    for node in nodes:
        capacity[node.accelerator_type] = capacity.get(node.accelerator_type, 0) + node.devices
    total_devices = sum(capacity.values())
    measured = set(range(*config.window)) if config.window else set(range(len(states)))
    measured &= set(range(len(states)))

    now = states[0].trace.arrival_s if states else 0.0
    next_arrival = 0
    active: list[_State] = []
    solve_ms: list[float] = []
    cycle = Cycle(
        policy=_timed(policy, solve_ms),
        queues=config.queues,
        round_s=config.round_s,
        prices=config.prices,
        seed=config.seed,
        resolve_after_s=config.resolve_after_s,
        type_passes=_fastest_first(throughputs, capacity) if config.types_in_turn else None,
        ledger=TimeSinceSolve(credit_s=config.round_s / 2) if config.received_since_solve else None,
        profile=config.profile,
        horizon_s=config.resize_horizon_s,
        sizing=config.sizing,
        believed=None if config.beliefs is None else _believed(config.beliefs, capacity),
        queue_profiles={}
        if config.queues is None
        else queue_profiles(config.queues.placements(), config.profile),
    )
    # The scheduler sees the spread figures only where gangs spread over nodes do run slower.
    seen = throughputs if config.spread_slowdown else Throughputs(packed=throughputs.packed)
    curves = Curves(throughputs)
    busy_device_s = 0.0
    cost = 0.0
    rounds = 0
    unfinished = set(measured)
    while unfinished:
        while next_arrival < len(states) and states[next_arrival].trace.arrival_s <= now:
            arriving = states[next_arrival]
            active.append(arriving)
            next_arrival += 1
        if not active:
            if next_arrival >= len(states):
                break
            now = states[next_arrival].trace.arrival_s
            continue
        snapshot = [_believing(s, config.beliefs) for s in active]
        plan = cycle.run(snapshot, nodes, seen, now_s=now).plan
        if on_round is not None:
            on_round(now, snapshot, plan)
        by_index = {str(s.index): s for s in active}
        for job_id in plan.preempted:
            by_index[job_id].lease = None
        longest_s = 0.0
        for job_id, lease in plan.leases.items():
            state = by_index[job_id]
            used_s = _advance(state, lease, curves, config, now)
            longest_s = max(longest_s, used_s)
            if cycle.ledger is not None:
                cycle.ledger.ran(job_id, lease.accelerator_type, used_s)
            busy_device_s += used_s * len(lease.nodes)
            cost += used_s / 3600 * len(lease.nodes) * config.prices.get(lease.accelerator_type, 0.0)
        done = [s for s in active if s.finish_s is not None]
        if done:
            active = [s for s in active if s.finish_s is None]
            unfinished -= {s.index for s in done}
            if progress is not None:
                progress(len(measured) - len(unfinished), len(measured))
        now += longest_s if config.round_ends_at_last_finish and plan.leases else config.round_s
        rounds += 1
    return _summarize(
        states, measured, total_devices, throughputs, nodes, busy_device_s, cost, solve_ms, rounds
    )


def _believing(state: _State, beliefs: Beliefs | None) -> Job:
    """The job as the scheduler sees it, with the restart seconds the sizing's beliefs charge."""
    job = state.snapshot()
    if beliefs is None or not job.elastic:
        return job
    return dataclasses.replace(job, resize_s=beliefs.restart_s(state.index))


def _believed(beliefs: Beliefs, capacity: Mapping[str, int]) -> Believed:
    """The beliefs as the sizing asks for them: by job (its id is its index here, ``_State``)."""

    def believed(job: Job) -> Mapping[tuple[str, int], float] | None:
        return beliefs.rates(int(job.id), [(kind, size) for kind in capacity for size in job.sizes])

    return believed


def _fastest_first(throughputs: Throughputs, capacity: Mapping[str, int]) -> list[str]:
    """The cluster's types by their summed throughput over every job type (V100, P100, K80)."""
    speed = dict.fromkeys(capacity, 0.0)
    for (_, _, accelerator_type), steps_per_s in throughputs.packed.items():
        if accelerator_type in speed:
            speed[accelerator_type] += steps_per_s
    return sorted(capacity, key=lambda k: (-speed[k], k))


def _timed(policy: Policy, solve_ms: list[float]) -> Policy:
    """The policy, timing each solve into ``solve_ms`` (measurement only: no decision reads a clock)."""

    def allocate(inp: PolicyInput) -> Allocation:
        start = time.perf_counter()
        allocation = policy.allocate(inp)
        solve_ms.append((time.perf_counter() - start) * 1000)
        return allocation

    return dataclasses.replace(policy, allocate=allocate)


def _advance(state: _State, lease: Lease, curves: Curves, config: SimConfig, now: float) -> float:
    """Run one leased job for a round; returns the seconds it held its devices."""
    moved = (
        state.lease is None
        or state.lease.accelerator_type != lease.accelerator_type
        or _shape(state.lease, config.node_moves_free) != _shape(lease, config.node_moves_free)
    )
    if moved and (state.started or config.first_start_costs):
        if state.started:
            state.restarts += 1
        state.owed_s = _restart_s(state, lease, config)
    state.lease = lease
    state.started = True
    state.largest_run = max(state.largest_run, len(lease.nodes))
    level = lease.level if config.spread_slowdown else "node"
    rate = curves.rate(state.snapshot(), lease.accelerator_type, len(lease.nodes), level)
    remaining = state.trace.total_steps - state.steps_done
    penalty = min(state.owed_s, config.round_s)
    state.owed_s -= penalty
    usable = config.round_s - penalty
    if usable > 0 and config.beliefs is not None:  # it ran: its step time there is measured
        config.beliefs.ran(state.index, lease.accelerator_type, len(lease.nodes))
    if rate > 0 and remaining / rate <= usable:
        held = penalty + remaining / rate
        state.steps_done = state.trace.total_steps
        state.finish_s = now + held
        state.lease = None
    else:
        held = config.round_s
        state.steps_done += rate * usable
    state.attained[lease.accelerator_type] = state.attained.get(lease.accelerator_type, 0.0) + held
    return held


def _shape(lease: Lease, by_count: bool) -> tuple[Any, ...]:
    """What a move must change to restart the job: its nodes, or only its devices per node."""
    return tuple(sorted(Counter(lease.nodes).values())) if by_count else lease.nodes


def _restart_s(state: _State, lease: Lease, config: SimConfig) -> float:
    """What starting on ``lease`` costs the job: its own restart seconds where the trace gives
    them, a resize's where it only changed size, else the config's."""
    trace = state.trace
    if trace.restart_s is not None:
        return trace.restart_s
    resized = state.lease is not None and state.lease.accelerator_type == lease.accelerator_type
    return trace.resize_s if resized and trace.resize_s else config.restart_cost_s


def _summarize(
    states: list[_State],
    measured: set[int],
    total_devices: int,
    throughputs: Throughputs,
    nodes: Sequence[Node],
    busy_device_s: float,
    cost: float,
    solve_ms: list[float],
    rounds: int,
) -> SimResult:
    finished = [states[i] for i in sorted(measured) if states[i].finish_s is not None]
    rhos = finish_time_fairness([s.trace for s in states], [s.finish_s for s in states], throughputs, nodes)
    finish = {s.index: s.finish_s or 0.0 for s in finished}
    jcts = sorted((finish[s.index] - s.trace.arrival_s) / 3600 for s in finished) or [0.0]
    first = min((s.trace.arrival_s for s in finished), default=0.0)
    last = max(finish.values(), default=0.0)
    start = states[0].trace.arrival_s if states else 0.0
    end = max((s.finish_s for s in states if s.finish_s is not None), default=start)
    span = max(end - start, 1e-9)
    return SimResult(
        jobs_measured=len(finished),
        avg_jct_h=statistics.fmean(jcts),
        p50_jct_h=_percentile(jcts, 50),
        p99_jct_h=_percentile(jcts, 99),
        makespan_h=(last - first) / 3600,
        utilization=busy_device_s / (total_devices * span),
        device_hours=busy_device_s / 3600,
        restarts_per_job=statistics.fmean([s.restarts for s in finished]) if finished else 0.0,
        worst_ftf_rho=max((r for s in finished if (r := rhos[s.index]) is not None), default=0.0),
        cost_usd=cost,
        policy_solve_ms_p50=_percentile(sorted(solve_ms), 50) if solve_ms else 0.0,
        policy_solve_ms_max=max(solve_ms, default=0.0),
        rounds=rounds,
        simulated_h=span / 3600,
        avg_jct_h_by_queue=_by_queue(finished, finish),
    )


def _by_queue(finished: list[_State], finish: Mapping[int, float]) -> dict[str, float]:
    jcts: dict[str, list[float]] = {}
    for s in finished:
        jcts.setdefault(s.trace.queue, []).append((finish[s.index] - s.trace.arrival_s) / 3600)
    if len(jcts) < 2:
        return {}
    return {queue: statistics.fmean(values) for queue, values in sorted(jcts.items())}


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


def finish_time_fairness(
    jobs: Sequence[TraceJob],
    finish_s: Sequence[float | None],
    throughputs: Throughputs,
    nodes: Sequence[Node],
) -> list[float | None]:
    """Each job's finish-time fairness (Themis's rho): its completion time over the time it would
    need on an equal 1/N share of the cluster, N being the jobs present when it arrived (itself
    included); None where it did not finish. One definition for any simulator's finish times."""
    capacity: dict[str, int] = {}
    for node in nodes:
        capacity[node.accelerator_type] = capacity.get(node.accelerator_type, 0) + node.devices
    total_devices = sum(capacity.values())
    arrivals = sorted(j.arrival_s for j in jobs)
    finishes = sorted(f for f in finish_s if f is not None)
    rhos: list[float | None] = []
    for trace, finish in zip(jobs, finish_s, strict=True):
        if finish is None:
            rhos.append(None)
            continue
        t = trace.arrival_s  # present then: arrived by t, less those finished by t
        present = bisect.bisect_right(arrivals, t) - bisect.bisect_right(finishes, t)
        job = _State(index=0, trace=trace).snapshot()
        mixed_rate = sum(throughputs.of(job, k) * capacity[k] / total_devices for k in capacity)
        share = min(1.0, total_devices / (max(present, 1) * job.devices))
        fair_s = trace.total_steps / max(mixed_rate * share, 1e-12)
        rhos.append((finish - trace.arrival_s) / fair_s)
    return rhos


def cluster_nodes(spec: Mapping[str, int], devices_per_node: int, nodes_per_rack: int = 0) -> list[Node]:
    """``{"v100": 36}`` with 4 per node -> nine 4-device nodes named v100-0 ... v100-8; with
    ``nodes_per_rack`` each is labelled with its rack (``v100-r0`` for the first ones)."""
    nodes = []
    for accelerator_type, count in spec.items():
        full, rest = divmod(count, devices_per_node)
        sizes = [devices_per_node] * full + ([rest] if rest else [])
        nodes += [
            Node(
                id=f"{accelerator_type}-{i}",
                accelerator_type=accelerator_type,
                devices=d,
                labels={"rack": f"{accelerator_type}-r{i // nodes_per_rack}"} if nodes_per_rack else {},
            )
            for i, d in enumerate(sizes)
        ]
    return nodes
