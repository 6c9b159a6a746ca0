"""The advisor: one workload on every accelerator type, ranked by time, cost and energy.

Without a device count, each type gets the smallest power of two of its devices on which the
workload fits (more devices mostly buy time, not money); with one, every type gets that count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shipyard.errors import InvalidSpec
from shipyard.hardware.catalog import AcceleratorSpec
from shipyard.planner.calibration import CALIBRATION, Calibration
from shipyard.planner.inference import InferencePlan, InferenceWorkload, inference_memory, plan_inference
from shipyard.planner.memory import training_memory
from shipyard.planner.training import TrainingPlan, plan_training
from shipyard.planner.workload import Layout, LayoutRequest, TrainingWorkload, cluster_of

MAX_COUNT = 4096
Span = dict[str, float]
"""``{"low": ..., "high": ...}``."""
RANKINGS = ("time", "cost", "energy")


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    accelerator: str
    count: int
    plan: TrainingPlan | InferencePlan
    time_h: float
    """Training: wall time of the token budget. Inference: hours to generate a million tokens."""
    cost_usd: float | None
    energy_kwh: float
    time_h_range: Span | None = None
    cost_usd_range: Span | None = None
    energy_kwh_range: Span | None = None
    """80 % ranges (training plans: the planner's cross-validated error for the type's evidence)."""
    rank: int | None = None
    """1 is best by the chosen ranking; ``None`` when the workload does not fit. Types whose
    ranges on the ranked figure overlap share a rank: neither is called better."""
    tied: bool = False
    """It shares its rank with another type."""

    @property
    def fits(self) -> bool:
        return self.plan.fits

    def figure(self, name: str) -> float | None:
        return {"time": self.time_h, "cost": self.cost_usd, "energy": self.energy_kwh}[name]

    def range_of(self, name: str) -> Span | None:
        return {"time": self.time_h_range, "cost": self.cost_usd_range, "energy": self.energy_kwh_range}[name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "accelerator": self.accelerator,
            "count": self.count,
            "fits": self.fits,
            "reason": self.plan.not_fitting_reason(),
            "time_h": self.time_h,
            "cost_usd": self.cost_usd,
            "energy_kwh": self.energy_kwh,
            "time_h_range": self.time_h_range,
            "cost_usd_range": self.cost_usd_range,
            "energy_kwh_range": self.energy_kwh_range,
            "tied": self.tied,
            "plan": self.plan.to_dict(),
        }


def compare(
    workload: TrainingWorkload | InferenceWorkload,
    accelerators: Sequence[AcceleratorSpec],
    *,
    count: int | None = None,
    rank_by: str = "cost",
    calibration: Calibration = CALIBRATION,
    fabric: str | None = None,
) -> list[Comparison]:
    """Rows for every accelerator type, fitting ones first in ``rank_by`` order, then the rest; each
    type on its own links, all under one ``fabric`` (``cluster_of``)."""
    if rank_by not in RANKINGS:
        raise InvalidSpec(
            f"--rank-by {rank_by!r} is not one of {', '.join(RANKINGS)}", hint="use time, cost or energy"
        )
    rows = [
        _row(workload, spec, count, calibration, fabric) for spec in accelerators if _supports(workload, spec)
    ]

    def key(row: Comparison) -> tuple[float, ...]:
        value = row.figure(rank_by)
        return (value if value is not None else math.inf, row.time_h)

    fitting = sorted((r for r in rows if r.fits), key=key)
    return _ranked(fitting, rank_by) + sorted(
        (r for r in rows if not r.fits), key=lambda r: r.plan.memory.total_gib
    )


def _ranked(rows: list[Comparison], rank_by: str) -> list[Comparison]:
    """Ranks in order, a row sharing the rank of the first row of its group while its range on
    ``rank_by`` overlaps that row's (standard competition ranking: 1, 1, 3)."""
    ranks: list[int] = []
    leader: Comparison | None = None
    for i, row in enumerate(rows, start=1):
        if leader is None or not _overlap(leader.range_of(rank_by), row.range_of(rank_by)):
            leader = row
            ranks.append(i)
        else:
            ranks.append(ranks[-1])
    return [
        Comparison(**{**_fields(row), "rank": rank, "tied": ranks.count(rank) > 1})
        for row, rank in zip(rows, ranks, strict=True)
    ]


def best_of(rows: Sequence[Comparison], name: str) -> list[Comparison]:
    """The fitting rows best on ``name`` (time, cost, energy) and those tied with the best: their
    80 % ranges overlap, so none is called better (as ``_ranked`` ranks them)."""
    known = [r for r in rows if r.fits and r.figure(name) is not None]
    if not known:
        return []
    best = min(known, key=lambda r: r.figure(name))  # type: ignore[arg-type, return-value]
    return [r for r in known if r is best or _overlap(best.range_of(name), r.range_of(name))]


