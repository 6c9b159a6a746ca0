"""Accelerator catalog (data) and device discovery (vendor queries behind a seam)."""

from shipyard.hardware.catalog import AcceleratorSpec, catalog, lookup, match_accelerator_type
from shipyard.hardware.discovery import Device, VendorQueries, discover

__all__ = [
    "AcceleratorSpec",
    "Device",
    "VendorQueries",
    "catalog",
    "discover",
    "lookup",
    "match_accelerator_type",
]
