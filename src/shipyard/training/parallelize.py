"""Spread a model over the mesh, in torchtitan's order: tensor parallelism, activation
checkpointing, ``torch.compile`` of each block, then FSDP2 (or DDP when nothing is sharded).

Shipyard's LLaMA is built on the meta device, split, and only then given storage and weights
(``materialize``): no process ever holds more of the model than its shard and one full tensor.
Each weight comes from its own seeded generator or from the file it is read from, so every layout
starts from the same model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from shipyard.errors import InvalidSpec
from shipyard.schemas.layout import tp_degrees
from shipyard.schemas.training_spec import ActivationCheckpointingSection
from shipyard.training.model import Transformer
from shipyard.training.parallel import Dist

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")
"""What activation checkpointing, ``torch.compile`` and DDP insert into parameter names."""


def clean_name(name: str) -> str:
    """A parameter's name as the bare model has it (what checkpoints and exports use)."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


@dataclass(frozen=True, slots=True)
class Spread:
    """How the model ended up spread: what the loop must do differently."""

    fsdp: bool
    """FSDP2 manages the parameters (and casts them: no autocast)."""
    tp: bool
    """Tensor parallel: the loss is computed on vocabulary shards (``loss_parallel``)."""
    checkpointing: str = "none"
    compiled: bool = False

    def describe(self) -> str:
        parts = ["tensor parallel" if self.tp else "", "FSDP2" if self.fsdp else ""]
        parts += [
            f"activation checkpointing {self.checkpointing}",
            "compiled blocks" if self.compiled else "",
        ]
        return ", ".join(p for p in parts if p)


def blocks(model: nn.Module) -> nn.ModuleList:
    """The model's transformer blocks: its longest list of modules (``model.layers`` of Shipyard's
    LLaMA and of every ``transformers`` decoder, however deep a PEFT wrapper puts it)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return max(lists, key=len)


def parallelize(
    model: nn.Module,
    d: Dist,
    *,
    checkpointing: ActivationCheckpointingSection,
    compile_blocks: bool,
    bf16: bool,
) -> Spread:
    """Tensor parallelism, activation checkpointing, compile and FSDP2, in place."""
    tp = d.tp > 1
    if tp:
        if not isinstance(model, Transformer):
            raise InvalidSpec(
                "training.parallelism.tp > 1 needs Shipyard's LLaMA (a preset, or full fine-tuning "
                "of a plain LLaMA folder); this model trains through transformers",
                hint="set training.parallelism.tp: 1 and shard it with dp_shard (FSDP2) instead",
            )
        _tensor_parallel(model, d)
    _checkpoint_activations(model, checkpointing)
    if compile_blocks:
        for block in blocks(model):
            block.compile()
    fsdp = d.enabled and (d.layout.dp_shard or 1) * (d.layout.dp_replicate or 1) > 1 and d.layout.sharded
    if fsdp:
        _fully_shard(model, d, bf16)
    return Spread(
        fsdp=fsdp, tp=tp, checkpointing=describe_checkpointing(checkpointing), compiled=compile_blocks
    )


def describe_checkpointing(section: ActivationCheckpointingSection) -> str:
    if section.mode != "selective":
        return "none" if section.mode == "auto" else section.mode
    if section.selective == "blocks":
        return f"selective (one block in {section.every})"
    return "selective (attention)"


def replicate(model: nn.Module, d: Dist, spread: Spread) -> nn.Module:
    """DDP over every rank when the weights are not sharded: after ``materialize``, as DDP
    starts by broadcasting rank 0's weights."""
    if not d.enabled or spread.fsdp or spread.tp:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [d.device.index] if d.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def _tensor_parallel(model: Transformer, d: Dist) -> None:
    """Megatron's split with sequence parallelism (Korthikanti et al. 2022), as DTensor plans: the
    attention and MLP projections column- then row-wise, the norms on sequence shards, the head
    column-wise with its output left on vocabulary shards for ``loss_parallel``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    arch, tp = model.arch, d.tp
    if arch.n_heads % tp or arch.n_kv_heads % tp:
        raise InvalidSpec(
            f"training.parallelism.tp {tp} does not divide the model's {arch.n_heads} attention heads "
            f"and {arch.n_kv_heads} key/value heads",
            hint=f"valid: {', '.join(map(str, tp_degrees(arch.n_heads, arch.n_kv_heads)))}",
        )
    assert d.mesh is not None
    mesh = d.mesh["tp"]
    parallelize_module(
        model,
        mesh,
        {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(
                input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
            ),
        },
    )
    block_plan = {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(
            input_layouts=(Shard(1), None, None, None), desired_input_layouts=(Replicate(), None, None, None)
        ),
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }
    for block in model.model.layers:
        parallelize_module(block, mesh, block_plan)
    if arch.tie_embeddings:
        # The plans distributed the one weight twice, alike (rows of the vocabulary): tie them again.
        model.lm_head.weight = model.model.embed_tokens.weight
    model.fused_loss = False


def _checkpoint_activations(model: nn.Module, section: ActivationCheckpointingSection) -> None:
    """``full``: every block recomputed from its input; ``selective``: each block's attention, or
    every ``every``-th block whole (the first of each run of ``every``, as torchtitan counts)."""
    if section.mode in ("none", "auto"):
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = blocks(model)
    if section.mode == "selective" and section.selective == "attention":
        for block in layers:
            attention = getattr(block, "self_attn", None)
            if not isinstance(attention, nn.Module):
                raise InvalidSpec(
                    f"activation_checkpointing selective: attention needs blocks with a `self_attn`; "
                    f"{type(block).__name__} has none",
                    hint="use activation_checkpointing {mode: selective, selective: blocks} or full",
                )
            block.self_attn = checkpoint_wrapper(attention)
        return
    every = 1 if section.mode == "full" else section.every
    for index in range(0, len(layers), every):
        layers[index] = checkpoint_wrapper(layers[index])


def _fully_shard(model: nn.Module, d: Dist, bf16: bool) -> None:
    """FSDP2 on each block, then the rest (embeddings, final norm, head) at the root; HSDP when
    there are replicas of the shards."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    assert d.mesh is not None
    axes = ("dp_replicate", "dp_shard") if (d.layout.dp_replicate or 1) > 1 else ("dp_shard",)
    mesh = d.mesh[axes]
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    for block in blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


