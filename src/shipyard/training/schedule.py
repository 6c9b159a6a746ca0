"""How a run proceeds over its steps: the learning-rate multiplier (the same at every layout and
every resume, since it depends on the step alone) and what early stopping watches."""

from __future__ import annotations

import math
from dataclasses import dataclass

from shipyard.schemas.training_spec import ScheduleSection


def lr_factor(step: int, total_steps: int, schedule: ScheduleSection) -> float:
    """Multiplier of the peak LR at ``step`` (0-based): linear warmup, then the decay."""
    if step < schedule.warmup_steps:
        return (step + 1) / schedule.warmup_steps
    if schedule.decay == "constant":
        return 1.0
    span = max(1, total_steps - schedule.warmup_steps - 1)
    progress = min(1.0, (step - schedule.warmup_steps) / span)
    floor = schedule.min_lr_ratio
    if schedule.decay == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class BestEval:
    """What early stopping watches: the lowest eval loss so far, the step and checkpoint that
    hold it, and the evals since. Kept in every checkpoint, so a resumed run stops where an
    uninterrupted one would."""

    loss: float = math.inf
    step: int = 0
    checkpoint: str | None = None
    """The folder name of its checkpoint, among the job's."""
    stale: int = 0
