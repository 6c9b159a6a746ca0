"""The job spec's ``training`` section: steps or tokens, the batch, the optimizer and its schedule,
the parallelism and the activation checkpointing."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from shipyard.schemas import layout
from shipyard.schemas.spec_base import (
    MAX_STEPS,
    MAX_TOKENS,
    Section,
    Steps,
)


class OptimizerSection(Section):
    """The optimizer and its settings."""

    name: Literal["adamw"] = "adamw"
    """AdamW (decoupled weight decay, Loshchilov and Hutter 2019), fused where the device has it."""
    lr: Annotated[float, Field(gt=0, le=10)] = 3e-4
    """The peak learning rate, reached after the warmup."""
    betas: Annotated[tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]],
                     Field(strict=False)] = (0.9, 0.95)  # fmt: skip
    """Adam's decay rates of the first and second moments: a YAML list of two numbers in [0, 1)."""
    weight_decay: Annotated[float, Field(ge=0, le=10)] = 0.1
    """Decoupled weight decay of the matrices (norms and embeddings are not decayed)."""
    eps: Annotated[float, Field(gt=0, le=1)] = 1e-8
    """Added to Adam's denominator, for numerical stability."""
    grad_clip: Annotated[float, Field(ge=0, le=1e6)] = 1.0
    """Max global gradient norm; 0 turns clipping off."""
    state_dtype: Literal["fp32", "bf16"] = "fp32"
    """Adam's moments: ``bf16`` halves their memory (4 bytes per parameter instead of 8); the
    weights' master copy stays fp32."""


class ScheduleSection(Section):
    """The learning rate over the run: a linear warmup, then a decay to ``min_lr_ratio``."""

    warmup_steps: Steps = 0
    """Steps of linear warmup from 0 to the peak LR."""
    decay: Literal["cosine", "linear", "constant"] = "cosine"
    """How the LR falls from the peak after the warmup."""
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    """The LR at the last step, as a fraction of the peak LR."""


PARALLELISM_SHORTHANDS: dict[str, dict[str, int]] = {
    "ddp": {"tp": 1, "dp_shard": 1, "dp_replicate": -1},
    "fsdp": {"tp": 1, "dp_shard": -1, "dp_replicate": 1},
    "auto": {},
}
"""What ``parallelism: ddp`` (or ``fsdp``, ``auto``) stands for."""

Degree = Annotated[int, Field(ge=1, le=100_000)]
Rest = Annotated[int, Field(ge=-1, le=100_000)]


class ParallelismSection(Section):
    """A job's devices as a mesh, in torchtitan's order: tensor parallel inside a node, FSDP2
    shards over groups of ``tp`` devices, replicas of those shards outermost. A degree left out is
    the planner's choice; ``-1`` takes the devices the others leave."""

    tp: Degree | None = None
    """Tensor-parallel degree: each layer's weights split over this many devices of one node
    (DTensor, with sequence parallelism for the norms). Divides the attention and key/value heads."""
    dp_shard: Rest | None = None
    """FSDP2 degree: weights, gradients and optimizer state sharded over this many groups."""
    dp_replicate: Rest | None = None
    """Replicas: plain DDP when nothing is sharded, else HSDP (each replica sharded dp_shard ways)."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in PARALLELISM_SHORTHANDS:
                raise ValueError(
                    f"unknown parallelism {value!r}; valid: {', '.join(PARALLELISM_SHORTHANDS)}, "
                    "or a mapping {tp, dp_shard, dp_replicate}"
                )
            return PARALLELISM_SHORTHANDS[value]
        return value

    @model_validator(mode="after")
    def _one_rest(self) -> Self:
        if [self.dp_shard, self.dp_replicate].count(-1) > 1:
            raise ValueError("only one of dp_shard and dp_replicate may be -1 (the devices left over)")
        return self

    @property
    def chosen(self) -> bool:
        """Whether every degree is given (nothing is left to the planner)."""
        return None not in (self.tp, self.dp_shard, self.dp_replicate)

    def resolved(self, world: int) -> ParallelismSection:
        """Every degree a number, their product ``world`` (``layout.resolve_degrees``)."""
        tp, shard, replicate = layout.resolve_degrees(self.tp, self.dp_shard, self.dp_replicate, world)
        return ParallelismSection(tp=tp, dp_shard=shard, dp_replicate=replicate)

    @property
    def sharded(self) -> bool:
        """Whether the weights are sharded (FSDP2 or tensor parallel): not a plain replica each."""
        return (self.tp or 1) > 1 or (self.dp_shard or 1) > 1

    def describe(self) -> str:
        return f"tp={self.tp}, dp_shard={self.dp_shard}, dp_replicate={self.dp_replicate}"


CheckpointingMode = Literal["auto", "none", "selective", "full"]


class ActivationCheckpointingSection(Section):
    """Which activations the backward pass recomputes instead of reading back from memory."""

    mode: CheckpointingMode = "auto"
    """``none`` keeps everything; ``selective`` recomputes the attention of each block (or every
    k-th block whole, see ``selective``); ``full`` recomputes every block from its input (the least
    memory, about a third more compute); ``auto``: the planner's choice for the job's devices."""
    selective: Literal["attention", "blocks"] = "attention"
    """What ``mode: selective`` recomputes: each block's attention, or every ``every``-th block whole."""
    every: Annotated[int, Field(ge=2, le=1024)] = 2
    """``selective: blocks``: recompute one block in this many."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return {"mode": value} if isinstance(value, str) else value


COMPILING_VENDORS = ("nvidia", "amd", "generic")
"""Where Inductor compiles (CUDA/ROCm through Triton, CPUs through C++); Apple's MPS backend is a
prototype and Gaudi needs Habana's own."""


