"""Run attempts as subprocesses of this node: one process for one device, ``torchrun`` for more.

An attempt sees only its devices (``CUDA_VISIBLE_DEVICES`` and friends), is pinned to its CPU cores
and told how many threads to use, so concurrent jobs never oversubscribe the node. Each attempt
runs in its own session, so stopping it reaches every process it started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from shipyard.errors import LaunchFailed
from shipyard.executors import processes
from shipyard.executors.base import (
    AttemptHandle,
    AttemptStatus,
    Busy,
    Exited,
    NodeInventory,
    Placement,
    Request,
    Running,
    StoreAccess,
    Synced,
    Vanished,
)
from shipyard.executors.stacks import python_stacks
from shipyard.hardware.discovery import Device
from shipyard.hardware.probe import HostRates, measure_host
from shipyard.scheduling.status import Status, unplaceable
from shipyard.schemas.launch import TorchDevice

NODE_NAME_ENV = "SHIPYARD_NODE_NAME"
"""This node's id in the inventory and on its attempts (default: the host name)."""
PLANNED = "planned:"
"""How a handle recorded before its launch starts: the run folder follows."""
NODE_LABELS_ENV = "SHIPYARD_NODE_LABELS"
"""Labels of this node, ``rack=r1,zone=a``, shown with its inventory."""

TORCH_DEVICE: dict[str, TorchDevice] = {
    "nvidia": "cuda",
    "amd": "cuda",
    "apple": "mps",
    "intel": "hpu",
}

# Environment variables that restrict a process to some accelerators, per vendor.
_VISIBLE_ENV = {
    "nvidia": ("CUDA_VISIBLE_DEVICES",),
    "amd": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
    "intel": ("HABANA_VISIBLE_MODULES",),
}
_ALL_VISIBLE_ENV = tuple(v for names in _VISIBLE_ENV.values() for v in names)


def training_command(world_size: int, run_dir: Path) -> list[str]:
    """The training processes of one machine: one, or torchrun's ``world_size`` on loopback."""
    if world_size == 1:
        return [sys.executable, "-m", "shipyard.training", str(run_dir)]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world_size}",
        "-m",
        "shipyard.training",
        str(run_dir),
    ]


