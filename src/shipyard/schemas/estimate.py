"""The planner's estimate of a job: what it is stored as at submit, what the API, the SDK, the
CLI and the dashboard read.

One ``Estimate`` per job: the figures on the accelerator type the planner picked, the same
``Figures`` for every type the job may land on (each with the layout a launch there fills in for
what the spec leaves open), and, where an earlier job of the same shape ran, its measurements in
place of planned figures (the planned ones kept beside them). Documents stored before a field
existed still read: every figure added later is optional.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Document(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class PlannedParallelism(_Document):
    tp: int = 1
    dp_shard: int = 1
    dp_replicate: int = 1


class PlannedCheckpointing(_Document):
    mode: str = "none"
    selective: str | None = None
    every: int | None = None


class PlannedLayout(_Document):
    """The layout as the job spec's fields (``training.parallelism``,
    ``training.activation_checkpointing``)."""

    parallelism: PlannedParallelism = PlannedParallelism()
    activation_checkpointing: PlannedCheckpointing = PlannedCheckpointing()

    def describe(self) -> str:
        """``tp=2 x dp_shard=4 x dp_replicate=1, activation checkpointing full``."""
        p, ac = self.parallelism, self.activation_checkpointing
        checkpointing = ac.mode + (f" (one block in {ac.every})" if ac.selective == "blocks" else "")
        return (
            f"tp={p.tp} x dp_shard={p.dp_shard} x dp_replicate={p.dp_replicate}, "
            f"activation checkpointing {checkpointing}"
        )


class Figures(_Document):
    """What the plan predicts on one accelerator type (or what a job of this shape measured there)."""

    memory_gib_per_device: float
    step_time_s: float
    tokens_per_s: float
    layout: PlannedLayout | None = None
    peak_tflops: float | None = None
    """What tokens/s is made of, so a measurement far from it can say which part was off."""
    mfu: float | None = None
    flops_per_token: float | None = None
    device_efficiency: float = 1.0
    """This cluster's factor on the type's efficiency the figures were planned with."""
    host_op_us: float | None = None
    """The host the plan took (its node's, as measured)."""
    host_bound: bool = False
    """Whether the step was the host's time (dispatching kernels) rather than the device's."""
    wall_time_s: float | None = None
    memory_gib_planned: float | None = None
    """Where a job of this shape measured its memory: the planner's figure it replaced."""
    memory_measured_by: str | None = None
    tokens_per_s_planned: float | None = None
    """Where a job of this shape measured its throughput: the planner's figure it replaced."""
    throughput_measured_by: str | None = None
    evidence: str | None = None
    """What the planned throughput on this type rests on: the published runs the planner was
    scored on there and its error on them, or that it is extrapolated from the peak."""
    tokens_per_s_range: dict[str, float] | None = None
    """The 80 % range of the planned tokens/s (``low``, ``high``), from the evidence's errors."""
    wall_time_s_range: dict[str, float] | None = None


class Estimate(Figures):
    """The job's estimate: ``Figures`` on the type the planner picked, and on every other."""

    accelerator: str
    """The fastest type that fits, among those the job may use."""
    devices: int
    memory: dict[str, float] = {}
    """Where the memory per device goes (weights, gradients, optimizer, activations...), GiB."""
    by_accelerator: dict[str, Figures] = {}
    shape: str | None = None
    """The job's shape key: jobs of one shape share their measurements."""
    measured_tokens_per_s: dict[str, float] = {}
    """What jobs of this shape measured on each type, for the scheduler's throughputs."""

    def on(self, accelerator_type: str | None) -> tuple[str, Figures]:
        """The type the estimate is read for (the one the job ran on, where it was planned, else
        the planner's pick) and the figures there."""
        if accelerator_type is not None and accelerator_type in self.by_accelerator:
            return accelerator_type, self.by_accelerator[accelerator_type]
        return self.accelerator, self.by_accelerator.get(self.accelerator, self)

    @classmethod
    def stored(cls, document: object) -> Estimate | None:
        """The estimate a job stored (None for a job submitted without one)."""
        return cls.model_validate(document) if document else None
