"""The executor role: place an attempt on devices, launch it, watch it, stop it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from shipyard.schemas.jobspec import ResourcesSection
from shipyard.schemas.launch import TorchDevice


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Concrete devices for one attempt on one node."""

    accelerator_type: str
    torch_device: TorchDevice
    device_ids: tuple[int, ...]
    """Accelerator indices; for a CPU job, empty (its share is ``core_ids``)."""
    core_ids: tuple[int, ...]
    threads_per_process: int
    world_size: int
    peak_tflops_bf16: float
    peak_tflops_fp32: float


@dataclass(frozen=True, slots=True)
class Unplaceable:
    """Why an attempt cannot start now (``transient``) or ever on this node."""

    reason: str
    transient: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    accelerator_types: Sequence[str]
    devices: int
    nodes: int = 1
    cpus_per_device: int | None = None
    min_memory_gib: float = 0.0

    @classmethod
    def of(cls, resources: ResourcesSection, accelerator_types: Sequence[str] | None = None) -> Request:
        """What a job spec asks for (on ``accelerator_types`` when the scheduler chose one)."""
        return cls(
            accelerator_types=list(accelerator_types or resources.accelerator),
            devices=resources.devices,
            nodes=resources.nodes,
            cpus_per_device=resources.cpus_per_device,
            min_memory_gib=resources.min_memory_gib or 0.0,
        )


@runtime_checkable
class Executor(Protocol):
    def place(
        self, request: Request, busy_devices: Mapping[str, set[int]], busy_cores: set[int]
    ) -> Placement | Unplaceable: ...

    def launch(self, placement: Placement, run_dir: Path, log_path: Path) -> int:
        """Start the attempt; returns its process id."""
        ...

    def poll(self, pid: int) -> int | None:
        """The exit code if the process ended, else None."""
        ...

    def terminate(self, pid: int) -> None: ...

    def kill(self, pid: int) -> None: ...
