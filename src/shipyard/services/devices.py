"""What this node has."""

from __future__ import annotations

from shipyard.schemas.views import DeviceView
from shipyard.services.context import ServiceContext


def list_devices(ctx: ServiceContext) -> list[DeviceView]:
    return [
        DeviceView(
            accelerator_type=d.accelerator_type,
            index=d.index,
            name=d.name,
            vendor=d.vendor,
            memory_gib=d.memory_gib,
            peak_bf16_tflops=round(d.peak_bf16_tflops, 2),
            peak_fp32_tflops=round(d.peak_fp32_tflops, 2),
            cores=d.cores,
            nvlink_peers=list(d.nvlink_peers),
        )
        for d in ctx.executor.devices
    ]
