"""Joint sizing: every elastic job's accelerator type and device count chosen at once, by one
mixed-integer program over (job, type, count), as Sia (SOSP 2023) does.

The greedy resize phase (``elastic``) grows the jobs the policy placed at their smallest gang;
this phase instead decides for all elastic jobs together which run, on what, and how many
devices, on the devices the rigid jobs left. Each candidate (type, count) of a job scores its
throughput there, relative to the job's slowest smallest gang (its ``speedup``), and a change
from the configuration it runs scores that speedup times a reallocation factor (the share of
its age it did not spend restarting, as Pollux and Sia count it). The program minimises
``sum(x * speedup ** p) + lambda_n * (jobs left out)`` with each job at most one configuration
and each type's devices at most its free ones: with ``p < 0`` every job's term falls from
``lambda_n`` to at most 1 once it runs, so everyone runs before anyone grows, and growth goes
where it shortens a job relatively most.

``objective="sia"`` is Sia's own (``sia.py``: ``__solve_mip_rescaled``; p = -0.5, lambda_n =
1.1): it decides who runs, on what it believes of each job's speed (``Believed``: Pollux's
fit of the configurations the job ran on, ``sim.sia_beliefs``), a job may at most double its
largest gang so far (Sia's ``max_replicas``: twice the most it was profiled on), and every
allocation is realised, single-node gangs moved to make room (``alloc_to_placement_smart``). It
is here to check Shipyard's simulator against Sia's. ``objective="remaining"`` is Shipyard's default: the
policy decides who runs (priorities and quotas stand) and the program sizes them, with the
curve known before a job runs (planned, then measured), each job's terms weighed by its
priority and by how soon it can finish (``SHORTER_FIRST``: short jobs win devices first, as
shortest-remaining-time ranks them), and a change charged its restart seconds against the
time it has left there or the horizon, whichever is sooner (not its age): the program decides again
every round and new arrivals undo a change within minutes, so a change must pay for itself soon.
Its terms are not rounded as Sia's are: rounding to two decimals erases a charge of a few percent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from shipyard.errors import InvalidSpec
from shipyard.scheduling.elastic import HORIZON_S, Curves, Resize, explained
from shipyard.scheduling.framework import level_of
from shipyard.scheduling.model import Job, Lease, Node, Throughputs

Objective = Literal["sia", "remaining"]
Sizing = Literal["greedy", "sia", "remaining"]
DEFAULT_SIZING: Sizing = "remaining"
LIVE_SIZINGS: tuple[Sizing, ...] = ("remaining", "greedy")
"""What a live agent may run (Sia's program learns curves by running and is the simulator's)."""
"""How the cycle sizes elastic jobs: ``greedy`` (``elastic.resize``) or one of the objectives."""
P_FAIRNESS = -0.5
"""Sia's ``--policy_p_val``: each job's term is its speedup to this power."""
LAMBDA_NO_ALLOC = 1.1
"""Sia's ``--mip_lambda_n``: what a job left out adds to the objective (above any job's 1)."""
SHORTER_FIRST = 0.25
"""Shipyard's objective weighs a job's terms by (an hour / the soonest it can finish) to this
power: 0 is Sia's, larger favours short jobs more. With changes charged over the ten-minute
horizon, 0.25 and 0.5 give the same mean average JCT over Sia's twelve workloads (0.849 and 0.851
of Sia's), but at 0.5 newTrace workload 1's long jobs lose what its short ones gain (its six
ImageNet jobs take 24.8 h, against 19.9 h at 0.25 and Sia's 19.5 h; the workload's average JCT
0.92 of Sia's, against 0.86; docs/benchmarks/elastic.md)."""


RateOf = Callable[[Job, str, int], float]
"""Steps per second of a job on ``count`` devices of a type (``elastic.Curves.rate``)."""
Believed = Callable[[Job], Mapping[tuple[str, int], float] | None]
"""Steps/s of a job by (type, count) as Sia's program believes them (its fit of what the job ran
on); None: it believes nothing yet and sees the throughputs."""


def live_sizing(name: str) -> Sizing:
    """``SHIPYARD_SIZING``'s value, checked."""
    for sizing in LIVE_SIZINGS:
        if name == sizing:
            return sizing
    choices = ", ".join(LIVE_SIZINGS)
    raise InvalidSpec(f"unknown sizing {name!r}", hint=f"SHIPYARD_SIZING is one of {choices}")


@dataclass(frozen=True, slots=True)
class Config:
    accelerator_type: str
    count: int


def resize_jointly(
    jobs: Sequence[Job],
    nodes: Sequence[Node],
    leases: Mapping[str, Lease],
    throughputs: Throughputs,
    *,
    now_s: float,
    objective: Objective = "remaining",
    horizon_s: float = HORIZON_S,
    believed: Believed | None = None,
) -> tuple[dict[str, Lease], dict[str, Resize]]:
    """The round's leases with the elastic jobs sized together on what the rigid ones left, and
    the resizes; an elastic job left out waits (or is preempted, if it ran). A change must pay for
    itself within ``horizon_s`` (Shipyard's objective); Sia's decides on what it ``believed``."""
    by_id = {j.id: j for j in jobs}
    out = {job_id: lease for job_id, lease in leases.items() if not by_id[job_id].elastic}
    taken: dict[str, int] = {}
    for lease in out.values():
        for node_id in lease.nodes:
            taken[node_id] = taken.get(node_id, 0) + 1
    curves = Curves(throughputs)
    elastic = [j for j in jobs if j.elastic]
    # Shipyard's objective sizes the jobs the policy chose to run (its order, priorities and
    # quotas stand) and any others the devices left over take; Sia's chooses who runs itself.
    if objective == "sia":  # only a job still restarting must keep its lease, as in Sia
        placed = {j.id: _held(j) for j in elastic if j.restarting and j.running_on is not None}
    else:
        placed = {j.id: leases[j.id] for j in elastic if j.id in leases}
    out |= size_jointly(
        elastic,
        nodes,
        taken,
        curves.rate,
        now_s=now_s,
        objective=objective,
        placed=placed,
        horizon_s=horizon_s,
        believed=believed,
    )
    return out, explained([j for j in elastic if j.id in out], out, out, jobs)


def size_jointly(
    jobs: Sequence[Job],
    nodes: Sequence[Node],
    taken: Mapping[str, int],
    rate: RateOf,
    *,
    now_s: float,
    objective: Objective = "remaining",
    placed: Mapping[str, Lease] | None = None,
    horizon_s: float = HORIZON_S,
    believed: Believed | None = None,
) -> dict[str, Lease]:
    """Leases for the elastic ``jobs`` on what ``taken`` (devices per node, the rigid leases')
    leaves free; a job missing from the result waits this round. Jobs in ``placed`` (the
    policy's leases) run at some size, on their lease there if the program's choice does not fit."""
    placed = placed or {}
    node_free = {n.id: (n.devices if n.schedulable else 0) - taken.get(n.id, 0) for n in nodes}
    free_by_type: dict[str, int] = {}
    per_node: dict[str, int] = {}
    for node in nodes:
        kind = node.accelerator_type
        free_by_type[kind] = free_by_type.get(kind, 0) + max(0, node_free[node.id])
        per_node[kind] = max(per_node.get(kind, 0), node.devices)
    options: list[tuple[int, Config, float]] = []  # (job index, config, cost in the objective)
    for index, job in enumerate(jobs):
        configs = _configs(job, free_by_type, per_node, objective)
        known = believed(job) if objective == "sia" and believed is not None else None
        for config, cost in _costs(job, configs, rate, now_s, objective, horizon_s, known).items():
            options.append((index, config, cost))
    if not options:
        return {}
    must_run = [job.id in placed for job in jobs]
    chosen = _solve(options, must_run, free_by_type)
    by_node = {n.id: n for n in nodes}
    leases: dict[str, Lease] = {}
    # Jobs that keep their type place first, on the nodes they hold, so nobody takes those.
    order = sorted(chosen.items(), key=lambda item: jobs[item[0]].running_on != item[1].accelerator_type)
    unplaced = _place_all([(jobs[i], c) for i, c in order], node_free, by_node, leases)
    if objective == "sia":  # Sia realises every allocation, moving single-node gangs to make room
        for kind in dict.fromkeys(c.accelerator_type for _, c in unplaced):
            waiting = [(j, c) for j, c in unplaced if c.accelerator_type == kind]
            _repack(kind, waiting, {j.id: j for j in jobs}, node_free, by_node, leases)
    for job_id, lease in placed.items():  # the program's choice did not fit on the nodes
        fits = all(node_free.get(n, 0) >= lease.nodes.count(n) for n in set(lease.nodes))
        if job_id not in leases and fits:
            for node_id in lease.nodes:
                node_free[node_id] -= 1
            leases[job_id] = lease
    return leases


def _configs(
    job: Job, free_by_type: Mapping[str, int], per_node: Mapping[str, int], objective: Objective
) -> list[Config]:
    sizes = job.sizes
    if objective == "sia":  # it learns its curve by running: at most twice its largest gang so far
        sizes = tuple(s for s in sizes if s <= max(1, 2 * job.largest_run)) or sizes[:1]
        if job.restarting and job.running_on is not None:
            return [Config(job.running_on, len(job.nodes))]
    return [
        Config(kind, size)
        for kind, free in free_by_type.items()
        if job.allows(kind)
        for size in sizes
        if size <= free and (size <= per_node[kind] or size % per_node[kind] == 0)
    ]


def _costs(
    job: Job,
    configs: Sequence[Config],
    rate: RateOf,
    now_s: float,
    objective: Objective,
    horizon_s: float,
    known: Mapping[tuple[str, int], float] | None = None,
) -> dict[Config, float]:
    """Each configuration's term in the objective against not running (lower is better); ``known``:
    the rates Sia's program believes, where it believes any."""
    rates = {c: rate(job, c.accelerator_type, c.count) for c in configs}
    rates = {c: r for c, r in rates.items() if r > 0}
    if known is not None:  # what it learned, not the true curve
        rates = {c: known.get((c.accelerator_type, c.count), 0.0) for c in rates}
        rates = {c: r for c, r in rates.items() if r > 0}
    if not rates:
        return {}
    current = Config(job.running_on, len(job.nodes)) if job.running_on is not None else None
    smallest = min(job.sizes)
    base = min((r for c, r in rates.items() if c.count == smallest), default=min(rates.values()))
    never_ran = job.running_on is None and job.steps_done <= 0
    if objective == "remaining":
        # Sia's terms, with the curve the planner gives before the job ran, and a change charged
        # its restart seconds against the time it has left there or the horizon (not its age).
        # Shorter jobs' terms weigh more, as shortest-remaining-time ranks them.
        soonest_s = job.remaining_steps / max(rates.values())
        weight = job.priority * (3600.0 / max(soonest_s, 60.0)) ** SHORTER_FIRST
        terms = {}
        for config, r in rates.items():
            speedup = r / base
            if current is not None and config != current and job.resize_s:
                span_s = min(job.remaining_steps / r, horizon_s)
                speedup *= span_s / (span_s + job.resize_s)
            terms[config] = weight * (max(speedup, 1e-4) ** P_FAIRNESS - LAMBDA_NO_ALLOC)
        return terms
    age = max(0.0, now_s - job.arrival_s)
    penalty = job.resize_s or 30.0
    realloc = 1.0 if age < penalty else max(0.0, age - job.restarts * penalty) / (age + penalty)
    terms = {}
    for config, r in rates.items():
        speedup = 1.0 if never_ran else r / base
        if current is not None and config != current:
            speedup *= realloc
        terms[config] = round(max(speedup, 1e-4) ** P_FAIRNESS, 2) - LAMBDA_NO_ALLOC
    return terms


def _held(job: Job) -> Lease:
    return Lease(job_id=job.id, accelerator_type=job.running_on or "", nodes=job.nodes, level="node")


def _solve(
    options: Sequence[tuple[int, Config, float]], must_run: Sequence[bool], free_by_type: Mapping[str, int]
) -> dict[int, Config]:
    """The program: at most one configuration per job (exactly one for those that must run,
    where that is feasible), each type's devices at most its free ones."""
    kinds = sorted(free_by_type)
    n = len(options)
    per_job = np.zeros((len(must_run), n))
    per_type = np.zeros((len(kinds), n))
    for column, (index, config, _) in enumerate(options):
        per_job[index, column] = 1
        per_type[kinds.index(config.accelerator_type), column] = config.count
    costs = np.array([cost for _, _, cost in options])
    devices = LinearConstraint(per_type, 0, np.array([free_by_type[k] for k in kinds]))
    for lower in (np.array(must_run, dtype=float), np.zeros(len(must_run))):
        result = milp(
            costs,
            integrality=np.ones(n),
            bounds=Bounds(0, 1),
            constraints=[LinearConstraint(per_job, lower, 1), devices],
            options={"mip_rel_gap": 1e-4},
        )
        if result.x is not None:
            break
    else:
        return {}
    return {options[c][0]: options[c][1] for c in range(n) if result.x[c] > 0.5}


def _place_all(
    chosen: Sequence[tuple[Job, Config]],
    node_free: dict[str, int],
    by_node: Mapping[str, Node],
    leases: dict[str, Lease],
) -> list[tuple[Job, Config]]:
    """Leases for the chosen configurations in their order, into ``leases``; those that did not fit."""
    unplaced = []
    for job, config in chosen:
        if (nodes_taken := _place(job, config, node_free, by_node)) is None:
            unplaced.append((job, config))
            continue
        leases[job.id] = Lease(
            job_id=job.id,
            accelerator_type=config.accelerator_type,
            nodes=nodes_taken,
            level=level_of(nodes_taken, by_node),
        )
    return unplaced


def _repack(
    kind: str,
    unplaced: Sequence[tuple[Job, Config]],
    by_id: Mapping[str, Job],
    node_free: dict[str, int],
    by_node: Mapping[str, Node],
    leases: dict[str, Lease],
) -> None:
    """Sia's placement (``alloc_to_placement_smart``): where a chosen configuration found no room
    on ``kind`` though the type has the devices, the single-node gangs placed on it this round
    give theirs back and everything is placed again, largest first (each job on its own nodes
    where they still fit), so fragments become room. A job that still does not fit waits."""
    size = max(n.devices for n in by_node.values() if n.accelerator_type == kind)
    movable = [
        (by_id[job_id], Config(kind, len(lease.nodes)))
        for job_id, lease in leases.items()
        if job_id in by_id and lease.accelerator_type == kind and len(lease.nodes) < size
    ]
    for job, _ in movable:
        for node_id in leases.pop(job.id).nodes:
            node_free[node_id] += 1
    again = sorted([*unplaced, *movable], key=lambda item: -item[1].count)
    _place_all(again, node_free, by_node, leases)


def _place(
    job: Job, config: Config, node_free: dict[str, int], by_node: Mapping[str, Node]
) -> tuple[str, ...] | None:
    """Nodes for the configuration, taken from ``node_free``: the nodes it holds first where it
    keeps its type; a gang of at most a node's devices on one node (the fullest that fits, so
    whole nodes stay free for big gangs), a bigger one on whole nodes. None: it does not fit."""
    kind = config.accelerator_type
    of_type = [n for n, node in by_node.items() if node.accelerator_type == kind and node_free.get(n, 0) > 0]
    held = [n for n in dict.fromkeys(job.nodes) if n in of_type] if job.running_on == kind else []
    size = by_node[of_type[0]].devices if of_type else 0
    if config.count <= size:
        fits = [n for n in of_type if node_free[n] >= config.count]
        if not fits:
            return None
        node_id = next((n for n in held if n in fits), None) or min(fits, key=lambda n: (node_free[n], n))
        node_free[node_id] -= config.count
        return (node_id,) * config.count
    whole = [n for n in held if node_free[n] == by_node[n].devices]
    whole += sorted(n for n in of_type if node_free[n] == by_node[n].devices and n not in whole)
    need = config.count // size
    if len(whole) < need:
        return None
    taken: list[str] = []
    for node_id in whole[:need]:
        taken += [node_id] * node_free[node_id]
        node_free[node_id] = 0
    return tuple(sorted(taken))
