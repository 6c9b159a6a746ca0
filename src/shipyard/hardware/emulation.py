"""Accelerators a node advertises without having them, for trying a cluster and for its tests:
``SHIPYARD_EMULATE_ACCELERATORS=h100-sxm:2`` makes ``shipyard node start`` advertise two H100s
from the catalog, marked emulated. The scheduler, Ray's accounting and the placement see H100s;
the node's attempts run on its CPU. The seam for hardware a machine lacks, nothing more: a real
node never sets it."""

from __future__ import annotations

from shipyard.errors import InvalidSpec
from shipyard.hardware.catalog import catalog, lookup
from shipyard.hardware.discovery import Device

EMULATE_ENV = "SHIPYARD_EMULATE_ACCELERATORS"


def emulated_accelerators(accelerator_type: str, count: int, first_index: int = 0) -> tuple[Device, ...]:
    """``count`` devices of a catalog type, as its vendor would report them."""
    spec = lookup(accelerator_type)
    return tuple(
        Device(
            accelerator_type=accelerator_type,
            index=first_index + i,
            name=spec.name,
            vendor=spec.vendor,
            memory_gib=spec.memory_gib,
            peak_bf16_tflops=spec.tflops.bf16 or 0.0,
            peak_fp32_tflops=spec.tflops.fp32 or 0.0,
        )
        for i in range(count)
    )


def parse_emulated(text: str) -> tuple[Device, ...]:
    """``TYPE:COUNT[,TYPE:COUNT...]`` as devices (indices count on across types)."""
    devices: list[Device] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        accelerator_type, _, count = item.partition(":")
        if accelerator_type not in catalog() or not count.isdigit() or int(count) < 1:
            raise InvalidSpec(
                f"{EMULATE_ENV} entry {item!r} is not TYPE:COUNT of a catalog type",
                hint=f"e.g. {EMULATE_ENV}=h100-sxm:8 (`shipyard plan catalog` lists the types)",
            )
        devices += emulated_accelerators(accelerator_type, int(count), first_index=len(devices))
    return tuple(devices)