class EarlyStoppingSection(Section):
    """Stop when the eval loss has stopped improving, and export the best model seen."""

    patience: Annotated[int, Field(gt=0, le=10_000)]
    """Evals in a row without improvement after which the job stops."""
    min_delta: Annotated[float, Field(ge=0, le=1e6)] = 0.0
    """How much lower than the best so far an eval loss must be to count as an improvement."""


class TrainingSection(Section):
    steps: Annotated[int, Field(gt=0, le=MAX_STEPS)] | None = None
    """Optimizer steps; give this or ``tokens``."""
    tokens: Annotated[int, Field(gt=0, le=MAX_TOKENS)] | None = None
    """Tokens to train on; steps = ceil(tokens / global_batch_tokens)."""
    global_batch_tokens: Annotated[int, Field(gt=0, le=1 << 30)] = 16384
    """Tokens per optimizer step over all devices; gradient accumulation is derived from it."""
    micro_batch_size: Annotated[int, Field(gt=0, le=1 << 16)] = 8
    """Sequences per device per forward/backward."""
    seq_len: Annotated[int, Field(gt=0, le=1 << 20)] = 256
    """Tokens per training sequence (the context the model learns to use)."""
    optimizer: OptimizerSection = OptimizerSection()
    schedule: ScheduleSection = ScheduleSection()
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    """``auto`` picks bf16 autocast where the device supports it, else fp32."""
    seed: Annotated[int, Field(ge=0, le=2**32 - 1)] = 0
    """Seeds the weights, the data order and dropout: the same seed trains the same model."""
    eval_interval: Steps = 0
    """Steps between eval-loss measurements; 0 evaluates at the start and the end only."""
    eval_batches: Annotated[int, Field(gt=0, le=1 << 20)] = 8
    """Micro-batches of held-out data per eval-loss measurement."""
    early_stopping: EarlyStoppingSection | None = None
    """``{patience: K}``: stop once K evals in a row did not improve on the best eval loss, and
    export the checkpoint of the best one (needs ``eval_interval``)."""
    log_interval: Annotated[int, Field(gt=0, le=MAX_STEPS)] = 1
    """Steps between metric records (loss, tokens/s, MFU, memory)."""
    compile: bool | Literal["auto"] = "auto"
    """``torch.compile`` each transformer block: ``auto`` does on NVIDIA and AMD GPUs, where it
    pays (a slower first step, faster ones after); ``true`` anywhere Inductor runs (GPUs, CPUs)."""
    parallelism: ParallelismSection = ParallelismSection()
    """How several devices share the work: ``ddp``, ``fsdp``, or ``{tp, dp_shard, dp_replicate}``;
    what is left out, the planner chooses."""
    activation_checkpointing: ActivationCheckpointingSection = ActivationCheckpointingSection()
    """Recompute activations in the backward pass instead of keeping them: ``none``,
    ``selective`` or ``full``; ``auto`` (the default) takes the planner's choice."""

    @model_validator(mode="after")
    def _length(self) -> Self:
        if (self.steps is None) == (self.tokens is None):
            raise ValueError("give exactly one of `steps` or `tokens`")
        if self.early_stopping is not None and not self.eval_interval:
            raise ValueError(
                "early_stopping watches the eval loss, which eval_interval 0 measures only at the "
                "start and the end; set eval_interval (steps between evals)"
            )
        tokens_per_micro = self.micro_batch_size * self.seq_len
        if self.global_batch_tokens % tokens_per_micro:
            raise ValueError(
                f"global_batch_tokens ({self.global_batch_tokens}) must be a multiple of "
                f"micro_batch_size × seq_len ({self.micro_batch_size} × {self.seq_len} = "
                f"{tokens_per_micro})"
            )
        return self

    @property
    def total_steps(self) -> int:
        return layout.total_steps(self.steps, self.tokens, self.global_batch_tokens)

    def grad_accum_steps(self, world_size: int) -> int:
        """Micro-steps per optimizer step on each device, as llm.c derives it."""
        return layout.grad_accum_steps(
            self.global_batch_tokens, self.micro_batch_size, self.seq_len, world_size
        )
