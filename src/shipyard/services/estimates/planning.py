"""Planner use cases: resolve the catalog (built-in, this host's CPU, the user's hardware file),
then call the pure planner. Imports nothing of the database layer, so `shipyard plan` is quick."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shipyard.errors import InvalidSpec
from shipyard.hardware.catalog import AcceleratorSpec, Catalog, catalog, load_catalog, unknown_key_hint
from shipyard.hardware.discovery import cpu_device, query_cpu
from shipyard.planner.advisor import Comparison, compare, price_caveat
from shipyard.planner.inference import InferencePlan, InferenceWorkload, plan_inference
from shipyard.planner.shapes import model_shape
from shipyard.planner.training import Measure, TrainingPlan, plan_training
from shipyard.planner.workload import Cluster, LayoutRequest, TrainingWorkload, cluster_of
from shipyard.settings import Settings

HARDWARE_FILE = "hardware.yaml"


@dataclass(frozen=True, slots=True, kw_only=True)
class Links:
    interconnect: str | None = None
    network: str | None = None
    devices_per_node: int | None = None
    fabric: str | None = None


def hardware_catalog(settings: Settings, hardware_file: Path | None = None) -> dict[str, AcceleratorSpec]:
    """The built-in catalog with ``cpu`` measured on this host, overridden by the user's file:
    ``hardware_file`` when given, else ``$SHIPYARD_HOME/hardware.yaml`` when it exists."""
    if hardware_file is None:
        default = settings.home / HARDWARE_FILE
        hardware_file = default if default.is_file() else None
    return load_catalog(hardware_file, base=dict(_with_this_host()))


@functools.cache
def _with_this_host() -> dict[str, AcceleratorSpec]:
    """Measured once per process: the host does not change under it (every submission asks)."""
    base = dict(catalog())
    host = cpu_device(query_cpu())
    base["cpu"] = base["cpu"].model_copy(
        update={
            "name": f"{host.name} ({host.cores} cores)",
            "tflops": base["cpu"].tflops.model_copy(
                update={
                    "fp32": host.peak_fp32_tflops,
                    "bf16": host.peak_bf16_tflops,
                    "fp16": host.peak_bf16_tflops,
                }
            ),
            "memory_gib": host.memory_gib,
            "source": "this host: cores x clock x vector width; memory from the OS; bandwidth and TDP are "
            "the catalog's reference server",
        }
    )
    return base


def accelerator(known: Catalog, key: str) -> AcceleratorSpec:
    try:
        return known[key]
    except KeyError:
        raise InvalidSpec(
            f"--accelerator: unknown accelerator type {key!r}", hint=unknown_key_hint(key, known)
        ) from None


def _cluster(known: Catalog, key: str, count: int, links: Links) -> Cluster:
    return cluster_of(
        accelerator(known, key),
        count,
        interconnect=links.interconnect,
        network=links.network,
        devices_per_node=links.devices_per_node,
        fabric=links.fabric,
    )


def train(
    known: Catalog,
    workload: TrainingWorkload,
    key: str,
    count: int,
    request: LayoutRequest,
    links: Links,
    measure: Measure = "run",
) -> TrainingPlan:
    return plan_training(workload, _cluster(known, key, count, links), request, measure=measure)


def infer(
    known: Catalog, workload: InferenceWorkload, key: str, count: int, tp: int | None, links: Links
) -> InferencePlan:
    return plan_inference(workload, _cluster(known, key, count, links), tp=tp)


def compare_accelerators(
    known: Catalog,
    workload: TrainingWorkload | InferenceWorkload,
    keys: Sequence[str] | None,
    count: int | None,
    rank_by: str,
    *,
    fabric: str | None = None,
) -> list[Comparison]:
    specs = [accelerator(known, key) for key in keys] if keys else list(known.values())
    return compare(workload, specs, count=count, rank_by=rank_by, fabric=fabric)


@dataclass(frozen=True, slots=True, kw_only=True)
class Advice:
    """One question put to the advisor, as the dashboard and the API ask it."""

    params_b: float
    tokens_b: float
    workload: str
    rank_by: str
    devices: int
    """Devices of each type; 0: the fewest that hold the model."""


def advice(settings: Settings, asked: Advice) -> tuple[list[dict[str, Any]], str | None]:
    """Every type planned for ``asked`` (a tenth of a second's work) and the caveat on their prices,
    kept for the next asker until ``hardware.yaml`` changes."""
    hardware = settings.home / HARDWARE_FILE
    changed = hardware.stat().st_mtime_ns if hardware.is_file() else 0
    return _advice(settings, changed, asked)


@functools.lru_cache(maxsize=64)
def _advice(
    settings: Settings, _hardware_changed: int, asked: Advice
) -> tuple[list[dict[str, Any]], str | None]:
    work = TrainingWorkload(
        model=model_shape(asked.params_b * 1e9),
        kind=asked.workload,  # type: ignore[arg-type]
        seq_len=2048,
        global_batch_tokens=2**22,
        tokens=asked.tokens_b * 1e9,
        precision="bf16",
        optimizer="adamw",
        lora_rank=16,
        flash_attention=True,
    )
    compared = compare_accelerators(
        hardware_catalog(settings), work, None, asked.devices or None, asked.rank_by
    )
    return [row.to_dict() for row in compared], price_caveat(compared)
