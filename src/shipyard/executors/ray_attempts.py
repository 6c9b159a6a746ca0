"""The pure pieces of a Ray attempt, on the agent's side: the placement a lease on advertised nodes
becomes, what each node's bundle asks of Ray, and the newest checkpoint every node has stored."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shipyard.executors.base import Placement, Request, StoredCheckpoint
from shipyard.executors.cluster_nodes import TYPE_RESOURCE, Advertisement
from shipyard.executors.local import TORCH_DEVICE


def stored_whole(reports: list[dict[str, Any]], have: str | None) -> StoredCheckpoint | None:
    """The newest checkpoint every node stored its part of, newer than ``have``: its files, the
    description (``checkpoint.json``) of the node that wrote it first."""
    common = set.intersection(*(set(report["stored"]) for report in reports))
    newest = max(common, default=None)
    if newest is None or (have is not None and newest <= have):
        return None
    parts = [report["stored"][newest] for report in reports]
    files: dict[str, dict[str, Any]] = {}
    for part in parts:
        for record in part["files"]:
            files.setdefault(record["path"], record)
    description = next((part["description"] for part in parts if part["description"]), None)
    return StoredCheckpoint(newest, tuple(files.values()), description)


def placement_on(ads: Sequence[Advertisement], accelerator_type: str, request: Request) -> Placement:
    first = ads[0].inventory()
    if accelerator_type == "cpu":
        cores = first.cpu.cores
        threads = request.threads_per_process(cores)
        spec = first.cpu
        bf16, fp32 = spec.peak_bf16_tflops / cores * threads, spec.peak_fp32_tflops / cores * threads
        torch_device = "cpu"
    else:
        spec = next(d for d in first.accelerators if d.accelerator_type == accelerator_type)
        threads = request.cpus_per_device or max(1, first.cpu.cores // max(1, len(first.accelerators)))
        bf16, fp32 = spec.peak_bf16_tflops, spec.peak_fp32_tflops
        torch_device = "cpu" if ads[0].emulated else TORCH_DEVICE.get(spec.vendor, "cuda")
    return Placement(
        node=ads[0].node,
        peers=tuple(ad.node for ad in ads[1:]),
        accelerator_type=accelerator_type,
        torch_device=torch_device,  # type: ignore[arg-type]
        device_ids=(),  # Ray picks the devices of each bundle and sets their visibility
        core_ids=(),
        threads_per_process=threads,
        world_size=request.devices * len(ads),
        peak_tflops_bf16=bf16,
        peak_tflops_fp32=fp32,
    )


def bundle_units(placement: Placement, per_node: int) -> dict[str, float]:
    units = per_node * placement.threads_per_process if placement.accelerator_type == "cpu" else per_node
    return {f"{TYPE_RESOURCE}{placement.accelerator_type}": float(units)}


def ray_gpus(ad: Advertisement, per_node: int) -> dict[str, float]:
    """Ray's own GPUs for a node that has real ones (Ray then sets their visibility)."""
    return {"GPU": float(per_node)} if ad.gpus() else {}


def devices_held(group_table: dict[str, Any]) -> dict[tuple[str, str], float]:
    """What a placement group holds of each node's device resources, by (Ray node, resource), from
    Ray's record of the group."""
    held: dict[tuple[str, str], float] = {}
    to_node = group_table.get("bundles_to_node_id") or {}
    for index, bundle in (group_table.get("bundles") or {}).items():
        for key, amount in bundle.items():
            if to_node.get(index) and key.startswith(TYPE_RESOURCE):
                held[to_node[index], key] = held.get((to_node[index], key), 0.0) + amount
    return held
