"""Makespan policies: finish every current job as early as possible, exactly (a linear program
over the fluid makespan) or by Gavel's bisection."""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from shipyard.scheduling.model import Allocation, PolicyInput
from shipyard.scheduling.policies.programs import Problem


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
    problem = Problem.of(inp)
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
    problem = Problem.of(inp)
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
