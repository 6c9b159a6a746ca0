"""The executor interface, split as engines differ: what every engine has (``Inventory``: its
nodes; ``Launcher``: an attempt's life, launch, status, graceful stop, logs), where an attempt
starts (``Executor.place``), and what only some have (``DevicePicker``: the concrete devices, where
Shipyard owns them, as on this machine; Ray, Slurm and Kubernetes pick their own).

The scheduler decides which accelerator type and nodes a job gets; the executor obeys. Every
attempt is known by an ``AttemptHandle``: its nodes and the engine's own name for it (a process id
for the local executor, an actor for Ray, a job id for a batch system), never only a local pid.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, cast, runtime_checkable

from shipyard.hardware.discovery import Device
from shipyard.hardware.probe import HostRates
from shipyard.scheduling.status import Status, unplaceable
from shipyard.schemas.launch import TorchDevice
from shipyard.schemas.resources_spec import ResourcesSection


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInventory:
    """One machine an executor runs attempts on: its devices and labels (rack, NVLink islands)."""

    id: str
    devices: tuple[Device, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    up: bool = True
    """False for a node the cluster lost: it is listed, but nothing is placed on it."""
    in_use: Mapping[str, int] = field(default_factory=dict)
    """Devices per type (cores for ``cpu``) the executor sees taken by anyone, where it can see
    that (a cluster shared with other consumers); empty where only its own attempts take them."""
    host: HostRates | None = None
    """What the node's own CPU measured as it joined (``hardware.probe``): its GEMM rate, memory
    bandwidth and cost of an operation, which a job's estimate plans that node's host with."""

    @property
    def cpu(self) -> Device:
        return next(d for d in self.devices if d.accelerator_type == "cpu")

    @property
    def accelerators(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.accelerator_type != "cpu")

    def capacity(self) -> dict[str, int]:
        """Devices per accelerator type; for ``cpu`` the number of cores."""
        counts: dict[str, int] = {}
        for device in self.devices:
            size = device.cores if device.accelerator_type == "cpu" else 1
            counts[device.accelerator_type] = counts.get(device.accelerator_type, 0) + size
        return counts

    def memory_gib(self) -> dict[str, float]:
        """Memory per device of each type (the smallest, where a type's devices differ)."""
        memory: dict[str, float] = {}
        for device in self.devices:
            kind = device.accelerator_type
            memory[kind] = min(memory.get(kind, device.memory_gib), device.memory_gib)
        return memory

    def record(self) -> dict[str, Any]:
        """The node as plain values (what the agent records for the processes that do not ask the
        engine themselves)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> NodeInventory:
        devices = tuple(Device(**{**d, "nvlink_peers": tuple(d["nvlink_peers"])}) for d in record["devices"])
        host = HostRates(**record["host"]) if record.get("host") else None
        fields = {k: v for k, v in record.items() if k not in ("devices", "host")}
        return cls(devices=devices, host=host, **fields)


def units_on(node: NodeInventory, accelerator_type: str, request: Request) -> tuple[int, int]:
    """What one node of the request takes of the type (cores for the CPU), and what the node has."""
    have = node.capacity().get(accelerator_type, 0)
    if accelerator_type == "cpu":
        threads = request.cpus_per_device or max(1, have // request.devices)
        return threads * request.devices, have
    return request.devices, have


def feasible_on(known: Sequence[NodeInventory], request: Request, empty: str) -> Status | None:
    """Could the request ever run on ``known`` nodes, each idle and up? If not, which nodes fall
    short and by how much (``empty``: why when there are none)."""
    if not known:
        return unplaceable(empty, transient=False)
    reasons = []
    for accelerator_type in request.accelerator_types:
        sized = {node.id: units_on(node, accelerator_type, request) for node in known}
        need = next(iter(sized.values()))[0]
        large = [name for name, (units, have) in sized.items() if have >= units]
        if len(large) >= request.nodes:
            return None
        nodes = ", ".join(f"{name} has {have}" for name, (_, have) in sized.items())
        reasons.append(
            f"{accelerator_type}: needs {request.nodes} node(s) with {need} each; "
            f"{len(large)} of the {len(known)} nodes are that large ({nodes})"
        )
    return unplaceable("; ".join(reasons), transient=False)


def devices_of(nodes: Sequence[NodeInventory]) -> list[Device]:
    """Every device of ``nodes``, node by node."""
    return [device for node in nodes for device in node.devices]


def capacity_of(nodes: Sequence[NodeInventory]) -> dict[str, int]:
    """Devices per accelerator type over ``nodes`` (cores for ``cpu``)."""
    total: dict[str, int] = {}
    for node in nodes:
        for kind, count in node.capacity().items():
            total[kind] = total.get(kind, 0) + count
    return total


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Concrete devices for one attempt on one node."""

    node: str
    accelerator_type: str
    torch_device: TorchDevice
    device_ids: tuple[int, ...]
    """Accelerator indices; for a CPU job, empty (its share is ``core_ids``)."""
    core_ids: tuple[int, ...]
    threads_per_process: int
    world_size: int
    peak_tflops_bf16: float
    peak_tflops_fp32: float
    peers: tuple[str, ...] = ()
    """The other nodes of a multi-node attempt, in rank order after ``node``."""

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node, *self.peers)


