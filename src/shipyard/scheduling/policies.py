"""Allocation policies: one signature, ``allocate(PolicyInput) -> Allocation``, wrapped in a
``Policy`` that carries the traits the cycle needs (strict order, re-solved every round).

An allocation says, for each job, what share of time it should run on each accelerator type; the
round mechanism (``cycle.py``) turns shares into concrete leases round after round. The
optimization policies are linear programs solved with HiGHS (through SciPy), after Gavel
(Narayanan et al., OSDI 2020): throughput of job j under allocation X is sum_k T[j,k] * X[j,k].

The ports of Gavel's programs are solved with ECOS, Gavel's own solver. A max-min program has many
optimal allocations (only the jobs at the minimum are pinned); an interior-point method returns
one in the middle of them, HiGHS a vertex, and which jobs get the slack decides who runs on the
devices left over: on Gavel's seed-0 jobs at 2.4 jobs/h, LAS gives 27.38 h with ECOS, 24.95 h with
HiGHS, and 27.46 h in Gavel's simulator (Clarabel, another interior-point solver, 29.80 h).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, identity, vstack

from shipyard.errors import DependencyMissing, InvalidSpec
from shipyard.scheduling.model import Allocation, Job, PolicyInput

Allocate = Callable[[PolicyInput], Allocation]
Solver = Literal["highs", "ecos"]


def _types_of(job: Job, inp: PolicyInput) -> list[str]:
    return [
        k
        for k in inp.capacity
        if job.allows(k) and inp.capacity[k] >= job.devices and inp.throughputs.of(job, k) > 0
    ]


# --- greedy, heterogeneity-agnostic or -aware -------------------------------------------------


def _greedy(
    inp: PolicyInput,
    order: Sequence[Job],
    choose: Callable[[Job, list[str]], str],
    *,
    sticky: bool,
) -> Allocation:
    """Strict first come, first served, as Gavel's FIFO: jobs take a type with room in ``order``;
    the first one that fits nowhere stops the queue (no job jumps ahead, so big gangs are not
    starved). With ``sticky`` a running job keeps its type; without, every job is placed afresh
    (the performance-aware variant moves jobs to faster types as they free up)."""
    free = dict(inp.capacity)
    allocation: dict[str, dict[str, float]] = {}
    if sticky:
        for job in inp.jobs:
            if job.running_on is not None and free.get(job.running_on, 0) >= job.devices:
                free[job.running_on] -= job.devices
                allocation[job.id] = {job.running_on: 1.0}
    for job in order:
        if job.id in allocation:
            continue
        fitting = [k for k in _types_of(job, inp) if free[k] >= job.devices]
        if not fitting:
            break
        chosen = choose(job, fitting)
        free[chosen] -= job.devices
        allocation[job.id] = {chosen: 1.0}
    return allocation


def _fastest(inp: PolicyInput) -> Callable[[Job, list[str]], str]:
    return lambda job, types: max(types, key=lambda k: inp.throughputs.of(job, k))


def fifo(inp: PolicyInput) -> Allocation:
    """First come, first served, on whichever type has room (a seeded random pick)."""
    order = sorted(inp.jobs, key=lambda j: (j.arrival_s, j.id))

    def pick(job: Job, types: list[str]) -> str:
        # One draw per (seed, job): a fresh generator per call would repeat its first draw
        # for every job and send them all to the same type.
        return random.Random(f"{inp.seed}:{job.id}").choice(sorted(types))

    return _greedy(inp, order, pick, sticky=True)


class GavelFifo:
    """Gavel's FIFO as its code behaves (``scheduler/policies/fifo.py``, ``base`` mode), ported so
    its published figure can be reproduced job for job; ``fifo`` is the policy as described.

    It remembers its placements from one solve to the next. Each solve, a finished job's type
    goes to the head of the queue if it fits there; then queued jobs are placed in arrival order
    while some type has room for their gang. The seeded random index it draws picks nothing: the
    type is the last (in name order) of those with any free device, so jobs fill V100s, then P100s,
    then K80s, and a type with too few free devices for the gang is over-committed (its jobs then
    take turns, round by round, through the round mechanism). The drawn index only says which
    type leaves the list when one fills up exactly: often not the one that filled.
    """

    def __init__(self) -> None:
        self.placed: dict[tuple[float, str], str] = {}
        """(arrival, job id) -> its type, in Gavel's order of job ids (arrival)."""
        self.rng: random.Random | None = None

    def __call__(self, inp: PolicyInput) -> Allocation:
        if self.rng is None:
            self.rng = random.Random(inp.seed)
        active = {(j.arrival_s, j.id): j for j in inp.jobs}
        queue = [active[key] for key in sorted(active) if key not in self.placed]
        free = dict(inp.capacity)
        for key in sorted(self.placed):
            accelerator_type = self.placed[key]
            if key in active:
                free[accelerator_type] -= active[key].devices
                continue
            del self.placed[key]  # finished: its type goes to the head of the queue if it fits
            head = queue[0] if queue else None
            if (
                head is not None
                and head.devices <= free[accelerator_type]
                and inp.throughputs.of(head, accelerator_type) > 0
            ):
                self.placed[(head.arrival_s, queue.pop(0).id)] = accelerator_type
                free[accelerator_type] -= head.devices
        open_types = sorted(k for k in free if free[k] > 0)
        while queue and open_types:
            job = queue.pop(0)
            fitting = [i for i, k in enumerate(open_types) if free[k] >= job.devices]
            if not fitting:
                break
            drawn = fitting[self.rng.randrange(len(fitting))]
            accelerator_type = open_types[-1]  # not open_types[drawn]: see the class's docstring
            if inp.throughputs.of(job, accelerator_type) > 0:
                self.placed[(job.arrival_s, job.id)] = accelerator_type
                free[accelerator_type] -= job.devices
                if free[accelerator_type] == 0:
                    open_types.pop(drawn)
        return {job_id: {k: 1.0} for (_, job_id), k in self.placed.items()}


