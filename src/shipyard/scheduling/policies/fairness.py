"""Fairness policies: Gavel's max-min fairness (LAS) and Themis-style finish-time fairness."""

from __future__ import annotations

import numpy as np

from shipyard.scheduling.model import Allocation, Job, PolicyInput
from shipyard.scheduling.policies.programs import Problem


def equal_share_throughput(job: Job, inp: PolicyInput, demand: float) -> float:
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
    problem = Problem.of(inp)
    demand = sum(j.devices for j in problem.jobs)
    scale = np.array(
        [j.devices / (max(equal_share_throughput(j, inp, demand), 1e-12) * j.priority) for j in problem.jobs]
    )
    return problem.max_min(inp, scale, solver="ecos")


def finish_time_fairness(inp: PolicyInput) -> Allocation:
    """Themis-style: jobs furthest behind their fair finish time get the most throughput.

    Normalizes each job's throughput by the throughput it needs to finish within its isolated
    (equal-share) time, counted from its arrival.
    """
    problem = Problem.of(inp)
    demand = sum(j.devices for j in problem.jobs)
    scale = []
    for job in problem.jobs:
        fair = equal_share_throughput(job, inp, demand)
        isolated_s = job.total_steps / max(fair, 1e-12)
        left_s = max(isolated_s - (inp.now_s - job.arrival_s), 0.05 * isolated_s)
        needed = job.remaining_steps / left_s
        scale.append(1.0 / max(needed, 1e-12))
    return problem.max_min(inp, np.array(scale))
