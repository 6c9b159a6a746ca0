"""The planner's estimate of a submitted job on this node's accelerators.

A job that fits on no accelerator type it may use is refused at submit time with the numbers; one
that fits gets the estimate (memory per device, step time, tokens/s, wall time) stored beside the
measured figures.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shipyard.errors import InvalidSpec, ShipyardError, Unschedulable
from shipyard.hardware import Device
from shipyard.hardware.catalog import AcceleratorSpec, Catalog
from shipyard.planner.shapes import ModelShape
from shipyard.planner.training import TrainingPlan, plan_training
from shipyard.planner.workload import LayoutRequest, TrainingWorkload, cluster_of
from shipyard.schemas.documents import describe_error, read_document_file
from shipyard.schemas.jobspec import JobSpec
from shipyard.schemas.presets import PRESETS, ModelArch


def job_arch(spec: JobSpec) -> ModelArch:
    """The architecture a job trains: its preset, or the config of the model it fine-tunes."""
    if not spec.model.path:
        return PRESETS[spec.model.preset or ""].with_vocab(spec.data.tokenizer.vocab_size)
    config_path = Path(spec.model.path) / "config.json"
    hint = "give a folder written by save_pretrained or a Shipyard export"
    try:
        text = read_document_file(config_path, what="model config")
        shape = HFShape.model_validate_json(text)
    except ValidationError as exc:
        problems = "; ".join(describe_error(error, HFShape) for error in exc.errors())
        raise InvalidSpec(f"model.path {spec.model.path}: config.json {problems}", hint=hint) from None
    except ShipyardError as exc:
        raise InvalidSpec(f"model.path {spec.model.path}: {exc.message}", hint=hint) from None
    return ModelArch(
        dim=shape.hidden_size,
        n_layers=shape.num_hidden_layers,
        n_heads=shape.num_attention_heads,
        n_kv_heads=shape.num_key_value_heads or shape.num_attention_heads,
        ffn_dim=shape.intermediate_size,
        vocab_size=shape.vocab_size,
        tie_embeddings=shape.tie_word_embeddings,
    )


Size = Annotated[int, Field(strict=True, gt=0, le=1 << 24)]


class HFShape(BaseModel):
    """What the planner reads of a Hugging Face ``config.json``: typed and bounded, since the
    file is the caller's (the rest of it is the model's own business)."""

    model_config = ConfigDict(extra="ignore")

    hidden_size: Size
    num_hidden_layers: Size
    num_attention_heads: Size
    num_key_value_heads: Size | None = None
    intermediate_size: Size
    vocab_size: Size
    tie_word_embeddings: bool = False


def job_workload(spec: JobSpec) -> TrainingWorkload:
    arch = job_arch(spec)
    t = spec.training
    shape = ModelShape(
        params=float(arch.num_params()),
        layers=arch.n_layers,
        hidden=arch.dim,
        heads=arch.n_heads,
        kv_heads=arch.n_kv_heads,
        vocab=arch.vocab_size,
        ffn_hidden=arch.ffn_dim,
    )
    return TrainingWorkload(
        model=shape,
        kind="finetune" if spec.model.path else "pretrain",
        seq_len=t.seq_len,
        global_batch_tokens=t.global_batch_tokens,
        tokens=float(t.total_steps * t.global_batch_tokens),
        # Autocast keeps fp32 master weights: 16 bytes per parameter, as mixed-precision Adam.
        precision="fp32" if t.precision == "fp32" else "bf16",
        flash_attention=True,  # the runtime uses scaled_dot_product_attention
    )


def _plan_on(
    workload: TrainingWorkload, spec: JobSpec, accelerator: AcceleratorSpec, devices: int
) -> TrainingPlan:
    cluster = cluster_of(accelerator, devices, devices_per_node=devices)
    layout = LayoutRequest(
        tp=1,
        pp=1,
        zero=3 if spec.training.parallelism == "fsdp" else 0,
        recompute="none",
        micro_batch=spec.training.micro_batch_size,
    )
    return plan_training(workload, cluster, layout)


_MEMO_SIZE = 512
_memo: dict[Hashable, dict[str, Any]] = {}


def estimate_job(spec: JobSpec, node_devices: Sequence[Device], catalog: Catalog) -> dict[str, Any]:
    """The fastest fitting accelerator type among those the job may use on this node.

    Raises ``Unschedulable`` with the memory needed and the largest memory here when none fits.
    Remembered per shape of job (a queue fills with copies of one spec, each asking again); the
    dict returned is shared, not to be changed.
    """
    if spec.model.path:  # the config.json behind a path can change: read it each time
        return _estimate(spec, node_devices, catalog)
    accelerators = tuple(spec.resources.accelerator)
    key = (
        spec.model,
        spec.data.tokenizer,
        spec.training,
        spec.resources.devices,
        accelerators,
        tuple(node_devices),
        tuple(catalog.get(a) for a in accelerators),
    )
    found = _memo.get(key)
    if found is None:
        found = _estimate(spec, node_devices, catalog)
        if len(_memo) >= _MEMO_SIZE:
            _memo.clear()
        _memo[key] = found
    return found


def _estimate(spec: JobSpec, node_devices: Sequence[Device], catalog: Catalog) -> dict[str, Any]:
    workload = job_workload(spec)
    devices = spec.resources.devices
    plans: list[TrainingPlan] = []
    for accelerator_type in spec.resources.accelerator:
        found = [d for d in node_devices if d.accelerator_type == accelerator_type]
        if not found or accelerator_type not in catalog:
            continue
        # The memory this node reports; the CPU's is shared by the job's processes.
        memory_gib = min(d.memory_gib for d in found)
        if accelerator_type == "cpu":
            memory_gib /= devices
        accelerator = catalog[accelerator_type].model_copy(
            update={"memory_gib": memory_gib, "usable_memory_fraction": 1.0}
        )
        plans.append(_plan_on(workload, spec, accelerator, devices))
    if not plans:
        return {}
    fitting = [p for p in plans if p.fits]
    if not fitting:
        largest = max(plans, key=lambda p: p.memory.usable_gib)
        need = min(plans, key=lambda p: p.memory.total_gib)
        shared = (
            f", shared by {devices} processes"
            if largest.cluster.accelerator.key == "cpu" and devices > 1
            else ""
        )
        raise Unschedulable(
            f"job {spec.name!r} needs {need.memory.total_gib:.1f} GiB per device with tp=1 "
            f"({_breakdown(need)}); the largest accelerator here has {largest.memory.usable_gib:.1f} GiB "
            f"({largest.cluster.accelerator.key}{shared})",
            hint="lower training.micro_batch_size or training.seq_len, shard the weights with "
            "training.parallelism: fsdp over more resources.devices, or pick a smaller model; "
            "`shipyard plan train` shows what fits where",
        )
    best = min(fitting, key=lambda p: p.step.total_s)
    return {
        "accelerator": best.cluster.accelerator.key,
        "devices": devices,
        "memory_gib_per_device": round(best.memory.total_gib, 3),
        "memory": best.memory.to_dict(),
        "step_time_s": best.step.total_s,
        "tokens_per_s": best.tokens_per_s,
        "mfu": best.mfu,
        "wall_time_s": best.wall_time_h * 3600,
    }


def _breakdown(plan: TrainingPlan) -> str:
    m = plan.memory
    return (
        f"weights {m.weights_gib:.1f}, gradients {m.gradients_gib:.1f}, optimizer {m.optimizer_gib:.1f}, "
        f"activations {m.activations_gib:.1f}"
    )