def gavel_fifo_once(inp: PolicyInput) -> Allocation:
    """Gavel's FIFO as its code behaves: V100s first, over-committed (see ``GavelFifo``)."""
    return GavelFifo()(inp)


def fifo_perf(inp: PolicyInput) -> Allocation:
    """First come, first served, each job on the fastest type that has room."""
    order = sorted(inp.jobs, key=lambda j: (j.arrival_s, j.id))
    return _greedy(inp, order, _fastest(inp), sticky=False)


def priority(inp: PolicyInput) -> Allocation:
    """Highest priority first (then first come), each on the fastest type that has room; a
    higher-priority arrival preempts a lower-priority job."""
    order = sorted(inp.jobs, key=lambda j: (-j.priority, j.arrival_s, j.id))
    return _greedy(inp, order, _fastest(inp), sticky=False)


# --- linear programs --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Problem:
    """Variables x[(j,k)] for every job and allowed type, with throughputs and capacity rows."""

    jobs: list[Job]
    pairs: list[tuple[int, str]]
    throughput: np.ndarray
    types: list[str]

    @classmethod
    def of(cls, inp: PolicyInput) -> _Problem:
        jobs = list(inp.jobs)
        pairs: list[tuple[int, str]] = []
        throughput: list[float] = []
        for j, job in enumerate(jobs):
            for k in _types_of(job, inp):
                pairs.append((j, k))
                throughput.append(inp.throughputs.of(job, k))
        return cls(jobs, pairs, np.asarray(throughput), sorted(inp.capacity))

    def base_rows(self, inp: PolicyInput) -> tuple[list[int], list[int], list[float], list[float]]:
        """Each job's shares sum to <= 1; each type's gangs fit its devices."""
        rows, cols, vals, rhs = [], [], [], []
        for v, (j, _) in enumerate(self.pairs):
            rows.append(j)
            cols.append(v)
            vals.append(1.0)
        rhs += [1.0] * len(self.jobs)
        offset = len(self.jobs)
        type_row = {k: offset + i for i, k in enumerate(self.types)}
        for v, (j, k) in enumerate(self.pairs):
            rows.append(type_row[k])
            cols.append(v)
            vals.append(float(self.jobs[j].devices))
        rhs += [float(inp.capacity[k]) for k in self.types]
        return rows, cols, vals, rhs

    def solve(
        self,
        inp: PolicyInput,
        objective: np.ndarray,
        extra_rows: list[tuple[list[int], list[float], float]],
        extra_vars: int,
        solver: Solver = "highs",
        *,
        exact: bool = False,
    ) -> Allocation | None:
        """The allocation at the optimum; None when the program is infeasible (with ``exact``,
        ECOS's answers to reduced accuracy count as infeasible, as Gavel's bisection has it)."""
        if not self.pairs:
            return {}
        rows, cols, vals, rhs = self.base_rows(inp)
        n_vars = len(self.pairs) + extra_vars
        for r, (c_idx, c_val, bound) in enumerate(extra_rows, start=len(rhs)):
            rows += [r] * len(c_idx)
            cols += c_idx
            vals += c_val
            rhs.append(bound)
        a_ub = coo_matrix((vals, (rows, cols)), shape=(len(rhs), n_vars))
        if solver == "ecos":
            x = _ecos(objective, a_ub, np.asarray(rhs), exact=exact)
        else:
            x = _highs(objective, a_ub, rhs)
        if x is None:
            return None
        allocation: dict[str, dict[str, float]] = {}
        for v, (j, k) in enumerate(self.pairs):
            share = float(x[v])
            if share > 1e-6:
                allocation.setdefault(self.jobs[j].id, {})[k] = min(1.0, share)
        return allocation

    def max_min(self, inp: PolicyInput, scale: np.ndarray, solver: Solver = "highs") -> Allocation:
        """Maximize t with sum_k scale_j * T[j,k] * x[j,k] >= t for every job."""
        t = len(self.pairs)
        objective = np.zeros(t + 1)
        objective[t] = -1.0
        per_job: dict[int, tuple[list[int], list[float]]] = {}
        for v, (j, _) in enumerate(self.pairs):
            cols, coefs = per_job.setdefault(j, ([], []))
            cols.append(v)
            coefs.append(-float(scale[j] * self.throughput[v]))
        extra = [([*cols, t], [*coefs, 1.0], 0.0) for cols, coefs in per_job.values()]
        return self.solve(inp, objective, extra, extra_vars=1, solver=solver) or {}


