"""Training time: FLOPs, achievable compute, communication, pipeline bubbles, and the layout search.

Model FLOPs per token are 6N + 12*L*h*s (Kaplan et al. 2020; PaLM appendix B), 4N + 12*L*h*s for
LoRA (no weight gradients for the frozen base). Recomputation adds hardware FLOPs but no model
FLOPs: a full recompute repeats the forward (2N + 4*L*h*s), a selective one the attention scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from shipyard.errors import InvalidSpec
from shipyard.planner.assumptions import training_assumptions
from shipyard.planner.calibration import CALIBRATION, Calibration
from shipyard.planner.evidence import Evidence, evidence_for
from shipyard.planner.host import (
    OPS_PER_BLOCK,
    OPS_PER_BLOCK_OPTIMIZER,
    OPS_PER_MICRO_BATCH,
    OPS_PER_QUEUED_BLOCK,
    host_op_us,
)
from shipyard.planner.layouts import candidate_layouts, check_request
from shipyard.planner.memory import (
    GRADIENT_BYTES,
    WEIGHT_BYTES,
    MemoryBreakdown,
    trainable_parameters,
    training_memory,
)
from shipyard.planner.run import NO_OVERHEADS, RunOverheads, run_overheads
from shipyard.planner.workload import Cluster, Layout, LayoutRequest, TrainingWorkload

Measure = Literal["steady", "run"]
MEASURES: tuple[Measure, ...] = ("steady", "run")

ACTIVATION_BYTES_ON_WIRE = 2
OPTIMIZER_BYTES_TOUCHED = 32
"""Per parameter per Adam step: read weight, gradient, master, m, v; write four of them back."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTime:
    compute_s: float
    tensor_parallel_s: float
    pipeline_bubble_s: float
    data_parallel_s: float
    """Only what is not hidden behind the backward pass."""
    optimizer_s: float
    host_s: float = 0.0
    """The host's time to dispatch the step's operators."""
    host_overlaps: bool = False
    """A GPU's host queues kernels while the device runs those queued before, so the step takes the
    longer of the two; a CPU computes what it dispatches, so it pays both in series."""

    @property
    def device_s(self) -> float:
        return (
            self.compute_s
            + self.tensor_parallel_s
            + self.pipeline_bubble_s
            + self.data_parallel_s
            + self.optimizer_s
        )

    @property
    def total_s(self) -> float:
        if self.host_overlaps:
            return max(self.device_s, self.host_s)
        return self.device_s + self.host_s


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingPlan:
    workload: TrainingWorkload
    cluster: Cluster
    layout: Layout
    memory: MemoryBreakdown
    step: StepTime
    model_flops_per_token: float
    hardware_flops_per_token: float
    searched: bool
    """True when the search chose the layout (the user pinned none or only part of it)."""
    overheads: RunOverheads = NO_OVERHEADS
    """What a whole run spends beside its steps (none for a steady-state plan)."""
    measure: Measure = "run"
    """What the wall time, GPU-hours and cost predict: ``run``, a whole run with its expected
    interruptions; ``steady``, the training steps alone (what a benchmark measures)."""
    assumptions: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return self.memory.fits

    @property
    def goodput(self) -> float:
        """Share of wall time spent on training steps: 1 for a steady-state plan."""
        return self.overheads.goodput

    @property
    def tokens_per_s(self) -> float:
        return self.workload.global_batch_tokens / self.step.total_s

    @property
    def tokens_per_s_per_device(self) -> float:
        return self.tokens_per_s / self.cluster.count

    @property
    def tflops_per_device(self) -> float:
        """Model FLOPs (recomputation not counted), as MFU uses."""
        return self.tokens_per_s_per_device * self.model_flops_per_token / 1e12

    @property
    def peak_tflops(self) -> float:
        return _peak(self.cluster, self.workload.precision)

    @property
    def mfu(self) -> float:
        return self.tflops_per_device / self.peak_tflops

    @property
    def hfu(self) -> float:
        return self.tokens_per_s_per_device * self.hardware_flops_per_token / 1e12 / self.peak_tflops

    @property
    def wall_time_h(self) -> float:
        return self.workload.budget_tokens / self.tokens_per_s / 3600 / self.goodput

    @property
    def gpu_hours(self) -> float:
        return self.wall_time_h * self.cluster.count

    @property
    def evidence(self) -> Evidence:
        """The published runs this throughput rests on, or that it is extrapolated from peak."""
        return evidence_for(self.cluster.accelerator, self.workload.precision)

    @property
    def cost_usd(self) -> float | None:
        hourly = self.cluster.accelerator.hourly_usd
        return None if hourly is None else self.gpu_hours * hourly

    def energy_kwh(self, calibration: Calibration = CALIBRATION) -> float:
        watts = self.cluster.accelerator.board_w * calibration.training_power_fraction
        return self.gpu_hours * watts / 1000

    def not_fitting_reason(self) -> str | None:
        if self.fits:
            return None
        m = self.memory
        return (
            f"needs {m.total_gib:.0f} GiB per device with tp={self.layout.tp}, pp={self.layout.pp}, "
            f"zero={self.layout.zero}, recompute={self.layout.recompute}; "
            f"{self.cluster.accelerator.key} has {m.usable_gib:.0f} GiB"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload.kind,
            "accelerator": self.cluster.accelerator.key,
            "count": self.cluster.count,
            "fits": self.fits,
            "reason": self.not_fitting_reason(),
            "memory_gib_per_device": round(self.memory.total_gib, 3),
            "memory": self.memory.to_dict(),
            "step_time_s": self.step.total_s,
            "step": {
                "compute_s": self.step.compute_s,
                "tensor_parallel_s": self.step.tensor_parallel_s,
                "pipeline_bubble_s": self.step.pipeline_bubble_s,
                "data_parallel_exposed_s": self.step.data_parallel_s,
                "optimizer_s": self.step.optimizer_s,
                "host_s": self.step.host_s,
                "host_overlaps": self.step.host_overlaps,
            },
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_per_device": self.tokens_per_s_per_device,
            "tokens_per_s_per_device_range": self.evidence.spread(self.tokens_per_s_per_device),
            "tflops_per_device": self.tflops_per_device,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "tokens": self.workload.budget_tokens,
            "tokens_assumed": self.workload.tokens is None,
            "wall_time_h": self.wall_time_h,
            "wall_time_h_range": self.evidence.spread_of_time(self.wall_time_h),
            "goodput": self.goodput,
            "run_overheads": self.overheads.to_dict() if self.measure == "run" else None,
            "measure": self.measure,
            "gpu_hours": self.gpu_hours,
            "cost_usd": self.cost_usd,
            "cost_usd_range": self.evidence.spread_of_time(self.cost_usd),
            "price_usd_per_h": self.cluster.accelerator.hourly_usd,
            "price": self.cluster.accelerator.price_dict(),
            "evidence": self.evidence.to_dict(),
            "energy_kwh": self.energy_kwh(),
            "energy_kwh_range": self.evidence.spread_of_time(self.energy_kwh()),
            "parallelism": {
                "tp": self.layout.tp,
                "pp": self.layout.pp,
                "dp": self.layout.dp,
                "zero": self.layout.zero,
                "recompute": self.layout.recompute,
                "recompute_every": self.layout.recompute_every,
                "micro_batch": self.layout.micro_batch,
                "sequence_parallel": self.layout.sequence_parallel,
                "interleave": self.layout.interleave,
                "searched": self.searched,
            },
            "model": {
                "params": self.workload.model.params,
                "layers": self.workload.model.layers,
                "hidden": self.workload.model.hidden,
                "heads": self.workload.model.heads,
                "kv_heads": self.workload.model.kv_heads,
                "vocab": self.workload.model.vocab,
                "seq_len": self.workload.seq_len,
                "global_batch_tokens": self.workload.global_batch_tokens,
                "precision": self.workload.precision,
            },
            "links": {
                "devices_per_node": self.cluster.devices_per_node,
                "interconnect": self.cluster.link,
                "interconnect_gb_per_s": self.cluster.link_gb_per_s,
                "network": self.cluster.network,
                "network_gbit_per_s": self.cluster.network_gbit_per_s,
                "oversubscription": self.cluster.oversubscription,
                "leaf_nodes": self.cluster.leaf_nodes,
                "fabric_gbit_per_s": self.cluster.fabric_gbit_per_s,
            },
            "assumptions": list(self.assumptions),
        }


