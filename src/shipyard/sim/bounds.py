"""Lower bounds that no policy can beat, to tell a policy's loss from the workload's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from shipyard.errors import InvalidSpec
from shipyard.scheduling.model import Job, Throughputs
from shipyard.sim.workload import TraceJob


def fluid_makespan_s(
    jobs: Sequence[TraceJob], throughputs: Throughputs, capacity: Mapping[str, int]
) -> float:
    """The shortest time in which ``jobs`` (all present at once) could finish, in seconds.

    A linear program over h[j,k], the seconds job j's gang runs on type k: every job gets its
    steps done, no type holds more gangs than it has devices at any time on average, and no job
    runs longer than the makespan. It ignores rounds, whole gangs and placement, so every real
    schedule takes at least this long.
    """
    types = sorted(capacity)
    n_jobs, n_types = len(jobs), len(types)
    if n_jobs == 0:
        return 0.0
    makespan = n_jobs * n_types  # index of the last variable
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rhs: list[float] = []

    def add(row: int, col: int, value: float) -> None:
        rows.append(row)
        cols.append(col)
        vals.append(value)

    for j, trace in enumerate(jobs):
        job = Job(
            id=str(j),
            job_type=trace.job_type,
            devices=trace.devices,
            total_steps=trace.total_steps,
            arrival_s=0,
        )
        rates = [throughputs.of(job, k) if trace.devices <= capacity[k] else 0.0 for k in types]
        if max(rates) <= 0:
            raise InvalidSpec(
                f"job {j} ({trace.job_type} x{trace.devices}) can run on no type of the cluster"
            )
        for k, rate in enumerate(rates):
            add(j, j * n_types + k, -rate / trace.total_steps)  # done fraction >= 1
            add(n_jobs + n_types + j, j * n_types + k, 1.0)  # one type at a time
        rhs.append(-1.0)
    for k, name in enumerate(types):
        for j, trace in enumerate(jobs):
            add(n_jobs + k, j * n_types + k, float(trace.devices))
        add(n_jobs + k, makespan, -float(capacity[name]))
        rhs.append(0.0)
    for j in range(n_jobs):
        add(n_jobs + n_types + j, makespan, -1.0)
        rhs.append(0.0)
    objective = np.zeros(makespan + 1)
    objective[makespan] = 1.0
    matrix = coo_matrix((vals, (rows, cols)), shape=(len(rhs), makespan + 1)).tocsr()
    result = linprog(objective, A_ub=matrix, b_ub=rhs, bounds=(0, None), method="highs")
    if result.status != 0:
        raise InvalidSpec(f"the makespan bound could not be solved: {result.message}")
    return float(result.x[makespan])