def _highs(objective: np.ndarray, a_ub: coo_matrix, rhs: list[float]) -> np.ndarray | None:
    result = linprog(objective, A_ub=a_ub.tocsr(), b_ub=rhs, bounds=(0, None), method="highs")
    return result.x if result.status == 0 else None


def _ecos(objective: np.ndarray, a_ub: coo_matrix, rhs: np.ndarray, *, exact: bool) -> np.ndarray | None:
    """min c.x over A x <= b, x >= 0 with ECOS (its defaults, as cvxpy hands Gavel's programs to it)."""
    try:
        import ecos
    except ImportError:
        raise DependencyMissing(
            "the gavel_* policies solve with ECOS, Gavel's solver, which is not installed",
            hint="pip install 'shipyard[gavel]'",
        ) from None
    n = a_ub.shape[1]
    g = vstack([a_ub, -identity(n, format="coo")]).tocsc()
    h = np.concatenate([rhs, np.zeros(n)])
    cones = {"l": g.shape[0], "q": [], "e": 0}
    found = ecos.solve(np.asarray(objective, dtype=float), g, h, cones, verbose=False)
    # 0: optimal; 10: optimal to reduced accuracy, which cvxpy calls "optimal_inaccurate" and
    # Gavel's max-min policies use all the same.
    return np.asarray(found["x"]) if found["info"]["exitFlag"] in ((0,) if exact else (0, 10)) else None


def _equal_share_throughput(job: Job, inp: PolicyInput, demand: float) -> float:
    """Throughput with an equal share of every type: what max-min fairness normalizes by."""
    total = sum(inp.capacity.values())
    share = min(1.0, total / max(demand, 1.0))
    return sum(inp.throughputs.of(job, k) * inp.capacity[k] / total for k in inp.capacity) * share


def gavel_las_perf(inp: PolicyInput) -> Allocation:
    """Gavel's heterogeneity-aware max-min fairness (LAS), ported as a linear program.

    Maximizes the smallest throughput of any job, each normalized by what an equal share of every
    type would give it, weighted by priority and multiplied by its gang size: a one-device job
    gets as much time as a job of k devices would get k times over (``MaxMinFairnessPolicyWithPerf``
    since May 2020; an earlier version weighted gangs twice).
    """
    problem = _Problem.of(inp)
    demand = sum(j.devices for j in problem.jobs)
    scale = np.array(
        [j.devices / (max(_equal_share_throughput(j, inp, demand), 1e-12) * j.priority) for j in problem.jobs]
    )
    return problem.max_min(inp, scale, solver="ecos")


