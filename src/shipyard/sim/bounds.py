"""Lower bounds that no policy can beat, to tell a policy's loss from the workload's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from shipyard.errors import InvalidSpec
from shipyard.scheduling.model import Job, Throughputs
from shipyard.scheduling.policies.makespan import fluid_makespan
from shipyard.sim.workload import TraceJob


def fluid_makespan_s(
    jobs: Sequence[TraceJob], throughputs: Throughputs, capacity: Mapping[str, int]
) -> float:
    """The shortest time in which ``jobs`` (all present at once) could finish, in seconds: the
    fluid makespan program (``scheduling.policies.fluid_makespan``), which ignores rounds, whole
    gangs and placement, so every real schedule takes at least this long."""
    types = sorted(capacity)
    rates = np.zeros((len(jobs), len(types)))
    for j, trace in enumerate(jobs):
        job = Job(
            id=str(j),
            job_type=trace.job_type,
            devices=trace.devices,
            total_steps=trace.total_steps,
            arrival_s=0,
        )
        rates[j] = [throughputs.of(job, k) if trace.devices <= capacity[k] else 0.0 for k in types]
        if rates[j].max() <= 0:
            raise InvalidSpec(
                f"job {j} ({trace.job_type} x{trace.devices}) can run on no type of the cluster"
            )
    solved = fluid_makespan(
        rates,
        np.array([trace.total_steps for trace in jobs], dtype=float),
        np.array([trace.devices for trace in jobs], dtype=float),
        np.array([capacity[k] for k in types], dtype=float),
    )
    if solved is None:
        raise InvalidSpec("the makespan bound could not be solved")
    return solved[0]