def _peak(cluster: Cluster, precision: str) -> float:
    spec = cluster.accelerator
    if precision == "fp32":
        return spec.fp32_tflops or spec.bf16_tflops
    if precision == "fp8":
        return spec.tflops.fp8 or 0.0
    if precision == "bf16" and spec.tflops.bf16 is None:
        return spec.tflops.fp16 or 0.0
    return spec.peak_tflops(precision) or 0.0  # type: ignore[arg-type]


def flops_per_token(
    workload: TrainingWorkload, recompute: str, recompute_every: int = 1
) -> tuple[float, float, float]:
    """(model FLOPs, hardware FLOPs in the dense layers, hardware FLOPs in attention scores)."""
    m = workload.model
    dense_factor = 4 if workload.kind in ("lora", "qlora") else 6
    attention: float = 12 * m.layers * m.hidden * workload.seq_len
    dense = (dense_factor + (2 if workload.reference_forward else 0)) * m.params
    model = dense + attention
    if recompute == "full":
        share = -(-m.layers // recompute_every) / m.layers  # the blocks whose forward runs twice
        dense += 2 * m.params * share
        attention += 4 * m.layers * m.hidden * workload.seq_len * share
    elif recompute == "selective":
        attention += 4 * m.layers * m.hidden * workload.seq_len
    return model, dense, attention


def step_time(
    workload: TrainingWorkload, cluster: Cluster, layout: Layout, calibration: Calibration
) -> StepTime:
    m = workload.model
    spec = cluster.accelerator
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    micro_tokens = layout.micro_batch * workload.seq_len
    n_micro = max(1.0, workload.global_batch_tokens / (dp * micro_tokens))
    tokens_per_device = workload.global_batch_tokens / cluster.count

    _, dense, attention = flops_per_token(workload, layout.recompute, layout.recompute_every)
    clock = calibration.power_clock(spec)
    peak_16 = _peak(cluster, "bf16" if workload.precision != "fp32" else "fp32") * 1e12 * clock
    peak_dense = _peak(cluster, workload.precision) * 1e12 * clock
    memory_bw = spec.memory_bandwidth_gb_per_s * 1e9 * calibration.bandwidth(spec.architecture)
    # Norms, activations functions and residual adds move O(h) bytes per token where the GEMMs do
    # O(h^2) FLOPs: their share grows with the device's FLOPs per byte and shrinks with h/tp.
    width_knee = calibration.elementwise_bytes_per_hidden * peak_16 / memory_bw
    gemm = calibration.compute_efficiency(spec.key, spec.architecture, spec.gemm_efficiency)
    gemm *= 1 / (1 + width_knee * tp / m.hidden)
    if spec.gemm_efficiency is None:
        # A GPU fills its multiprocessors only with enough tokens; a measured figure (a CPU's,
        # timed at a few hundred tokens) already holds what a small micro-batch costs.
        gemm *= 1 / (1 + calibration.micro_batch_tokens_half / micro_tokens)
    dense_efficiency = gemm * (calibration.fp8_gemm_ratio if workload.precision == "fp8" else 1.0)
    if workload.flash_attention:
        attention_s = attention / (peak_16 * gemm * calibration.flash_attention_ratio)
    else:
        # Scores are written, soft-maxed, dropped out and read back through memory: a*s^2 elements
        # per sequence and layer, forward and backward (again when recomputed).
        passes = 4 / 3 if layout.recompute != "none" else 1.0
        scores_per_token = m.heads / tp * workload.seq_len * m.layers / pp
        traffic = scores_per_token * calibration.score_bytes_per_element * passes / memory_bw
        attention_s = attention / (peak_16 * gemm) + traffic * tp * pp
    gemm_s = tokens_per_device * dense / (peak_dense * dense_efficiency)
    compute = gemm_s + tokens_per_device * attention_s
    if workload.kind == "qlora":
        compute *= calibration.qlora_slowdown

    intra_bw = cluster.link_gb_per_s * 1e9 * calibration.link_efficiency
    inter_bw = cluster.fabric_gbit_per_s / 8 * 1e9 * calibration.network_efficiency
    latency = calibration.collective_latency_s

    tensor_parallel = 0.0
    if tp > 1:
        bw = intra_bw if tp <= cluster.devices_per_node and intra_bw > 0 else inter_bw
        message = micro_tokens * m.hidden * ACTIVATION_BYTES_ON_WIRE
        all_reduce = 2 * (tp - 1) / tp * message / bw + latency
        # Two all-reduces forward and two backward per layer, and two more in each recomputed forward.
        recomputed = -(-m.layers // layout.recompute_every) / m.layers if layout.recompute == "full" else 0
        per_layer = 4 + 2 * recomputed
        tensor_parallel = n_micro * (m.layers / pp) * per_layer * all_reduce
        if layout.sequence_parallel:
            hidden = calibration.tp_overlap.get(spec.architecture, 0.0) * tensor_parallel
            tensor_parallel -= min(hidden, gemm_s)

    bubble = (compute + tensor_parallel) * (pp - 1) / (layout.interleave * n_micro)
    if pp > 1:
        # Activations forward and their gradients backward cross each stage boundary; stages of one
        # replica sit on different nodes once tp * pp exceeds a node.
        bw = inter_bw if tp * pp > cluster.devices_per_node or intra_bw == 0 else intra_bw
        send = micro_tokens * m.hidden * ACTIVATION_BYTES_ON_WIRE / tp / bw + latency
        # Interleaving multiplies the boundaries each micro-batch crosses.
        sends = (n_micro + pp - 1) * layout.interleave
        bubble += 2 * send * sends * calibration.pipeline_send_exposed

    bw = inter_bw if cluster.count > cluster.devices_per_node or intra_bw == 0 else intra_bw
    data_parallel = _data_parallel_s(workload, layout, calibration, compute, n_micro, bw) if dp > 1 else 0.0
    optimizer_shard = trainable_parameters(workload) / (tp * pp * (dp if layout.zero >= 1 else 1))
    optimizer = optimizer_shard * OPTIMIZER_BYTES_TOUCHED / memory_bw
    blocks = m.layers / pp
    host_computes = spec.architecture == "cpu"
    op_s = host_op_us(spec, calibration) * 1e-6
    if host_computes:
        host_ops = n_micro * (blocks * OPS_PER_BLOCK + OPS_PER_MICRO_BATCH) + blocks * OPS_PER_BLOCK_OPTIMIZER
        # The cluster's own factor (clocks, contention) slows a CPU's dispatch as much as its math.
        host_s = host_ops * op_s / calibration.device_efficiency.get(spec.key, 1.0)
    else:
        host_s = n_micro * blocks * OPS_PER_QUEUED_BLOCK * op_s
    return StepTime(
        compute_s=compute,
        tensor_parallel_s=tensor_parallel,
        pipeline_bubble_s=bubble,
        data_parallel_s=data_parallel,
        optimizer_s=optimizer,
        host_s=host_s,
        host_overlaps=not host_computes,
    )


def _data_parallel_s(
    workload: TrainingWorkload,
    layout: Layout,
    calibration: Calibration,
    compute: float,
    n_micro: float,
    bandwidth: float,
) -> float:
    """The part of the data-parallel exchange that compute does not hide, per step."""
    shard_params = trainable_parameters(workload) / (layout.tp * layout.pp)
    ring = (layout.dp - 1) / layout.dp
    latency = calibration.collective_latency_s
    if layout.zero >= 3:
        # All-gather weights for forward and backward, reduce-scatter gradients: every micro-batch.
        traffic = 3 * ring * shard_params * WEIGHT_BYTES[workload.precision] / bandwidth + 3 * latency
        return n_micro * max(0.0, traffic - calibration.dp_overlap * compute / n_micro)
    traffic = 2 * ring * shard_params * GRADIENT_BYTES[workload.precision] / bandwidth + 2 * latency
    # Gradients are reduced bucket by bucket as the backward of the step's last micro-batches frees
    # them, and (ZeRO-1/2) the weights gathered again under the next step's first forwards
    # (Megatron's distributed optimizer, Apex's DistributedFusedAdam: overlap_grad_sync and
    # overlap_param_sync). Without a pipeline that is one micro-batch; with one, each device's
    # cool-down and warm-up span several, while the other stages finish and start theirs.
    per_micro = compute / n_micro * _overlapped_micro_batches(layout, n_micro)
    window = per_micro if layout.zero in (1, 2) else per_micro * 2 / 3
    return max(0.0, traffic - calibration.dp_overlap * window)


def _overlapped_micro_batches(layout: Layout, n_micro: float) -> float:
    """Micro-batches of one device's step that run while its gradients can already be reduced
    (cool-down) or its weights gathered (warm-up): in an interleaved 1F1B schedule of ``pp``
    stages and ``v`` chunks a device's warm-up is 2(pp - 1) + (v - 1)pp chunk passes (Narayanan
    et al., SC21), v of them a micro-batch."""
    if layout.pp == 1:
        return 1.0
    v = layout.interleave
    return min(n_micro, (2 * (layout.pp - 1) + (v - 1) * layout.pp) / v)


def plan_training(
    workload: TrainingWorkload,
    cluster: Cluster,
    request: LayoutRequest | None = None,
    calibration: Calibration = CALIBRATION,
    measure: Measure = "run",
) -> TrainingPlan:
    """The fastest layout that fits (or the one the user pinned), with its memory, time and cost
    (of a whole run, or of its steady state: ``measure``).

    When nothing fits, the plan with the least memory per device comes back with ``fits`` false.
    """
    request = request or LayoutRequest()
    check_request(workload, cluster, request)
    if _peak(cluster, workload.precision) <= 0:
        raise InvalidSpec(
            f"{cluster.accelerator.key} has no {workload.precision} units",
            hint="pick another --precision (V100 trains in fp16, Apple GPUs in fp16/fp32)",
        )
    usable = cluster.accelerator.usable_memory_gib
    best: tuple[float, Layout, MemoryBreakdown, StepTime] | None = None
    smallest: tuple[float, Layout, MemoryBreakdown] | None = None
    # Recomputing never beats keeping everything where that fits, and keeping more of a layout
    # that did not fit cannot fit: such candidates are skipped (they come after, in that order).
    fits_whole: set[tuple[int, ...]] = set()
    too_big: set[tuple[int, ...]] = set()
    for layout in candidate_layouts(workload, cluster, request):
        base = (layout.tp, layout.pp, layout.zero, layout.micro_batch, layout.interleave)
        if layout.recompute == "full" and (base in fits_whole or base in too_big):
            continue
        memory = training_memory(workload, layout, usable, calibration, cluster.accelerator.key)
        if not memory.fits:
            if layout.recompute == "full":
                too_big.add(base)
            if smallest is None or memory.total_gib < smallest[0]:
                smallest = (memory.total_gib, layout, memory)
            continue
        if layout.recompute == "none":
            fits_whole.add(base)
        step = step_time(workload, cluster, layout, calibration)
        if best is None or step.total_s < best[0]:
            best = (step.total_s, layout, memory, step)
    if best is not None:
        _, layout, memory, step = best
    elif smallest is not None:
        _, layout, memory = smallest
        step = step_time(workload, cluster, layout, calibration)
    else:
        raise InvalidSpec(
            f"no parallel layout splits {workload.model.layers} layers and {workload.model.heads} heads "
            f"over {cluster.count} devices with the values given",
            hint="make --tp divide --heads and --count, and --pp divide --count/--tp",
        )
    model_flops, dense, attention = flops_per_token(workload, layout.recompute, layout.recompute_every)
    # An evaluation batch runs the forward alone: 2N + 4*L*h*s of the step's hardware FLOPs.
    m = workload.model
    forward_share = (2 * m.params + 4 * m.layers * m.hidden * workload.seq_len) / (dense + attention)
    return TrainingPlan(
        workload=workload,
        cluster=cluster,
        layout=layout,
        memory=memory,
        step=step,
        model_flops_per_token=model_flops,
        hardware_flops_per_token=dense + attention,
        searched=not request.pinned,
        overheads=run_overheads(workload, cluster.count, forward_share, calibration)
        if measure == "run"
        else NO_OVERHEADS,
        measure=measure,
        assumptions=training_assumptions(workload, cluster, calibration),
    )