def finish_time_fairness(inp: PolicyInput) -> Allocation:
    """Themis-style: jobs furthest behind their fair finish time get the most throughput.

    Normalizes each job's throughput by the throughput it needs to finish within its isolated
    (equal-share) time, counted from its arrival.
    """
    problem = _Problem.of(inp)
    demand = sum(j.devices for j in problem.jobs)
    scale = []
    for job in problem.jobs:
        fair = _equal_share_throughput(job, inp, demand)
        isolated_s = job.total_steps / max(fair, 1e-12)
        left_s = max(isolated_s - (inp.now_s - job.arrival_s), 0.05 * isolated_s)
        needed = job.remaining_steps / left_s
        scale.append(1.0 / max(needed, 1e-12))
    return problem.max_min(inp, np.array(scale))


def fluid_makespan(
    rates: np.ndarray, remaining: np.ndarray, devices: np.ndarray, capacity: np.ndarray
) -> tuple[float, np.ndarray] | None:
    """The shortest time in which every job could end, with the seconds each runs on each type.

    A linear program over h[j,k], the seconds job j's gang runs on type k (``rates[j,k]`` steps/s,
    0 where it cannot run): every job gets its ``remaining`` steps done, no type holds more gangs
    than its ``capacity`` on average, and no job runs longer than the makespan. It ignores rounds,
    whole gangs and placement. None when some job can run nowhere.
    """
    n_jobs, n_types = rates.shape
    if n_jobs == 0:
        return 0.0, np.zeros((0, n_types))
    if not (rates > 0).any(axis=1).all():
        return None
    makespan = n_jobs * n_types  # index of the last variable
    job_index, type_index = np.nonzero(rates > 0)
    variable = job_index * n_types + type_index
    runnable = len(variable)
    jobs_column = np.arange(n_jobs)
    rows = np.concatenate([
        job_index,  # done fraction >= 1
        n_jobs + type_index,  # gangs on a type fit its devices
        n_jobs + n_types + job_index,  # one type at a time: no job runs longer than the makespan
        n_jobs + np.arange(n_types),
        n_jobs + n_types + jobs_column,
    ])  # fmt: skip
    cols = np.concatenate([variable, variable, variable, np.full(n_types + n_jobs, makespan)])
    vals = np.concatenate([
        -rates[job_index, type_index] / np.maximum(remaining[job_index], 1e-9),
        devices[job_index].astype(float),
        np.ones(runnable),
        -capacity.astype(float),
        -np.ones(n_jobs),
    ])  # fmt: skip
    rhs = np.concatenate([-np.ones(n_jobs), np.zeros(n_types + n_jobs)])
    objective = np.zeros(makespan + 1)
    objective[makespan] = 1.0
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(rhs), makespan + 1)).tocsr()
    upper = np.zeros(makespan + 1)
    upper[variable] = np.inf
    upper[makespan] = np.inf
    result = linprog(
        objective,
        A_ub=matrix,
        b_ub=rhs,
        bounds=np.column_stack([np.zeros(makespan + 1), upper]),
        method="highs",
    )
    if result.status != 0:
        return None
    return float(result.x[makespan]), result.x[:makespan].reshape(n_jobs, n_types)


def min_makespan(inp: PolicyInput) -> Allocation:
    """Finish all current jobs as early as possible: maximize z with throughput_j >= remaining_j * z."""
    problem = _Problem.of(inp)
    scale = np.array([1.0 / max(j.remaining_steps, 1e-9) for j in problem.jobs])
    return problem.max_min(inp, scale)


GAVEL_MIN_T_S, GAVEL_MAX_T_S, GAVEL_T_TOLERANCE = 100.0, 1e6, 1.05
"""Gavel's bisection over the makespan T: from 100 s to 10^6 s (ten times more while none is
feasible), until the bounds are within 5 % of each other."""


