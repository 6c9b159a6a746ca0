"""What a whole run spends beside its training steps: interruptions, checkpoint writes, evaluation.

A benchmark measures the steps alone (``steady``); a run's GPU-hours also pay for

- interruptions: failed devices and jobs, each costing a restart, a reload and the work done
  since the last checkpoint again (half an interval on average); they arrive per device-hour
  (Llama 3's log), so they grow with scale;
- checkpoint writes: the training state leaves the devices for storage while the steps wait, at
  the interval Young (1974) showed loses least between writing and redoing, sqrt(2 x write time
  x mean time between interruptions), unless the run gives its own;
- evaluation: forward passes over held-out batches every so many steps (Megatron-LM's defaults:
  100 batches every 1,000 steps).

Each is a share of the steps' own time; goodput, the share of wall time spent on training steps,
is 1 / (1 + their sum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shipyard.planner.calibration import Calibration
from shipyard.planner.memory import OPTIMIZER_BYTES, WEIGHT_BYTES, trainable_parameters
from shipyard.planner.workload import TrainingWorkload


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOverheads:
    """Time a run spends beside its steps, each as a share of the steps' time."""

    interruptions: float
    checkpoints: float
    evaluation: float
    checkpoint_write_s: float
    """One checkpoint's pause."""
    checkpoint_every_h: float

    @property
    def goodput(self) -> float:
        return 1 / (1 + self.interruptions + self.checkpoints + self.evaluation)

    def to_dict(self) -> dict[str, float]:
        return {
            "interruptions": self.interruptions,
            "checkpoints": self.checkpoints,
            "evaluation": self.evaluation,
            "checkpoint_write_s": self.checkpoint_write_s,
            "checkpoint_every_h": self.checkpoint_every_h,
        }

    def describe(self) -> str:
        return (
            f"interruptions {self.interruptions:.1%}, checkpoints {self.checkpoints:.1%} "
            f"({_duration(self.checkpoint_write_s)} every {_duration(self.checkpoint_every_h * 3600)}), "
            f"evaluation {self.evaluation:.1%}"
        )


NO_OVERHEADS = RunOverheads(
    interruptions=0.0, checkpoints=0.0, evaluation=0.0, checkpoint_write_s=0.0, checkpoint_every_h=math.inf
)
"""A steady-state plan: the steps alone."""


def checkpoint_bytes(workload: TrainingWorkload) -> float:
    """What a resumable checkpoint holds: the trained weights and their optimizer state (a
    frozen base model is not written again)."""
    mixed = workload.precision != "fp32"
    per_parameter = WEIGHT_BYTES[workload.precision] + OPTIMIZER_BYTES[workload.optimizer][mixed]
    return trainable_parameters(workload) * per_parameter


def interruption_share(count: int, checkpoint_every_h: float, calibration: Calibration) -> float:
    """Hours lost to interruptions per hour of steps: they arrive per device-hour, and each costs a
    restart and, on average, half a checkpoint interval of work done again."""
    lost_h = calibration.restart_hours_per_interruption + checkpoint_every_h / 2
    return calibration.interruptions_per_device_hour * count * lost_h


def run_overheads(
    workload: TrainingWorkload,
    count: int,
    forward_share: float,
    calibration: Calibration,
) -> RunOverheads:
    """The overheads of a whole run on ``count`` devices; ``forward_share``: an evaluation
    batch's time as a share of a training step's (its forward pass alone)."""
    # Every device writes its shard at once (distributed checkpoints), all sharing the storage.
    write_s = checkpoint_bytes(workload) / (count * calibration.checkpoint_write_gb_per_s_per_device * 1e9)
    every_h = workload.checkpoint_every_h
    if every_h is None:
        between_interruptions_h = 1 / (calibration.interruptions_per_device_hour * count)
        every_h = math.sqrt(2 * write_s / 3600 * between_interruptions_h)
    evaluation = 0.0
    if workload.eval_every_steps:
        evaluation = workload.eval_steps / workload.eval_every_steps * forward_share
    return RunOverheads(
        interruptions=interruption_share(count, every_h, calibration),
        checkpoints=write_s / 3600 / every_h if every_h > 0 else 0.0,
        evaluation=evaluation,
        checkpoint_write_s=write_s,
        checkpoint_every_h=every_h,
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"