class LocalExecutor:
    """The ``Executor`` of one machine: its devices form one node, attempts are its processes."""

    shares_run_folders = True

    def __init__(
        self,
        devices: Sequence[Device] | Callable[[], Sequence[Device]],
        *,
        node: str | None = None,
        host: Callable[[], HostRates | None] = measure_host,
    ) -> None:
        """``devices``, or how to discover them, and how to measure the host's CPU: only at the
        first use that needs them (reading a log does not), since both may import torch."""
        self._devices = devices
        self._host = host
        self._name = node
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    @functools.cached_property
    def node(self) -> NodeInventory:
        devices = list(self._devices() if callable(self._devices) else self._devices)
        name = self._name or os.environ.get(NODE_NAME_ENV) or socket.gethostname()
        return NodeInventory(id=name, devices=tuple(devices), labels=_labels(devices), host=self._host())

    @property
    def devices(self) -> tuple[Device, ...]:
        return self.node.devices

    @property
    def cpu(self) -> Device:
        return self.node.cpu

    @property
    def accelerators(self) -> tuple[Device, ...]:
        return self.node.accelerators

    # --- inventory and placement --------------------------------------------------------------

    def nodes(self) -> list[NodeInventory]:
        return [self.node]

    def known_nodes(self) -> list[NodeInventory]:
        return [self.node]

    def check_feasible(self, request: Request) -> Status | None:
        """Could the request ever run here, on an idle node?"""
        placed = self.place(request)
        return placed if isinstance(placed, Status) else None

    def place(self, request: Request, on: Collection[str] | None = None) -> Placement | Status:
        """The first accelerator type of the request's any-of list this node has enough of, or
        why none does (its devices are picked by ``pick``)."""
        if on is not None and self.node.id not in on:
            return unplaceable(f"node {self.node.id} is not among {sorted(on)}", transient=False)
        if request.nodes > 1:
            return unplaceable(
                f"the local executor runs single-node jobs; this job asks for {request.nodes} nodes "
                "(for a cluster, run the server with SHIPYARD_EXECUTOR=ray: docs/operations.md, "
                "Two machines)",
                transient=False,
            )
        reasons: list[str] = []
        for accelerator_type in request.accelerator_types:
            placed = self._place_on(accelerator_type, request)
            if isinstance(placed, Placement):
                return placed
            reasons.append(placed.message)
        return unplaceable("; ".join(reasons), transient=False)

    def _place_on(self, accelerator_type: str, request: Request) -> Placement | Status:
        if accelerator_type == "cpu":
            if self.cpu.memory_gib < request.min_memory_gib:
                return unplaceable(
                    f"cpu: needs {request.min_memory_gib:g} GiB of memory, this node has "
                    f"{self.cpu.memory_gib:.0f} GiB",
                    transient=False,
                )
            threads = request.threads_per_process(self.cpu.cores)
            need = threads * request.devices
            if need > self.cpu.cores:
                return unplaceable(
                    f"cpu: needs {need} cores ({request.devices} processes × {threads} threads), "
                    f"this node has {self.cpu.cores}",
                    transient=False,
                )
            return Placement(
                node=self.node.id,
                accelerator_type="cpu",
                torch_device="cpu",
                device_ids=(),
                core_ids=(),
                threads_per_process=threads,
                world_size=request.devices,
                peak_tflops_bf16=self.cpu.peak_bf16_tflops / self.cpu.cores * threads,
                peak_tflops_fp32=self.cpu.peak_fp32_tflops / self.cpu.cores * threads,
            )
        of_type = [d for d in self.accelerators if d.accelerator_type == accelerator_type]
        matching = self._matching(accelerator_type, request)
        if len(matching) < request.devices:
            have = f"has {len(matching)}" if matching else "has none"
            if len(matching) < len(of_type):
                largest = max(d.memory_gib for d in of_type)
                have += f" with {request.min_memory_gib:g} GiB or more (the largest has {largest:.0f} GiB)"
            return unplaceable(
                f"{accelerator_type}: needs {request.devices} devices, this node {have}",
                transient=False,
            )
        spec = matching[0]
        # Host threads per GPU process: the node's cores shared over its accelerators.
        threads = request.cpus_per_device or max(1, self.cpu.cores // max(1, len(self.accelerators)))
        return Placement(
            node=self.node.id,
            accelerator_type=accelerator_type,
            torch_device=TORCH_DEVICE.get(spec.vendor, "cuda"),
            device_ids=(),
            core_ids=(),
            # Host threads per GPU process: the node's cores shared over its accelerators.
            threads_per_process=request.cpus_per_device
            or max(1, self.cpu.cores // max(1, len(self.accelerators))),
            world_size=request.devices,
            peak_tflops_bf16=spec.peak_bf16_tflops,
            peak_tflops_fp32=spec.peak_fp32_tflops,
        )

    def _matching(self, accelerator_type: str, request: Request) -> list[Device]:
        """The node's devices of the type with the memory the request asks for."""
        return [
            d
            for d in self.accelerators
            if d.accelerator_type == accelerator_type and d.memory_gib >= request.min_memory_gib
        ]

    def pick(self, placement: Placement, request: Request, held: Mapping[str, Busy]) -> Placement | Status:
        """The devices (an NVLink island where one fits) and cores the running attempts leave free
        (``held``), or why too few are."""
        busy = held.get(self.node.id, Busy())
        free_cores = [c for c in range(self.cpu.cores) if c not in busy.cores]
        kind, count = placement.accelerator_type, placement.world_size
        if kind == "cpu":
            need = placement.threads_per_process * count
            if need > len(free_cores):
                return unplaceable(
                    f"cpu: {len(free_cores)} of {self.cpu.cores} cores free, needs {need}", transient=True
                )
            return dataclasses.replace(placement, core_ids=tuple(free_cores[:need]))
        matching = self._matching(kind, request)
        taken = busy.devices.get(kind, set())
        free = [d for d in matching if d.index not in taken]
        if len(free) < count:
            return unplaceable(
                f"{kind}: {len(free)} of {len(matching)} devices free, needs {count}", transient=True
            )
        chosen = _prefer_nvlink_island(free, count)
        cores = tuple(free_cores[: placement.threads_per_process * count]) or tuple(range(self.cpu.cores))
        return dataclasses.replace(
            placement,
            device_ids=tuple(d.index for d in chosen),
            core_ids=cores,
            peak_tflops_bf16=chosen[0].peak_bf16_tflops,
            peak_tflops_fp32=chosen[0].peak_fp32_tflops,
        )

    # --- processes ----------------------------------------------------------------------------

    def command(self, placement: Placement, run_dir: Path) -> list[str]:
        # Under a parent that outlives this agent and writes how the processes ended
        # (``training.parent``): an agent that adopts the attempt later still learns its cause.
        parent = [sys.executable, "-m", "shipyard.training.parent", str(run_dir), "--"]
        return parent + training_command(placement.world_size, run_dir)

    def environment(self, placement: Placement) -> dict[str, str]:
        env = dict(os.environ)
        for name in _ALL_VISIBLE_ENV:
            env.pop(name, None)
        vendor = next(
            (d.vendor for d in self.accelerators if d.accelerator_type == placement.accelerator_type),
            None,
        )
        ids = ",".join(str(i) for i in placement.device_ids)
        for name in _VISIBLE_ENV.get(vendor or "", ()):
            env[name] = ids
        if placement.accelerator_type == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU job must not grab a GPU of the node
        env["OMP_NUM_THREADS"] = str(placement.threads_per_process)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def expected_handle(self, placement: Placement, run_dir: Path) -> AttemptHandle:
        """Names the run folder: its attempt's process is found by its command line until the
        handle ``launch`` returns (process id and start time) is recorded."""
        del placement
        return AttemptHandle(nodes=(self.node.id,), handle=f"{PLANNED}{run_dir.resolve()}")

    def launch(
        self, placement: Placement, run_dir: Path, log_path: Path, store: StoreAccess | None = None
    ) -> AttemptHandle:
        del store  # the attempt reads and writes the agent's own folders
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cores = set(placement.core_ids)

        def pin() -> None:  # runs in the child before exec
            if cores and hasattr(os, "sched_setaffinity"):
                # Best effort: thread counts already bound the load where affinity is refused.
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(0, cores)

        try:
            with open(log_path, "ab") as log:
                process = subprocess.Popen(
                    self.command(placement, run_dir),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.environment(placement),
                    cwd=run_dir,
                    start_new_session=True,
                    preexec_fn=pin,
                )
        except OSError as exc:
            # Out of processes or memory for a fork passes; a missing interpreter does not.
            transient = exc.errno in (errno.EAGAIN, errno.ENOMEM)
            raise LaunchFailed(
                f"could not start the training process: {exc}",
                transient=transient,
                hint=None
                if transient
                else "check that Shipyard's training extra is installed: pip install 'shipyard[train]'",
            ) from exc
        self._children[process.pid] = process
        # The start time makes the handle name this process only: a later agent that finds the
        # pid alive adopts it only if it is the same process, not another that reuses the pid.
        started = processes.start_time(process.pid)
        handle = f"{process.pid}@{started}" if started is not None else str(process.pid)
        return AttemptHandle(nodes=(self.node.id,), handle=handle, pid=process.pid)

    def runs(self, handle: AttemptHandle) -> bool:
        return handle.node == self.node.id

    def status(self, handle: AttemptHandle) -> AttemptStatus:
        found = _pid_of(handle)
        if found is None:
            return Vanished()
        pid = found[0]
        child = self._children.get(pid)
        if child is not None:
            code = child.poll()
            if code is None:
                return Running()
            del self._children[pid]
            return Exited.of(code)
        # Launched by an earlier agent: we cannot wait on it, only see whether it still runs.
        if not self._runs_still(handle):
            return Vanished()
        if handle.handle.startswith(PLANNED):  # found by its folder: name it as launch would
            return Running(found=AttemptHandle(nodes=handle.nodes, handle=f"{pid}@{found[1]}", pid=pid))
        return Running()

    def _runs_still(self, handle: AttemptHandle) -> bool:
        """Whether the attempt's process runs (and is the one launched, not another with its pid)."""
        found = _pid_of(handle)
        if found is None:
            return False
        pid, started = found
        child = self._children.get(pid)
        if child is not None:
            return child.poll() is None
        return processes.alive(pid) and (started is None or processes.start_time(pid) == started)

    def stop(self, handle: AttemptHandle, *, force: bool = False) -> None:
        found = _pid_of(handle)
        if found is None:
            return  # nothing runs under that handle
        pid, started = found
        if started is not None and processes.start_time(pid) not in (started, None):
            return  # the pid names another process now: never signal it
        # The whole group: ranks outlive a torchrun that died first.
        processes.signal_group(pid, signal.SIGKILL if force else signal.SIGTERM)

    def dump_stacks(self, handle: AttemptHandle) -> str | None:
        process = _pid_of(handle)
        if process is None or not self._runs_still(handle):
            return None
        leader = process[0]
        # The training processes of the leader's group: not the attempt's parent, nor torchrun,
        # which has no handler for SIGUSR1 (it would die of it and leave the ranks unobserved).
        members = [pid for pid in processes.group_members(leader) if processes.is_training_rank(pid)] or [
            leader
        ]
        dumps = []
        for pid in members:
            found = python_stacks(pid)
            if found is not None:
                dumps.append(found)
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        return "\n".join(dumps) or None

    def sync(self, handle: AttemptHandle, run_dir: Path) -> Synced:
        del handle, run_dir  # the attempt writes into the run directory itself
        return Synced()

    def release(self, handle: AttemptHandle) -> None:
        del handle  # an ended process holds nothing

    def read_log(self, node: str | None, log_path: Path, offset: int, limit: int | None = None) -> bytes:
        del node  # every attempt of this executor ran here and wrote its log here
        return read_log_file(log_path, offset, limit)


def read_log_file(log_path: Path, offset: int, limit: int | None) -> bytes:
    if not log_path.exists():
        return b""
    with open(log_path, "rb") as f:
        f.seek(offset)
        return f.read(-1 if limit is None else limit)


def _labels(devices: Sequence[Device]) -> dict[str, str]:
    """The host name, NVLink islands seen among the accelerators, and the operator's labels."""
    labels = {"hostname": socket.gethostname()}
    islands = {tuple(sorted({d.index, *d.nvlink_peers})) for d in devices if d.nvlink_peers}
    if islands:
        labels["nvlink_islands"] = " ".join(",".join(map(str, i)) for i in sorted(islands))
    for pair in os.environ.get(NODE_LABELS_ENV, "").split(","):
        key, _, value = pair.partition("=")
        if key.strip() and value.strip():
            labels[key.strip()] = value.strip()
    return labels


def _prefer_nvlink_island(free: list[Device], count: int) -> list[Device]:
    """Pick devices that are NVLink peers of each other when the node has such a set."""
    for first in free:
        island = [first] + [d for d in free if d.index in first.nvlink_peers]
        if len(island) >= count:
            return island[:count]
    return free[:count]


def _pid_of(handle: AttemptHandle) -> tuple[int, int | None] | None:
    """The process id and start time a handle names (handles of older agents hold the pid only);
    for a handle recorded before its launch, those of the process found running its folder, or
    None when there is none."""
    if handle.handle.startswith(PLANNED):
        return processes.launched_for(handle.handle.removeprefix(PLANNED))
    pid, _, started = handle.handle.partition("@")
    return int(pid), int(started) if started else None
