"""What a training plan assumes, in words a reader can check: the FLOPs formula, the efficiencies,
links, overlaps, host, memory, power, interruptions and price each figure rests on."""

from __future__ import annotations

from shipyard.hardware.catalog import AcceleratorSpec
from shipyard.planner.calibration import Calibration
from shipyard.planner.evidence import evidence_for
from shipyard.planner.host import OPS_PER_QUEUED_BLOCK, host_op_us
from shipyard.planner.workload import Cluster, TrainingWorkload


def _cluster_factor(accelerator: str, calibration: Calibration) -> str:
    factor = calibration.device_efficiency.get(accelerator)
    return "" if factor is None else f", x{factor:.2f} as this cluster measured {accelerator}"


def _gemm_note(spec: AcceleratorSpec, calibration: Calibration) -> str:
    factor = _cluster_factor(spec.key, calibration)
    if spec.gemm_efficiency is not None:  # a CPU's, as the host's probe measured it
        return f"GEMM efficiency measured on this {spec.key}: {spec.gemm_efficiency:.0%} of peak{factor}"
    return (
        f"large-GEMM efficiency on {spec.architecture}: {calibration.gemm(spec.architecture):.0%} of dense "
        f"peak{factor}; lower for narrow layers on devices with many FLOPs per byte of memory bandwidth, "
        "and for small micro-batches"
    )


def _host_note(spec: AcceleratorSpec, calibration: Calibration) -> str:
    if spec.architecture == "cpu":
        if not spec.op_overhead_us:
            return "operator dispatch not counted: this CPU's cost per operation was not measured"
        return f"the host dispatches each operator in {spec.op_overhead_us:.3g} us, in series with the math"
    measured = "as measured" if spec.op_overhead_us else "a reference Xeon's"
    op_us = host_op_us(spec, calibration)
    return (
        f"the host queues a block's kernels in {OPS_PER_QUEUED_BLOCK * op_us / 1000:.2g} ms a micro-batch "
        f"({measured} {op_us:.3g} us an operation); a step takes the longer of host and device"
    )


def training_assumptions(
    workload: TrainingWorkload, cluster: Cluster, calibration: Calibration
) -> tuple[str, ...]:
    spec = cluster.accelerator
    m = workload.model
    evidence = evidence_for(spec, workload.precision)
    notes = [
        f"evidence: {evidence.words}; {evidence.range_words}",
        f"model FLOPs per token = {'4' if workload.kind in ('lora', 'qlora') else '6'}N + 12*L*h*s "
        "(recomputation counts in HFU, not MFU)",
        _gemm_note(spec, calibration),
        f"links: {cluster.link} {cluster.link_gb_per_s:g} GB/s per direction inside a node of "
        f"{cluster.devices_per_node}; network {cluster.network} {cluster.network_gbit_per_s:g} Gbit/s "
        "per device; "
        f"collectives reach {calibration.link_efficiency:.0%} / {calibration.network_efficiency:.0%} of that",
        *_fabric_note(cluster),
        f"data-parallel traffic hides behind {calibration.dp_overlap:.0%} of the backward of the step's last "
        "micro-batches and (ZeRO-1/2) the next step's first forwards; "
        f"tensor-parallel traffic {calibration.tp_overlap.get(spec.architecture, 0.0):.0%} under the GEMMs "
        "(with sequence parallelism)",
        _host_note(spec, calibration),
        f"memory: {calibration.runtime_reserve_gib:g} GiB per device reserved for the runtime; "
        f"{spec.usable_memory_fraction:.0%} of {spec.memory_gib:g} GiB usable",
        f"energy: {calibration.training_power_fraction:.0%} of {spec.board_w:g} W "
        + ("TDP" if spec.board_w == spec.tdp_w else "power limit")
        + " per device",
        f"interruptions: {calibration.interruptions_per_device_hour * 1e6:g} per million device-hours, "
        f"{calibration.restart_hours_per_interruption * 60:g} min to restart and half a checkpoint "
        "interval redone each; checkpoints written at "
        f"{calibration.checkpoint_write_gb_per_s_per_device:g} GB/s per device"
        + (
            f", every {workload.checkpoint_every_h:g} h"
            if workload.checkpoint_every_h
            else " at Young's interval"
        )
        + (
            f"; an evaluation of {workload.eval_steps:g} batches every {workload.eval_every_steps} steps"
            if workload.eval_every_steps
            else "; no evaluation"
        ),
    ]
    if spec.board_w < spec.tdp_w:
        notes.append(
            f"power limit {spec.board_w:g} W of {spec.tdp_w:g} W TDP: clocks at "
            f"{calibration.power_clock(spec):.0%} (power goes as the clock cubed)"
        )
    if workload.precision == "fp8":
        notes.append(
            f"fp8 matmuls reach {calibration.fp8_gemm_ratio:.0%} of the bf16 efficiency; attention stays bf16"
        )
    if workload.kind == "qlora":
        notes.append(f"QLoRA dequantization: compute x{calibration.qlora_slowdown:g}")
    if workload.kind in ("lora", "qlora"):
        notes.append(f"LoRA rank {workload.lora_rank} on every linear layer")
    if workload.tokens is None:
        basis = (
            "20 tokens per parameter (Chinchilla)"
            if workload.kind == "pretrain"
            else "a 100 M-token fine-tune"
        )
        notes.append(f"token budget not given: {workload.budget_tokens:.3g} tokens, {basis}")
    if m.derived:
        notes.append(
            f"derived from --params: {', '.join(m.derived)} (layers={m.layers}, hidden={m.hidden}, "
            f"heads={m.heads}, vocab={m.vocab})"
        )
    if spec.hourly_usd is None:
        notes.append(f"no price for {spec.key}: cost is null (set price_usd_per_h in a hardware file)")
    else:
        notes.append(f"price: {spec.price_basis}")
    if spec.tflops.bf16 is None and workload.precision == "bf16":
        notes.append(f"{spec.key} has no bf16 units: fp16 with loss scaling assumed")
    return tuple(notes)


def _fabric_note(cluster: Cluster) -> list[str]:
    if cluster.leaf_nodes is None:
        return []
    felt = cluster.fabric_gbit_per_s < cluster.network_gbit_per_s
    return [
        f"fabric {cluster.oversubscription:g}:1 oversubscribed above leaves of {cluster.leaf_nodes} nodes: "
        + (
            f"{cluster.nodes} nodes span leaves, so collectives between nodes get "
            f"{cluster.fabric_gbit_per_s:g} Gbit/s per device"
            if felt
            else f"{cluster.nodes} nodes fit under one leaf, no effect"
        )
    ]