@dataclass(slots=True)
class Busy:
    """What running attempts hold on one node."""

    devices: dict[str, set[int]] = field(default_factory=dict)
    """Accelerator indices by type."""
    cores: set[int] = field(default_factory=set)

    def hold(self, accelerator_type: str, ids: Sequence[int]) -> None:
        """Count an attempt's devices (for a CPU attempt, its cores) as taken."""
        if accelerator_type == "cpu":
            self.cores.update(ids)
        else:
            self.devices.setdefault(accelerator_type, set()).update(ids)


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

    def threads_per_process(self, cores: int) -> int:
        """A CPU job's threads per process on a node of ``cores``: what it asks, else a fair share."""
        return self.cpus_per_device or max(1, cores // self.devices)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptHandle:
    """Where an attempt runs and the executor's own name for it."""

    nodes: tuple[str, ...]
    """Every node of the attempt, the node of rank 0 first."""
    handle: str
    pid: int | None = None
    """The process id, where the attempt is a process this machine can see."""

    @property
    def node(self) -> str:
        """The node of rank 0."""
        return self.nodes[0]

    @classmethod
    def recorded(cls, nodes: str, handle: str, pid: int | None = None) -> AttemptHandle:
        """The handle of an attempt as its record keeps it (``nodes`` comma-separated)."""
        return cls(nodes=tuple(nodes.split(",")), handle=handle, pid=pid)

    @property
    def stored_nodes(self) -> str:
        """The nodes as the attempt's record keeps them."""
        return ",".join(self.nodes)


# --- what an attempt is doing, as its engine sees it -----------------------------------------


@dataclass(frozen=True, slots=True)
class Running:
    """Its processes run. ``found``: the handle the engine knows it by, where the attempt was
    asked about by the handle recorded before its launch (an agent died before recording the
    engine's answer): the agent records it."""

    found: AttemptHandle | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    """Accepted by the engine, not started yet (a batch system's queue, a pod being scheduled):
    the engine's own reason, as it words it."""

    reason: str


EngineEnding = Literal["time_limit", "preempted", "out_of_memory", "withdrawn"]
"""``withdrawn``: taken out of the engine's queue before it started (a cancel, an operator's)."""


@dataclass(frozen=True, slots=True)
class Exited:
    """Its processes ended: the first non-zero exit code (0 when all succeeded), or the signal
    that ended one."""

    code: int
    signal: int | None = None
    engine_ended: EngineEnding | None = None
    """Where the engine ended it itself (a batch system's time limit, its own preemption, its
    memory limit): not the job's fault, which a new attempt continues from its checkpoint."""

    @classmethod
    def of(cls, returncode: int) -> Exited:
        """From a return code as ``subprocess`` gives it (negative: the signal)."""
        return cls(0, -returncode) if returncode < 0 else cls(returncode)

    @property
    def exit_code(self) -> int:
        """As ``subprocess`` reports it: the negative signal for a process a signal ended."""
        return -self.signal if self.signal is not None else self.code


@dataclass(frozen=True, slots=True)
class Vanished:
    """Its processes are gone and nobody saw how they ended (they ended while no agent watched,
    or the engine forgot them)."""


@dataclass(frozen=True, slots=True)
class NodeLost:
    """A node of the attempt left the cluster: its processes there are gone with it."""

    nodes: tuple[str, ...]


AttemptStatus = Running | Waiting | Exited | Vanished | NodeLost
"""What ``Executor.status`` says of an attempt."""


class FolderMover(Protocol):
    """How a node moves a folder into the artifact store and back by itself (the services hand
    one in, made by the storage layer, which the executors do not import)."""

    def write(self, folder: Path) -> list[dict[str, Any]]:
        """Store the folder's files; their records (path, blob), no bytes."""
        ...

    def read(self, records: list[dict[str, Any]], into: Path) -> Path:
        """The recorded files as folder ``into``, verified."""
        ...

    def cached(self, records: list[dict[str, Any]], cache: Path, holder: str) -> Path:
        """The recorded folder in the node's cache under ``cache``, fetched once per content and
        held by ``holder`` while the calling process lives."""
        ...


@dataclass(frozen=True, slots=True)
class StoredInput:
    """A stored folder an attempt reads (a ``store:`` dataset, a base model), which each node
    fetches into its own cache: its files' records, and the path inside it the job is given."""

    files: list[dict[str, Any]]
    within: str = ""


@dataclass(frozen=True, slots=True)
class StoreAccess:
    """What an attempt whose nodes move their own data gets at launch: the mover for its
    project, the checkpoint it resumes from and the stored folders it reads, as file records."""

    mover: FolderMover
    resume: tuple[str, list[dict[str, Any]]] | None = None
    """(the checkpoint's folder name, its files)."""
    inputs: Mapping[str, StoredInput] = field(default_factory=dict)
    """What its nodes fetch: ``data:N`` (the ``data.paths`` entry N) and ``model``."""


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint an attempt's nodes wrote into the store themselves, every node's part of it
    durable: what reaches the agent is its files' records, never their bytes."""

    name: str
    files: tuple[dict[str, Any], ...]
    description: str | None = None
    """Its ``checkpoint.json`` (what it was written from), which the agent keeps."""


@dataclass(frozen=True, slots=True)
class Synced:
    """What a look at an attempt brought besides its small files: the newest checkpoint its
    nodes stored whole since the last look, and the records of its export once its node stored
    it (``result.json`` names its folder)."""

    checkpoint: StoredCheckpoint | None = None
    export: tuple[dict[str, Any], ...] | None = None


@runtime_checkable
class Inventory(Protocol):
    """What every engine has: its nodes, and whether a request could ever run on them. A process
    that only answers questions (the API server of a cluster) reads the inventory the agent
    recorded instead of joining the engine (``executors/recorded.py``)."""

    def nodes(self) -> Sequence[NodeInventory]:
        """The nodes this executor may run attempts on now, with their devices and labels."""
        ...

    def known_nodes(self) -> Sequence[NodeInventory]:
        """Every node it knows, those that are down too (``up`` False)."""
        ...

    def check_feasible(self, request: Request) -> Status | None:
        """Why the request could never run on these nodes, even idle; None if it could."""
        ...


class Launcher(Protocol):
    """An attempt's life in its engine: launch, status, what it brought over, graceful stop, logs.
    Shaped so that a batch system (``sbatch``, ``squeue``/``sacct``, ``scancel --signal``) and a
    pod's lifecycle fit it as a process does: an attempt may wait in the engine's own queue
    (``Waiting``), and its handle is known before the launch (``expected_handle``)."""

    shares_run_folders: bool
    """Whether attempts write into the agent's own run folders (this machine's executor); if not,
    ``sync`` brings their small files over, and each node writes its part of every checkpoint
    into the store itself (``StoreAccess``), since the node's disk is the only other copy."""

    def expected_handle(self, placement: Placement, run_dir: Path) -> AttemptHandle:
        """The handle by which this executor finds the attempt whose launch plan is in
        ``run_dir``, known before it is launched: the agent records it first, so that an agent
        that dies before ``launch`` returns leaves an attempt the next one can ask about."""
        ...

    def launch(
        self, placement: Placement, run_dir: Path, log_path: Path, store: StoreAccess | None = None
    ) -> AttemptHandle:
        """Start the attempt; ``LaunchFailed`` says whether a later try may succeed. ``store``:
        how its nodes reach the artifact store, where they do not share the agent's folders."""
        ...

    def runs(self, handle: AttemptHandle) -> bool:
        """Whether the attempt is on one of this executor's nodes (so it may poll and stop it)."""
        ...

    def status(self, handle: AttemptHandle) -> AttemptStatus:
        """Whether the attempt waits in the engine, runs, or ended, and how."""
        ...

    def dump_stacks(self, handle: AttemptHandle) -> str | None:
        """Every training process's threads' Python stacks: read from outside (``stacks``, which
        works on a stopped or deadlocked process) and returned, and for a process that cannot be
        read so, written by itself into its log (SIGUSR1, which the runtime hands to
        ``faulthandler``). How a hang is diagnosed."""
        ...

    def sync(self, handle: AttemptHandle, run_dir: Path) -> Synced:
        """Bring what the attempt wrote on its nodes (metrics, heartbeats, result, logs) into
        ``run_dir`` here, and say what its nodes stored (``Synced``); nothing to do where both
        folders are the same."""
        ...

    def release(self, handle: AttemptHandle) -> None:
        """Free what the ended attempt held (its processes' hosts, its reserved devices)."""
        ...

    def stop(self, handle: AttemptHandle, *, force: bool = False) -> None:
        """Ask the attempt to checkpoint and exit (SIGTERM); with ``force``, end it now."""
        ...

    def read_log(self, node: str | None, log_path: Path, offset: int, limit: int | None = None) -> bytes:
        """Up to ``limit`` bytes (default: all) of an attempt's log from ``offset`` (empty when none yet)."""
        ...


@runtime_checkable
class DevicePicker(Protocol):
    """Only where Shipyard owns the devices (this machine's executor): which of a node's devices
    and cores an attempt gets, given what the running attempts hold. An engine that picks its own
    (Ray's bundles, Slurm's GRES, a pod's device plugin) is not one, and never sees ``held``."""

    def pick(self, placement: Placement, request: Request, held: Mapping[str, Busy]) -> Placement | Status:
        """``placement`` with its device and core indices, or why they are taken now (transient)."""
        ...


@runtime_checkable
class Executor(Inventory, Launcher, Protocol):
    """An engine the agent runs attempts on: its inventory, where an attempt starts on it, and the
    attempts' life. Chosen by name through ``executors.registry``."""

    def place(self, request: Request, on: Collection[str] | None = None) -> Placement | Status:
        """Where the attempt starts now: its nodes (only those ``on`` names, where the scheduler
        chose them), its accelerator type and world size. No device indices: the engine picks
        them, or, where the executor is a ``DevicePicker``, its ``pick`` does."""
        ...


def place_now(
    executor: Executor, request: Request, held: Mapping[str, Busy], on: Collection[str] | None = None
) -> Placement | Status:
    """Where the attempt starts now, with its devices where Shipyard picks them (``held``: what
    the running attempts hold, per node)."""
    placed = executor.place(request, on)
    if isinstance(placed, Placement) and _picks_devices(type(executor)):
        return cast(DevicePicker, executor).pick(placed, request, held)
    return placed


@functools.cache
def _picks_devices(kind: type) -> bool:
    """Whether executors of ``kind`` are device pickers, asked once per kind (checking a protocol
    reads its attributes: thousands of leases a pass would each pay for it)."""
    return issubclass(kind, DevicePicker)
