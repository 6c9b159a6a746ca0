"""Cost policy: the most normalized throughput per dollar of device time."""

from __future__ import annotations

import numpy as np

from shipyard.scheduling.model import Allocation, PolicyInput
from shipyard.scheduling.policies.programs import Problem


def max_throughput_per_dollar(inp: PolicyInput) -> Allocation:
    """Maximize the sum of normalized throughputs per dollar of device time."""
    problem = Problem.of(inp)
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