def gavel_min_makespan(inp: PolicyInput) -> Allocation:
    """Gavel's makespan policy (``min_total_duration_perf``), ported: the smallest T it finds.

    Bisects T as Gavel does; each T asks whether an allocation lets every job finish within T
    (``sum_k T[j,k] x[j,k] >= remaining_j / T``, a feasibility program ECOS answers with a point
    inside the feasible set), and the allocation found at the last feasible T is the answer: up to
    5 % above the optimum that ``min_makespan`` solves exactly.
    """
    problem = _Problem.of(inp)
    if not problem.pairs:
        return {}
    nothing = np.zeros(len(problem.pairs))

    def within(horizon_s: float) -> Allocation | None:
        per_job: dict[int, tuple[list[int], list[float]]] = {}
        for v, (j, _) in enumerate(problem.pairs):
            cols, coefs = per_job.setdefault(j, ([], []))
            cols.append(v)
            coefs.append(-float(problem.throughput[v]))
        rows = [
            (cols, coefs, -problem.jobs[j].remaining_steps / horizon_s)
            for j, (cols, coefs) in per_job.items()
        ]
        return problem.solve(inp, nothing, rows, extra_vars=0, solver="ecos", exact=True)

    low, high, found = GAVEL_MIN_T_S, GAVEL_MAX_T_S, None
    while found is None:
        while GAVEL_T_TOLERANCE * low < high:
            middle = (low + high) / 2
            if (allocation := within(middle)) is not None:
                found, high = allocation, middle
            else:
                low = middle
        low, high = high, high * 10  # nothing within the range: ten times further
    return found


def max_throughput_per_dollar(inp: PolicyInput) -> Allocation:
    """Maximize the sum of normalized throughputs per dollar of device time."""
    problem = _Problem.of(inp)
    best: dict[int, float] = {}
    for (j, _), rate in zip(problem.pairs, problem.throughput, strict=True):
        best[j] = max(best.get(j, 0.0), float(rate))
    cheapest = min((p for p in inp.prices.values() if p > 0), default=1.0)
    dollars = [
        max(inp.prices.get(k, 0.0), cheapest * 0.01) * problem.jobs[j].devices for j, k in problem.pairs
    ]
    objective = np.array(
        [-problem.throughput[v] / best[j] / dollars[v] for v, (j, _) in enumerate(problem.pairs)]
    )
    return problem.solve(inp, objective, [], extra_vars=0) or {}


# --- shortest remaining work, performance-aware (the default) ----------------------------------

AGING_S = 12 * 3600.0
"""A waiting job's weight doubles every 12 h waited, so long jobs are never starved."""
STAY_BONUS = 1.2
"""A running job values its current type 20 % more: moving costs a restart."""
CRITICAL_FRACTION = 0.9
"""A job within 90 % of the horizon of the known work is critical (see ``_critical``)."""
CRITICAL_BOOST = 1e6
PRICE_ITERATIONS = 60

# shortest_remaining_fluid: the same, guided by the fluid makespan program
COMPARATIVE_WEIGHT = 0.75
"""How far a job's liking for a type follows its comparative advantage (its speed there in the
fluid program's exchange rates) rather than its speed against its own fastest type. At 0 (the
default policy) every job wants the V100s and Gavel's 700 jobs (seed 0) spend 11 % more
device-hours than the makespan bound; at 1 the short jobs run where they gain least."""
TIGHT_SHARE = 0.9
"""A job the fluid makespan program keeps running at least 90 % of the time from now on is
critical: any wait lengthens the whole batch."""
HORIZON_SHARE = 0.99
"""A job whose own time is (within 1 %) the horizon of the known work is critical too (see
``_critical``): the program lets such a job run a share of the rounds that ends it exactly at its
makespan, and the rounds it then waits on slower types or behind shorter jobs end the batch late
(Gavel's seed 2: the longest 8-device gang ran half the rounds of its last 40 h, and the batch
ended at 1.041x the bound; never waiting, at 1.024x)."""
FLUID_MAX_JOBS = 2000
"""Above this many jobs the fluid program (a linear program over every job and type) is not
solved; critical jobs are then found by the horizon rule (``_critical``)."""
EXCHANGE_ITERATIONS = 40


def fluid_plan(inp: PolicyInput, rates: np.ndarray, types: Sequence[str]) -> dict[str, frozenset[str]] | None:
    """The jobs ``fluid_makespan`` keeps running nearly all the time (see ``TIGHT_SHARE``), each
    with the types it runs them on; None where it is not solved (too many jobs, or a job that fits
    no type)."""
    if not inp.jobs or len(inp.jobs) > FLUID_MAX_JOBS:
        return None
    remaining = np.array([j.remaining_steps for j in inp.jobs], dtype=float)
    devices = np.array([j.devices for j in inp.jobs], dtype=float)
    capacity = np.array([inp.capacity[k] for k in types], dtype=float)
    solved = fluid_makespan(rates, remaining, devices, capacity)
    if solved is None:
        return None
    makespan, seconds = solved
    busy = seconds.sum(axis=1) >= TIGHT_SHARE * makespan
    return {
        job.id: frozenset(k for k, s in zip(types, seconds[i], strict=True) if s > 1e-6 * makespan)
        for i, job in enumerate(inp.jobs)
        if busy[i]
    }


