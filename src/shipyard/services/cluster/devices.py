"""What the executor's nodes have."""

from __future__ import annotations

from shipyard.hardware import Device
from shipyard.schemas.views import DeviceView
from shipyard.services.context import ServiceContext


def list_devices(ctx: ServiceContext) -> list[DeviceView]:
    return [
        DeviceView.model_validate({**_fields(device), "node": node.id})
        for node in ctx.inventory.nodes()
        for device in node.devices
    ]


def _fields(device: Device) -> dict[str, object]:
    return {name: getattr(device, name) for name in device.__slots__}