ValueOf = Callable[[str, torch.Size], torch.Tensor | None]
"""The full value of a parameter by its clean name and global shape; None keeps it as it is."""


def materialize(model: nn.Module, device: torch.device, value_of: ValueOf) -> None:
    """Give a model built on the meta device its storage on ``device`` and its weights: each
    rank copies its own shard out of each full tensor, one tensor at a time."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    # Swapped in place, a tied weight stays one parameter (the head and the embedding) through
    # ``to_empty``; the setting is global, and ``load_state_dict`` must not swap under DDP after.
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)
    with torch.no_grad():
        for name, param in model.named_parameters():
            value = value_of(clean_name(name), param.shape)
            if value is None:
                continue
            value = value.to(device=device, dtype=param.dtype)
            if isinstance(param, DTensor):
                shard = distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
                param.to_local().copy_(shard.to_local())
            else:
                param.copy_(value)
        for module in model.modules():
            reset = getattr(module, "reset_buffers", None)
            if callable(reset):
                reset()


def full_tensors(
    model: nn.Module, d: Dist, trainable_only: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each parameter (and persistent buffer) whole, one at a time, by its clean name: every
    rank takes part in gathering a sharded one; what rank 0 receives is on the CPU. Tied weights
    come once, under the first name."""
    from torch.distributed.tensor import DTensor

    # Every rank walks the same names in the same order, so the gathers pair up.
    for name, tensor in _named_state(model, trainable_only):
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        yield clean_name(name), full.detach().to("cpu") if d.is_main else full


def _named_state(model: nn.Module, trainable_only: bool) -> Iterator[tuple[str, torch.Tensor]]:
    for name, param in model.named_parameters():
        if param.requires_grad or not trainable_only:
            yield name, param
    if trainable_only:
        return
    for module_name, module in model.named_modules():
        for buffer_name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer_name not in module._non_persistent_buffers_set:
                yield f"{module_name}.{buffer_name}" if module_name else buffer_name, buffer