def exchange_rates(
    rates: np.ndarray, remaining: np.ndarray, devices: np.ndarray, capacity: np.ndarray
) -> np.ndarray:
    """What a device-second of each type is worth when all the work left is spread so that every
    type ends together (the fluid makespan program's prices, found by balancing): each job's work
    goes mostly to the types where it costs least at these prices, and a type with more work per
    device than the others gets dearer. Only the ratios matter; they average 1."""
    somewhere = (rates > 0).any(axis=1)  # a job that fits no type weighs on none
    rates, remaining, devices = rates[somewhere], remaining[somewhere], devices[somewhere]
    runnable = rates > 0
    with np.errstate(divide="ignore"):
        work = np.where(runnable, (remaining * devices)[:, None] / np.where(runnable, rates, 1.0), np.inf)
    price = np.ones(rates.shape[1])
    for step in range(EXCHANGE_ITERATIONS):
        cost = work * price[None, :]
        relative = cost / np.maximum(cost.min(axis=1, keepdims=True), 1e-300)  # a job with no work left: 0
        share = np.where(runnable, np.exp(-8.0 * np.where(runnable, relative - 1.0, 0.0)), 0.0)
        share /= share.sum(axis=1, keepdims=True)
        load = (share * np.where(runnable, work, 0.0)).sum(axis=0) / capacity
        if load.mean() <= 0:
            break
        price *= np.clip(load / load.mean(), 0.5, 2.0) ** (0.5 / np.sqrt(step + 1))
        price /= price.mean()
    return price


def _srpt_weights(
    inp: PolicyInput, jobs: Sequence[Job], remaining: np.ndarray, critical: np.ndarray
) -> np.ndarray:
    """Priority x aging / device-seconds of work left on the job's best type (shortest first),
    except for critical jobs, which go before all others."""
    weights = np.empty(len(jobs))
    for i, job in enumerate(jobs):
        waited = 0.0 if job.running_on else max(0.0, inp.now_s - job.arrival_s)
        boost = CRITICAL_BOOST if critical[i] else 1.0
        weights[i] = job.priority * boost * (1 + waited / AGING_S) / max(remaining[i] * job.devices, 1.0)
    return weights


def _critical(
    remaining_s: np.ndarray, devices: np.ndarray, total_devices: int, share: float = CRITICAL_FRACTION
) -> np.ndarray:
    """Jobs that would end the last if they waited any longer.

    Everything now known cannot finish before a horizon: the longest job's time alone, or all
    the work spread over all devices. A job whose own time is close to that horizon must run now
    or the whole batch finishes later; shortest-first alone would start it last.
    """
    if remaining_s.size == 0:
        return np.zeros(0, dtype=bool)
    horizon = max(float(remaining_s.max()), float(remaining_s @ devices) / max(total_devices, 1))
    return remaining_s >= share * horizon


