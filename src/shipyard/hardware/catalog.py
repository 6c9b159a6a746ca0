"""The accelerator catalog: one row per accelerator type, shipped as data (``catalog.yaml``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

from shipyard.errors import InvalidSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceleratorSpec:
    key: str
    vendor: str
    name: str
    match: tuple[str, ...]
    bf16_tflops: float
    """Dense peak for bf16/fp16 matrix math, per device."""
    fp32_tflops: float
    memory_gib: float
    source: str


@functools.cache
def catalog() -> dict[str, AcceleratorSpec]:
    """Every known accelerator type by key, in the file's (matching) order."""
    text = resources.files("shipyard.hardware").joinpath("catalog.yaml").read_text()
    rows = yaml.safe_load(text)
    return {
        row["key"]: AcceleratorSpec(
            key=row["key"],
            vendor=row["vendor"],
            name=row["name"],
            match=tuple(row["match"]),
            bf16_tflops=float(row["bf16_tflops"]),
            fp32_tflops=float(row["fp32_tflops"]),
            memory_gib=float(row["memory_gib"]),
            source=row["source"],
        )
        for row in rows
    }


def lookup(key: str) -> AcceleratorSpec:
    """The catalog row for ``key``; an unknown key lists the valid ones."""
    try:
        return catalog()[key]
    except KeyError:
        known = ", ".join(catalog())
        raise InvalidSpec(f"unknown accelerator type {key!r}", hint=f"use one of: {known}") from None


def match_accelerator_type(device_name: str, memory_gib: float | None = None) -> str | None:
    """Map a name reported by a vendor query (``NVIDIA H100 80GB HBM3``) to a catalog key.

    Variants that differ only by memory (A100 40/80 GB, V100 16/32 GB) are told apart by name when
    the name says so and otherwise by the reported memory.
    """
    name = device_name.lower()
    for spec in catalog().values():
        if any(pattern in name for pattern in spec.match):
            return _by_memory(spec, memory_gib)
    return None


def _by_memory(spec: AcceleratorSpec, memory_gib: float | None) -> str:
    family = {"a100-80gb": "a100-40gb", "v100-32gb": "v100-16gb"}
    smaller = family.get(spec.key)
    # Reported memory is a little under the nominal size (ECC, driver reserve).
    if smaller is not None and memory_gib is not None and memory_gib <= catalog()[smaller].memory_gib * 1.05:
        return smaller
    return spec.key
