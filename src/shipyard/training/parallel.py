"""The process group, the device mesh over it, and the collectives the loop needs.

The mesh follows torchtitan's order, outermost first: ``dp_replicate``, ``dp_shard``, ``tp``. Ranks
next to each other (the devices of one node) form a tensor-parallel group; the data-parallel rank
of a process is its rank divided by ``tp``.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from shipyard.errors import InvalidSpec
from shipyard.schemas.launch import TorchDevice
from shipyard.schemas.training_spec import ParallelismSection

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

MESH_AXES = ("dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True, slots=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    layout: ParallelismSection
    """Every degree resolved: ``tp * dp_shard * dp_replicate == world_size``."""
    mesh: DeviceMesh | None = None
    """Over every rank, axes ``MESH_AXES``; None in a single process."""
    checkpoint_group: dist.ProcessGroup | None = None
    """A gloo group of its own for checkpoints written in the background, whose collectives
    would otherwise interleave with the training step's on the default group."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def tp(self) -> int:
        return self.layout.tp or 1

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: each reads its own slice of the batch; a tensor-parallel group shares one."""
        return self.world_size // self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp


def init(torch_device: TorchDevice, layout: ParallelismSection) -> Dist:
    """Join the process group that torchrun set up (or run alone without one) and lay the mesh
    over it. ``layout`` may leave degrees open: the rest becomes data parallel."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    resolved = layout.resolved(world)
    if per_node % (resolved.tp or 1):
        raise InvalidSpec(
            f"training.parallelism.tp {resolved.tp} does not divide the {per_node} processes of a node",
            hint="tensor parallelism stays inside a node: pick a tp that divides resources.devices",
        )
    if torch_device in ("cuda", "xpu"):
        device = torch.device(torch_device, local_rank)
        if torch_device == "cuda":
            torch.cuda.set_device(device)
    else:
        device = torch.device(torch_device)
    if world == 1:
        return Dist(rank=0, world_size=1, local_rank=0, device=device, layout=resolved)
    # CUDA tensors go through NCCL, CPU ones (background checkpoints, small objects) through gloo.
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if torch_device == "cuda" else "gloo")
    from torch.distributed.device_mesh import init_device_mesh

    shape = (resolved.dp_replicate or 1, resolved.dp_shard or 1, resolved.tp or 1)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=MESH_AXES)
    return Dist(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        device=device,
        layout=resolved,
        mesh=mesh,
        checkpoint_group=dist.new_group(backend="gloo"),
    )


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


def no_sync(model: nn.Module, last_micro_step: bool) -> AbstractContextManager[Any]:
    """Skip DDP's gradient all-reduce on every micro-step but the last of an optimizer step."""
    if last_micro_step or not hasattr(model, "no_sync"):
        return nullcontext()
    context: AbstractContextManager[Any] = model.no_sync()  # type: ignore[operator]
    return context


def whole(value: torch.Tensor) -> torch.Tensor:
    """A plain tensor of ``value``: a loss or gradient norm over sharded tensors is a DTensor."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value