def _value_matrix(inp: PolicyInput, *, guided: bool) -> tuple[list[Job], list[str], np.ndarray, np.ndarray]:
    """value[j,k]: what running job j on type k is worth this round (-inf where it cannot run)."""
    jobs = list(inp.jobs)
    types = sorted(inp.capacity)
    rates = np.zeros((len(jobs), len(types)))
    for i, job in enumerate(jobs):
        for k, name in enumerate(types):
            if job.allows(name) and inp.capacity[name] >= job.devices:
                rates[i, k] = inp.rate(job, name)
    best = rates.max(axis=1) if types else np.zeros(len(jobs))
    devices = np.array([j.devices for j in jobs], dtype=float)
    steps = np.array([j.remaining_steps for j in jobs], dtype=float)
    remaining = steps / np.maximum(best, 1e-12)
    with np.errstate(divide="ignore", invalid="ignore"):
        fastest = np.where(best[:, None] > 0, rates / best[:, None], 0.0)
    speed = fastest
    if guided and types:
        capacity = np.array([inp.capacity[k] for k in types], dtype=float)
        priced = rates / exchange_rates(rates, steps, devices, capacity)[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            most = priced.max(axis=1)[:, None]
            comparative = np.where(most > 0, priced / most, 0.0)
        speed = fastest ** (1 - COMPARATIVE_WEIGHT) * comparative**COMPARATIVE_WEIGHT
    plan = fluid_plan(inp, rates, types) if guided and types else None
    if plan is None:
        critical = _critical(remaining, devices, sum(inp.capacity.values()))
    else:
        # A critical job runs where the fluid plan runs it, as fast as it goes there.
        critical = np.array([job.id in plan for job in jobs], dtype=bool)
        for row in np.flatnonzero(critical):
            planned = [k in plan[jobs[row].id] for k in types]
            speed[row] = np.where(planned, fastest[row], 0.0)
        critical |= _critical(remaining, devices, sum(inp.capacity.values()), HORIZON_SHARE)
    value = _srpt_weights(inp, jobs, remaining, critical)[:, None] * speed * devices[:, None]
    for i, job in enumerate(jobs):
        if job.running_on in types:
            value[i, types.index(job.running_on)] *= STAY_BONUS
    value[rates <= 0] = -np.inf
    return jobs, types, value, devices


def shortest_remaining_perf(inp: PolicyInput) -> Allocation:
    """Shortest remaining work first, each job on the type it gains most from, sized to the cluster.

    Maximizes the sum over jobs of (weight x normalized throughput), the weight being priority x
    aging / remaining device-seconds: a job that is nearly done, or that runs 10x faster on a
    V100 than elsewhere, gets the V100 before one that barely gains from it. Solved through its
    Lagrangian dual — one price per accelerator type, found by subgradient steps — and rounded to
    whole gangs greedily, so a cycle over 10,000 jobs takes milliseconds instead of a large LP.
    """
    return _allocate_srpt(inp, guided=False)


def shortest_remaining_fluid(inp: PolicyInput) -> Allocation:
    """Shortest remaining work first by comparative advantage, makespan-critical jobs at once.

    As ``shortest_remaining_perf``, but a job's speed on a type is weighed mostly by its speed in
    the fluid program's exchange rates (``exchange_rates``), so the batch spends about the
    device-hours the makespan bound spends; and the jobs the fluid makespan program keeps running
    (``fluid_plan``) go before all others, on the types it gives them, as does the job whose own
    time is the horizon of all the known work (``HORIZON_SHARE``), so short jobs end early and the
    whole batch still ends near its bound. The program is solved on every call: up to
    ``FLUID_MAX_JOBS`` jobs, tens of milliseconds for hundreds.
    """
    return _allocate_srpt(inp, guided=True)


def _allocate_srpt(inp: PolicyInput, *, guided: bool) -> Allocation:
    jobs, types, value, devices = _value_matrix(inp, guided=guided)
    if not jobs or not types:
        return {}
    capacity = np.array([inp.capacity[k] for k in types], dtype=float)
    finite = value[np.isfinite(value)]
    if finite.size == 0:
        return {}
    per_device = finite / np.repeat(devices, np.isfinite(value).sum(axis=1))
    scale = float(np.median(per_device)) or 1.0
    prices = np.zeros(len(types))
    for step in range(PRICE_ITERATIONS):
        adjusted = value - prices[None, :] * devices[:, None]
        choice = adjusted.argmax(axis=1)
        wanted = adjusted[np.arange(len(jobs)), choice] > 0
        demand = np.bincount(choice[wanted], weights=devices[wanted], minlength=len(types))
        prices = np.maximum(0.0, prices + scale * (demand - capacity) / capacity / np.sqrt(step + 1))
    return _round_to_gangs(jobs, types, value, devices, prices, capacity)


def _round_to_gangs(
    jobs: list[Job],
    types: list[str],
    value: np.ndarray,
    devices: np.ndarray,
    prices: np.ndarray,
    capacity: np.ndarray,
) -> Allocation:
    """Whole gangs, most valuable (after prices) first; then leftover devices to whoever can use them."""
    free = capacity.copy()
    adjusted = value - prices[None, :] * devices[:, None]
    allocation: dict[str, dict[str, float]] = {}
    for pass_values in (adjusted, value):
        order = np.argsort(-pass_values.max(axis=1), kind="stable")
        for i in order:
            if jobs[i].id in allocation:
                continue
            for k in np.argsort(-pass_values[i], kind="stable"):
                if not np.isfinite(pass_values[i, k]) or pass_values[i, k] <= 0:
                    break
                if free[k] >= devices[i]:
                    free[k] -= devices[i]
                    allocation[jobs[i].id] = {types[k]: 1.0}
                    break
    return allocation


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """An allocation policy and what the cycle must know of it."""

    name: str
    allocate: Allocate
    remembers: Callable[[], Allocate] | None = None
    """For a policy that keeps state from one solve to the next (Gavel's FIFO): a fresh one per
    run, which ``policy_named`` puts in ``allocate``."""
    strict_order: bool = False
    """Its order is the point (FIFO, priority): idle devices are not backfilled with jobs further
    back."""
    every_round: bool = False
    """Re-solved every round (its weights move with progress and waiting time); the others, like
    Gavel's, only when the set of jobs changes."""

    def __call__(self, inp: PolicyInput) -> Allocation:
        return self.allocate(inp)

    @property
    def summary(self) -> str:
        """The first line of its description."""
        return (self.allocate.__doc__ or "").strip().splitlines()[0]


POLICIES: Mapping[str, Policy] = {
    p.name: p
    for p in (
        Policy(name="fifo", allocate=fifo, strict_order=True),
        Policy(name="fifo_perf", allocate=fifo_perf, strict_order=True),
        Policy(name="gavel_fifo", allocate=gavel_fifo_once, remembers=GavelFifo, strict_order=True),
        Policy(name="priority", allocate=priority, strict_order=True),
        Policy(name="gavel_las_perf", allocate=gavel_las_perf),
        Policy(name="finish_time_fairness", allocate=finish_time_fairness),
        Policy(name="min_makespan", allocate=min_makespan),
        Policy(name="gavel_min_makespan", allocate=gavel_min_makespan),
        Policy(name="max_throughput_per_dollar", allocate=max_throughput_per_dollar),
        Policy(name="shortest_remaining_perf", allocate=shortest_remaining_perf, every_round=True),
        Policy(name="shortest_remaining_fluid", allocate=shortest_remaining_fluid, every_round=True),
    )
}
DEFAULT_POLICY = "shortest_remaining_fluid"
ALIASES = {"shipyard": DEFAULT_POLICY}
"""Former names that settings and scripts may still give."""


GAVEL_COUNTERPARTS = {
    "max_min_fairness_perf": "gavel_las_perf",
    "min_total_duration_perf": "gavel_min_makespan",
    "finish_time_fairness_perf": "finish_time_fairness",
    "max_sum_throughput_normalized_by_cost_perf": "max_throughput_per_dollar",
}
"""Gavel's policy names (``scheduler/utils.py: get_policy``) whose counterparts here have
another name; its ``fifo`` and ``fifo_perf`` share theirs."""
GAVEL_WITHOUT_PORT = (
    "allox", "fifo_packed", "finish_time_fairness", "finish_time_fairness_packed", "gandiva",
    "isolated", "max_min_fairness", "max_min_fairness_packed", "max_min_fairness_water_filling",
    "max_min_fairness_water_filling_packed", "max_min_fairness_water_filling_perf",
    "max_sum_throughput_perf", "min_total_duration", "min_total_duration_packed",
)  # fmt: skip
"""Gavel's other policies: space sharing (packed), heterogeneity-agnostic and the rest, not ported."""


def policy_named(name: str) -> Policy:
    """The policy of that name, ready for one run (a policy with state gets a fresh one)."""
    policy = POLICIES.get(ALIASES.get(name, name))
    if policy is not None:
        return policy if policy.remembers is None else replace(policy, allocate=policy.remembers())
    choices = f"use one of: {', '.join(POLICIES)}"
    if name in GAVEL_COUNTERPARTS:
        counterpart = GAVEL_COUNTERPARTS[name]
        raise InvalidSpec(
            f"{name!r} is Gavel's name of a policy; Shipyard's counterpart is {counterpart!r}",
            hint=f"use --policy {counterpart}",
        )
    if name in GAVEL_WITHOUT_PORT:
        raise InvalidSpec(f"Gavel's policy {name!r} has no port in Shipyard", hint=choices)
    raise InvalidSpec(f"unknown policy {name!r}", hint=choices)