def _overlap(first: Span | None, second: Span | None) -> bool:
    if first is None or second is None:
        return False
    return first["low"] <= second["high"] and second["low"] <= first["high"]


def price_caveat(rows: Sequence[Comparison]) -> str | None:
    """A warning where the costs compared rest on prices of two kinds: a purchase spread over three
    years leaves out hosting, power and staff that a rental includes, so it is no like-for-like."""
    priced = [r for r in rows if r.cost_usd is not None]
    bought = [r.accelerator for r in priced if r.plan.cluster.accelerator.price_usd_per_h is None]
    if not bought or len(bought) == len(priced):
        return None
    return (
        f"{', '.join(bought)} {'is' if len(bought) == 1 else 'are'} costed at a purchase price over 3 years "
        "(no hosting, power or staff), the others at rental prices: not like for like; give rental "
        "prices in a hardware file (price_usd_per_h) to compare them"
    )


def _fields(row: Comparison) -> dict[str, Any]:
    return {name: getattr(row, name) for name in Comparison.__slots__}


def _supports(workload: TrainingWorkload | InferenceWorkload, spec: AcceleratorSpec) -> bool:
    """fp8 training compares only devices with fp8 units; everything has a 16-bit path."""
    if isinstance(workload, TrainingWorkload) and workload.precision == "fp8":
        return spec.tflops.fp8 is not None
    return spec.bf16_tflops > 0


def _row(
    workload: TrainingWorkload | InferenceWorkload,
    spec: AcceleratorSpec,
    count: int | None,
    calibration: Calibration,
    fabric: str | None = None,
) -> Comparison:
    devices = count or _smallest_fitting_count(workload, spec, calibration)
    cluster = cluster_of(spec, devices, fabric=fabric)
    if isinstance(workload, InferenceWorkload):
        tp = _inference_tp(workload, devices)
        inference = plan_inference(workload, cluster, tp=tp, calibration=calibration)
        return Comparison(
            accelerator=spec.key,
            count=devices,
            plan=inference,
            time_h=1e6 / inference.decode_tokens_per_s / 3600,
            cost_usd=inference.usd_per_million_tokens(),
            energy_kwh=inference.kwh_per_million_tokens(calibration),
        )
    training = plan_training(workload, cluster, calibration=calibration)
    evidence = training.evidence
    energy = training.energy_kwh(calibration)
    return Comparison(
        accelerator=spec.key,
        count=devices,
        plan=training,
        time_h=training.wall_time_h,
        cost_usd=training.cost_usd,
        energy_kwh=energy,
        time_h_range=evidence.spread_of_time(training.wall_time_h),
        cost_usd_range=evidence.spread_of_time(training.cost_usd),
        energy_kwh_range=evidence.spread_of_time(energy),
    )


def _inference_tp(workload: InferenceWorkload, devices: int) -> int:
    tp = devices
    while workload.model.heads % tp:
        tp //= 2
    while devices % tp:
        tp //= 2
    return max(1, tp)


def _smallest_fitting_count(
    workload: TrainingWorkload | InferenceWorkload, spec: AcceleratorSpec, calibration: Calibration
) -> int:
    """The smallest power-of-two count whose least memory-hungry layout fits (cheap: no timing)."""
    count = 1
    while count < MAX_COUNT and not _fits_somehow(workload, spec, count, calibration):
        count *= 2
    return count


def _fits_somehow(
    workload: TrainingWorkload | InferenceWorkload,
    spec: AcceleratorSpec,
    count: int,
    calibration: Calibration,
) -> bool:
    usable = spec.usable_memory_gib
    if isinstance(workload, InferenceWorkload):
        return inference_memory(workload, _inference_tp(workload, count), usable, calibration).fits
    cluster = cluster_of(spec, count)
    tp = 1
    while tp * 2 <= min(count, cluster.devices_per_node) and workload.model.heads % (tp * 2) == 0:
        tp *= 2
    rest = count // tp
    pp = max(p for p in range(1, min(rest, workload.model.layers) + 1) if rest % p == 0)
    dp = rest // pp
    if dp > workload.sequences_per_step:
        return False
    layout = Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        zero=3 if dp > 1 else 0,
        recompute="full",
        micro_batch=1,
        sequence_parallel=tp > 1,
    )
    return training_memory(workload, layout, usable, calibration).fits


__all__ = ["RANKINGS", "Comparison", "LayoutRequest", "compare"]
