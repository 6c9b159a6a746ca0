"""Greedy policies: first come first served, with or without regard to speed, and by priority."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from shipyard.scheduling.model import Allocation, Job, PolicyInput
from shipyard.scheduling.policies.common import types_of


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
        fitting = [k for k in types_of(job, inp) if free[k] >= job.devices]
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
