"""Executors: where attempts run, behind one interface (``base.Executor``). The local one runs
them as subprocesses of this machine (one process, or ``torchrun`` for several devices)."""

from shipyard.executors.base import (
    AttemptHandle,
    Busy,
    DevicePicker,
    Executor,
    Launcher,
    NodeInventory,
    Placement,
    Request,
    capacity_of,
    devices_of,
    place_now,
)
from shipyard.executors.local import LocalExecutor

__all__ = [
    "AttemptHandle",
    "Busy",
    "DevicePicker",
    "Executor",
    "Launcher",
    "LocalExecutor",
    "NodeInventory",
    "Placement",
    "Request",
    "capacity_of",
    "devices_of",
    "place_now",
]
