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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from shipyard.errors import InvalidSpec
from shipyard.scheduling.model import Allocation, PolicyInput
from shipyard.scheduling.policies.common import Allocate
from shipyard.scheduling.policies.cost import max_throughput_per_dollar
from shipyard.scheduling.policies.fairness import finish_time_fairness, gavel_las_perf
from shipyard.scheduling.policies.greedy import GavelFifo, fifo, fifo_perf, gavel_fifo_once, priority
from shipyard.scheduling.policies.makespan import gavel_min_makespan, min_makespan
from shipyard.scheduling.policies.remaining import shortest_remaining_fluid, shortest_remaining_perf


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
