"""Inference: weights plus KV cache in memory; prefill bound by compute, decode by memory bandwidth.

Each decode step reads every weight of the device's shard and the KV cache written so far, so its
time is bytes / bandwidth unless the batch is large enough to make the matmuls compute-bound
(Pope et al., "Efficiently Scaling Transformer Inference", 2022).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from shipyard.errors import InvalidSpec
from shipyard.planner.calibration import CALIBRATION, Calibration
from shipyard.planner.memory import GIB, MemoryBreakdown
from shipyard.planner.shapes import ModelShape, positive
from shipyard.planner.workload import Cluster

InferPrecision = Literal["fp16", "bf16", "int8", "int4"]

WEIGHT_BYTES: dict[str, float] = {"fp16": 2, "bf16": 2, "int8": 1 + 2 / 128, "int4": 0.5 + 4 / 128}
"""Quantized weights carry a 16-bit scale (int4: scale and zero point) per group of 128."""
KV_BYTES = 2
"""The KV cache stays 16-bit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InferenceWorkload:
    model: ModelShape
    batch: int = 1
    context: int = 2048
    """Prompt plus generated tokens per sequence."""
    precision: InferPrecision = "fp16"

    def __post_init__(self) -> None:
        for flag, value in (("--batch", self.batch), ("--context", self.context)):
            positive(flag, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class InferencePlan:
    workload: InferenceWorkload
    cluster: Cluster
    tp: int
    memory: MemoryBreakdown
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    """Generated tokens per second over the whole batch."""
    decode_bound: str
    assumptions: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def not_fitting_reason(self) -> str | None:
        if self.fits:
            return None
        return (
            f"needs {self.memory.total_gib:.0f} GiB per device with tp={self.tp}; "
            f"{self.cluster.accelerator.key} has {self.memory.usable_gib:.0f} GiB usable"
        )

    def usd_per_million_tokens(self) -> float | None:
        hourly = self.cluster.accelerator.hourly_usd
        if hourly is None:
            return None
        return hourly * self.cluster.count / (self.decode_tokens_per_s * 3600) * 1e6

    def kwh_per_million_tokens(self, calibration: Calibration = CALIBRATION) -> float:
        watts = self.cluster.accelerator.board_w * calibration.inference_power_fraction * self.cluster.count
        return watts / self.decode_tokens_per_s * 1e6 / 3.6e6

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": "infer",
            "accelerator": self.cluster.accelerator.key,
            "count": self.cluster.count,
            "fits": self.fits,
            "reason": self.not_fitting_reason(),
            "memory_gib_per_device": round(self.memory.total_gib, 3),
            "memory": self.memory.to_dict(),
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "decode_tokens_per_s_per_sequence": self.decode_tokens_per_s / self.workload.batch,
            "decode_bound": self.decode_bound,
            "cost_usd_per_million_tokens": self.usd_per_million_tokens(),
            "energy_kwh_per_million_tokens": self.kwh_per_million_tokens(),
            "price_usd_per_h": self.cluster.accelerator.hourly_usd,
            "price": self.cluster.accelerator.price_dict(),
            # No range: nothing measured to derive one from (the training ranges' errors are not
            # the decode path's); null says so rather than a borrowed width.
            "decode_tokens_per_s_range": None,
            "cost_usd_per_million_tokens_range": None,
            "energy_kwh_per_million_tokens_range": None,
            "evidence": {
                "kind": "extrapolated",
                "regime": "inference",
                "runs": 0,
                "words": INFERENCE_EVIDENCE,
            },
            "parallelism": {"tp": self.tp},
            "model": {
                "params": self.workload.model.params,
                "layers": self.workload.model.layers,
                "hidden": self.workload.model.hidden,
                "heads": self.workload.model.heads,
                "kv_heads": self.workload.model.kv_heads,
                "batch": self.workload.batch,
                "context": self.workload.context,
                "precision": self.workload.precision,
            },
            "assumptions": list(self.assumptions),
        }


INFERENCE_EVIDENCE = (
    "no published inference run in the planner's files: decode from memory bandwidth at an efficiency "
    "read from vLLM, TensorRT-LLM and llama.cpp reports, prefill from the dense peak; no 80% range is "
    "derived, treat the figures as estimates"
)


