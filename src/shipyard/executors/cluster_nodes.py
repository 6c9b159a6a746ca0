"""What a node tells the cluster about itself, in Ray's own terms.

A node joins with one Ray resource per accelerator type it has (``shipyard/h100-sxm: 8``; for the
CPU, ``shipyard/cpu: <cores>``), one resource only it has (``shipyard-node/<name>``) so that a
placement group's bundle can be pinned to exactly the node the scheduler chose, and Ray labels for
its failure and topology domains (rack, switch, NVLink island, InfiniBand fabric). What Ray's
resources cannot say (each device's memory and peak FLOPS, NVLink peers, the NCCL interfaces to
use) is kept as one JSON record per node in Ray's key-value store.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shipyard.errors import InvalidSpec
from shipyard.executors.base import NodeInventory
from shipyard.hardware import Device
from shipyard.hardware.catalog import catalog, unknown_key_hint
from shipyard.hardware.probe import HostRates

NAMESPACE = "shipyard"
"""The Ray namespace of Shipyard's actors and placement groups, and its key-value prefix."""
TYPE_RESOURCE = "shipyard/"
"""Prefix of the per-accelerator-type resources."""
PIN_RESOURCE = "shipyard-node/"
"""Prefix of the resource that names one node; a bundle takes one unit of it."""
PIN_UNITS = 1000
"""Units of a node's own resource: at most this many attempts share one node."""
NODE_LABEL = "shipyard.io/node"
EMULATED_LABEL = "shipyard.io/emulated"
"""Set on a node whose advertised accelerators are not there (tests on machines without the
hardware): its attempts run on the CPU while the scheduler sees the advertised type."""
TOPOLOGY_KEYS = ("rack", "switch", "nvlink_island", "ib_fabric", "zone")
"""The labels ``shipyard node start`` takes options for; any other ``key=value`` passes too."""
NCCL_ENV = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA")


def kv_key(node: str) -> bytes:
    return f"{NAMESPACE}/node/{node}".encode()


def pin_resource(node: str) -> str:
    return f"{PIN_RESOURCE}{node}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Advertisement:
    """One node as it joins: its name, devices, labels, scratch folder and NCCL settings."""

    node: str
    devices: tuple[Device, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    scratch: str
    """Where attempts on this node keep their run folders and caches (the node's own disk)."""
    emulated: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment of the node's training processes (``NCCL_SOCKET_IFNAME``, ``NCCL_IB_HCA``)."""
    host: HostRates | None = None
    """This node's CPU as measured where it starts (``None`` from a node that did not measure it)."""

    def check(self) -> None:
        """Refuse a node whose accelerators the catalog does not know: the scheduler could not
        rate them, and no job could ask for them by name."""
        known = catalog()
        for device in self.devices:
            if device.accelerator_type not in known:
                raise InvalidSpec(
                    f"node {self.node}: device {device.index} ({device.name}) is of an accelerator "
                    f"type the catalog does not know ({device.accelerator_type!r})",
                    hint="add it to $SHIPYARD_HOME/hardware.yaml (as docs/planning.md shows; "
                    f"`shipyard plan catalog` lists the known types); "
                    f"{unknown_key_hint(device.accelerator_type, known)}",
                )

    def inventory(self, *, up: bool = True) -> NodeInventory:
        return NodeInventory(
            id=self.node, devices=self.devices, labels=dict(self.labels), up=up, host=self.host
        )

    def resources(self) -> dict[str, float]:
        """The Ray resources the node starts with (``ray start --resources``)."""
        resources: dict[str, float] = {pin_resource(self.node): PIN_UNITS}
        for kind, count in self.inventory().capacity().items():
            resources[f"{TYPE_RESOURCE}{kind}"] = count
        return resources

    def ray_labels(self) -> dict[str, str]:
        """The Ray labels the node starts with (``ray start --labels``)."""
        labels = {NODE_LABEL: self.node, **self.labels}
        if self.emulated:
            labels[EMULATED_LABEL] = "true"
        return labels

    def gpus(self) -> int:
        """Devices Ray should account as its own GPUs (NVIDIA and AMD ones, not emulated)."""
        if self.emulated:
            return 0
        return sum(1 for d in self.devices if d.vendor in ("nvidia", "amd"))

    def to_json(self) -> bytes:
        record = dataclasses.asdict(self)
        return json.dumps(record, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Advertisement:
        record = json.loads(raw)
        devices = tuple(
            Device(**{**d, "nvlink_peers": tuple(d.get("nvlink_peers", ()))}) for d in record.pop("devices")
        )
        host = record.pop("host", None)
        return cls(devices=devices, host=HostRates(**host) if host else None, **record)


def parse_labels(pairs: Sequence[str]) -> dict[str, str]:
    """``rack=r1`` options as labels; a malformed one is refused with the form to use."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InvalidSpec(f"label {pair!r} is not KEY=VALUE", hint="write it as --label rack=r1")
        labels[key.strip()] = value.strip()
    return labels
