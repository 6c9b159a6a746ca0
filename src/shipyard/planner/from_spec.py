"""A job spec as the planner sees it: the workload (model, method, batch, precision, evaluation)
and the layouts the runtime can run. Pure: the model's architecture, and whether Shipyard's own
LLaMA trains it, are read by the caller (from a preset, or a folder's config.json)."""

from __future__ import annotations

from shipyard.planner.shapes import shape_of
from shipyard.planner.workload import LayoutRequest, Recompute, TrainingWorkload
from shipyard.schemas.jobspec import JobSpec
from shipyard.schemas.presets import ModelArch


def job_workload(spec: JobSpec, arch: ModelArch, *, on_llama: bool) -> TrainingWorkload:
    """What the planner plans for a job: its model (``arch``, read by the caller), method, batch,
    precision and evaluation, as the runtime will run them. ``on_llama``: whether Shipyard's own
    LLaMA trains it (see ``runtime_request``)."""
    t = spec.training
    shape = shape_of(arch)
    weights = spec.weights
    # A preference pair is two sequences (chosen and rejected), each run through the policy and
    # (but for SimPO) the reference: the planner sees twice the rows.
    rows = 2 if spec.method == "dpo" else 1
    against_reference = spec.method == "dpo" and _loss(spec) != "simpo"
    full_dpo = against_reference and weights == "full"
    return TrainingWorkload(
        model=shape,
        kind="pretrain" if weights is None else "finetune" if weights == "full" else weights,
        lora_rank=spec.finetune.lora.rank if spec.finetune else 16,
        lora_dropout=bool(spec.finetune and spec.finetune.lora.dropout > 0),
        reference_weights=full_dpo,
        reference_forward=against_reference,
        seq_len=t.seq_len,
        global_batch_tokens=t.global_batch_tokens * rows,
        tokens=float(t.total_steps * t.global_batch_tokens * rows),
        # Autocast keeps fp32 master weights: 16 bytes per parameter, as mixed-precision Adam.
        precision="fp32" if t.precision == "fp32" else "bf16",
        optimizer="adamw-bf16" if t.optimizer.state_dtype == "bf16" else "adamw",
        flash_attention=True,  # the runtime uses scaled_dot_product_attention
        # Shipyard's LLaMA is counted tensor by tensor; a transformers model, as Megatron's blocks
        # (with what PEFT's adapters add), which its measured peaks match.
        activations="shipyard" if on_llama else "megatron",
        # The job's own evaluation cadence: eval_batches micro-batches every eval_interval steps.
        eval_every_steps=t.eval_interval,
        eval_steps=t.eval_batches * t.micro_batch_size * t.seq_len / t.global_batch_tokens,
    )


def _loss(spec: JobSpec) -> str | None:
    return spec.finetune.dpo.loss if spec.finetune is not None and spec.method == "dpo" else None


def runtime_request(spec: JobSpec, *, on_llama: bool) -> LayoutRequest:
    """The layouts the runtime runs, for the planner to choose among: what the spec gives is
    pinned; no pipeline; ZeRO-3 (FSDP2) or plain replicas (DDP); tensor parallelism only on
    Shipyard's own LLaMA (``on_llama``)."""
    p, t = spec.training.parallelism, spec.training
    zero = None if p.dp_shard is None else 0 if p.dp_shard == 1 else 3
    recompute, every = _recompute(spec)
    return LayoutRequest(
        tp=p.tp if p.tp is not None or on_llama else 1,
        pp=1,
        zero=zero,
        recompute=recompute,
        recompute_every=every if recompute == "full" else 1,
        micro_batch=t.micro_batch_size * (2 if spec.method == "dpo" else 1),
        interleave=1,
        zero_choices=(0, 3),
    )


def _recompute(spec: JobSpec) -> tuple[Recompute | None, int]:
    """The planner's recomputation for the job's activation checkpointing (None: its choice);
    ``selective`` of whole blocks is the planner's ``full`` for one block in ``every``."""
    section = spec.activation_checkpointing
    if section.mode == "auto":
        return None, 1
    if section.mode == "selective" and section.selective == "blocks":
        return "full", section.every
    return section.mode, 1
