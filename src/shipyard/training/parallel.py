"""Process groups and the wrappers that spread a model over devices (DDP or FSDP2)."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shipyard.schemas.launch import TorchDevice


@dataclass(frozen=True, slots=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init(torch_device: TorchDevice) -> Dist:
    """Join the process group that torchrun set up (or run alone without one)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch_device in ("cuda", "xpu"):
        device = torch.device(torch_device, local_rank)
        if torch_device == "cuda":
            torch.cuda.set_device(device)
    else:
        device = torch.device(torch_device)
    if world > 1:
        dist.init_process_group(backend="nccl" if torch_device == "cuda" else "gloo")
    return Dist(rank=rank, world_size=world, local_rank=local_rank, device=device)


def shutdown(d: Dist) -> None:
    """Leave the process group. A gloo group is left as it is: destroying it races the peers'
    teardown and can abort the process after a complete run ("terminate called without an
    active exception"); the entry point ends such processes with ``os._exit`` instead."""
    if d.enabled and dist.is_initialized() and dist.get_backend() != "gloo":
        dist.destroy_process_group()


def all_reduce_mean(value: float, d: Dist) -> float:
    if not d.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=_comm_device(d))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item()) / d.world_size


def all_reduce_sum(values: list[float], d: Dist) -> list[float]:
    if not d.enabled:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device(d))
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [float(v) for v in t.tolist()]


def any_rank(flag: bool, d: Dist) -> bool:
    """True on every rank if it is true on any (so all ranks stop at the same step)."""
    if not d.enabled:
        return flag
    t = torch.tensor([int(flag)], device=_comm_device(d))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


def _comm_device(d: Dist) -> torch.device:
    return d.device if d.device.type == "cuda" else torch.device("cpu")


def wrap(model: nn.Module, d: Dist, parallelism: str, bf16: bool) -> nn.Module:
    """DDP replicates the model on every rank; FSDP2 shards each block's parameters."""
    if not d.enabled:
        return model
    if parallelism == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(d.device.type, (d.world_size,))
        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32
        )
        for block in _blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [d.device.index] if d.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def _blocks(model: nn.Module) -> nn.ModuleList:
    """The model's transformer blocks: its longest list of modules (``model.layers`` of Shipyard's
    LLaMA and of every ``transformers`` decoder, however deep a PEFT wrapper puts it)."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return max(lists, key=len)


def no_sync(model: nn.Module, last_micro_step: bool) -> AbstractContextManager[Any]:
    """Skip DDP's gradient all-reduce on every micro-step but the last of an optimizer step."""
    if last_micro_step or not hasattr(model, "no_sync"):
        return nullcontext()
    context: AbstractContextManager[Any] = model.no_sync()  # type: ignore[operator]
    return context


def full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, d: Dist, fsdp: bool, trainable_only: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Unsharded model and optimizer state (all ranks must call; rank 0 saves it);
    ``trainable_only``: the model's trained parameters alone (adapters, not the frozen base)."""
    if fsdp and d.enabled:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(
            full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only
        )
        return (
            get_model_state_dict(model, options=options),
            get_optimizer_state_dict(model, optimizer, options=options),
        )
    state = model.state_dict()
    if trainable_only:
        trained = {name for name, p in model.named_parameters() if p.requires_grad}
        state = {k: v for k, v in state.items() if k in trained}
    return state, optimizer.state_dict()


def load_full_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, Any],
    optim_state: dict[str, Any],
    d: Dist,
    fsdp: bool,
    trainable_only: bool = False,
) -> None:
    """``trainable_only``: the state holds the trained parameters alone; the rest stay as loaded."""
    if fsdp and d.enabled:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, strict=not trainable_only)
        set_model_state_dict(model, model_state, options=options)
        set_optimizer_state_dict(model, optimizer, optim_state, options=options)
        return
    model.load_state_dict(model_state, strict=not trainable_only)
    optimizer.load_state_dict(optim_state)