def inference_memory(
    workload: InferenceWorkload, tp: int, usable_gib: float, calibration: Calibration
) -> MemoryBreakdown:
    m = workload.model
    weights = m.params * WEIGHT_BYTES[workload.precision] / tp
    kv = 2 * m.layers * m.kv_heads * m.head_dim * workload.context * workload.batch * KV_BYTES / tp
    # One layer's prefill intermediates (QKV, MLP up-projection) and the last position's logits.
    working = workload.batch * workload.context * (3 * m.hidden + m.ffn_hidden) * 2 / tp
    working += workload.batch * m.vocab * 4
    return MemoryBreakdown(
        weights_gib=weights / GIB,
        gradients_gib=0.0,
        optimizer_gib=0.0,
        activations_gib=working / GIB,
        kv_cache_gib=kv / GIB,
        buffers_gib=0.0,
        reserve_gib=calibration.runtime_reserve_gib if usable_gib > 0 else 0.0,
        usable_gib=usable_gib,
    )


def plan_inference(
    workload: InferenceWorkload,
    cluster: Cluster,
    *,
    tp: int | None = None,
    calibration: Calibration = CALIBRATION,
) -> InferencePlan:
    """Memory and speed with the model split over ``tp`` devices (default: all ``count`` of them)."""
    spec = cluster.accelerator
    m = workload.model
    tp = tp or cluster.count
    if tp > cluster.count:
        raise InvalidSpec(
            f"--tp {tp} is larger than --count {cluster.count}", hint=f"use --tp {cluster.count} or less"
        )
    if cluster.count % tp:
        raise InvalidSpec(
            f"--tp {tp} does not divide --count {cluster.count}", hint="replicas = count / tp must be whole"
        )
    if m.heads % tp:
        raise InvalidSpec(
            f"--tp {tp} does not divide --heads {m.heads}", hint="pick a divisor of the head count"
        )
    replicas = cluster.count // tp
    memory = inference_memory(workload, tp, spec.usable_memory_gib, calibration)

    compute_precision = "int8" if workload.precision == "int8" and spec.tflops.int8 else "bf16"
    peak = (spec.peak_tflops(compute_precision) or spec.bf16_tflops) * 1e12  # type: ignore[arg-type]
    peak *= calibration.power_clock(spec)
    efficiency = calibration.gemm(spec.architecture)
    bandwidth = spec.memory_bandwidth_gb_per_s * 1e9 * calibration.bandwidth(spec.architecture)
    link = cluster.link_gb_per_s if tp <= cluster.devices_per_node else cluster.network_gbit_per_s / 8
    link_bw = max(link, 1e-9) * 1e9 * calibration.link_efficiency
    latency = calibration.collective_latency_s

    def tp_traffic(tokens: int) -> float:
        if tp == 1:
            return 0.0
        message = tokens * m.hidden * 2
        return m.layers * 2 * (2 * (tp - 1) / tp * message / link_bw + latency)

    prompt_tokens = workload.batch * workload.context
    attention_flops = 4 * m.layers * m.hidden * workload.context / 2
    prefill_flops = prompt_tokens * (2 * m.params + attention_flops) / tp
    prefill_s = prefill_flops / (peak * efficiency) + tp_traffic(prompt_tokens)

    weights_bytes = memory.weights_gib * GIB
    kv_bytes = memory.kv_cache_gib * GIB / 2  # on average half the context is cached
    memory_s = (weights_bytes + kv_bytes) / bandwidth
    compute_s = (
        workload.batch
        * (2 * m.params + 4 * m.layers * m.hidden * workload.context / 2)
        / tp
        / (peak * efficiency)
    )
    decode_s = max(memory_s, compute_s) + tp_traffic(workload.batch)
    bound = "memory bandwidth" if memory_s >= compute_s else "compute"

    assumptions = (
        f"evidence: {INFERENCE_EVIDENCE}",
        f"decode reads all weights and half the context's KV cache per step at "
        f"{calibration.bandwidth(spec.architecture):.0%} of {spec.memory_bandwidth_gb_per_s:g} GB/s",
        f"prefill at {efficiency:.0%} of the {compute_precision} dense peak",
        f"weights {WEIGHT_BYTES[workload.precision]:.3g} bytes per parameter ({workload.precision}); "
        "KV cache 16-bit",
        f"{replicas} replica(s) of tp={tp}; tokens/s are summed over replicas",
        f"memory: {spec.usable_memory_fraction:.0%} of {spec.memory_gib:g} GiB usable",
    )
    return InferencePlan(
        workload=workload,
        cluster=cluster,
        tp=tp,
        memory=memory,
        prefill_tokens_per_s=replicas * prompt_tokens / prefill_s,
        decode_tokens_per_s=replicas * workload.batch / decode_s,
        decode_bound=bound,
        assumptions=assumptions,
    )
