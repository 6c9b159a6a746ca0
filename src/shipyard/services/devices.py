"""What this node has."""

from __future__ import annotations

from shipyard.schemas.views import DeviceView
from shipyard.services.context import ServiceContext


def list_devices(ctx: ServiceContext) -> list[DeviceView]:
    return [DeviceView.model_validate(d, from_attributes=True) for d in ctx.executor.devices]
