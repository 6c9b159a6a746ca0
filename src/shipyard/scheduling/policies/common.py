"""What every allocation policy shares: its signature and the types a job may run on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from shipyard.scheduling.model import Allocation, Job, PolicyInput

Allocate = Callable[[PolicyInput], Allocation]
Solver = Literal["highs", "ecos"]


def types_of(job: Job, inp: PolicyInput) -> list[str]:
    """The types with room for the job's gang on which it runs at all."""
    return [
        k
        for k in inp.capacity
        if job.allows(k) and inp.capacity[k] >= job.devices and inp.throughputs.of(job, k) > 0
    ]
