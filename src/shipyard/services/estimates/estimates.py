"""The planner's estimate of a submitted job on this node's accelerators.

A job that fits on no accelerator type it may use is refused at submit time with the numbers; one
that fits gets the estimate (memory per device, step time, tokens/s, wall time) stored beside the
measured figures.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from shipyard.errors import InvalidSpec, ShipyardError, Unschedulable
from shipyard.executors.base import NodeInventory, Request
from shipyard.hardware.catalog import AcceleratorSpec, Catalog
from shipyard.hardware.probe import HostRates
from shipyard.planner import from_spec
from shipyard.planner.calibration import CALIBRATION, Calibration
from shipyard.planner.host import host_op_us
from shipyard.planner.training import TrainingPlan, plan_training
from shipyard.planner.workload import LayoutRequest, TrainingWorkload, cluster_of
from shipyard.schemas.documents import read_document_file
from shipyard.schemas.estimate import (
    Estimate,
    Figures,
    PlannedCheckpointing,
    PlannedLayout,
    PlannedParallelism,
)
from shipyard.schemas.finetune_spec import FinetuneSection
from shipyard.schemas.jobspec import JobSpec
from shipyard.schemas.model_config import model_shape
from shipyard.schemas.presets import PRESETS, ModelArch
from shipyard.schemas.runtime import FUSED_NORM_VENDORS, runs_on_shipyard_llama
from shipyard.schemas.training_spec import ActivationCheckpointingSection, ParallelismSection
from shipyard.services.models.base_models import QLORA_VENDOR


def job_arch(spec: JobSpec) -> ModelArch:
    """The architecture a job trains: its preset, or the config of the model it fine-tunes."""
    if not spec.model.path:
        return PRESETS[spec.model.preset or ""].with_vocab(spec.data.tokenizer.vocab_size)
    return model_shape(model_config(spec), f"model.path {spec.model.path}: config.json").arch()


def model_config(spec: JobSpec) -> dict[str, Any]:
    """The config.json of the model a job fine-tunes, read and checked; an unreadable or invalid
    one is refused with the fix (never taken for another kind of model)."""
    where = f"model.path {spec.model.path}: config.json"
    try:
        text = read_document_file(Path(spec.model.path or "") / "config.json", what="model config")
        config = json.loads(text)
    except ShipyardError as exc:
        raise InvalidSpec(
            f"model.path {spec.model.path}: {exc.message}",
            hint="give a folder written by save_pretrained or a Shipyard export",
        ) from None
    except ValueError as exc:
        raise InvalidSpec(f"{where}: Invalid JSON ({exc})", hint="restore the model's config.json") from None
    if not isinstance(config, dict):
        raise InvalidSpec(f"{where} is not a JSON object", hint="restore the model's config.json")
    return config


def on_shipyard_llama(spec: JobSpec) -> bool:
    """Whether the job trains on Shipyard's own LLaMA (which tensor parallelism can split): a
    preset, or full fine-tuning of a plain LLaMA folder."""
    return not spec.model.path or runs_on_shipyard_llama(model_config(spec), spec.method)


def job_workload(spec: JobSpec) -> TrainingWorkload:
    """The planner's workload of the job, its model read from its preset or config."""
    return from_spec.job_workload(spec, job_arch(spec), on_llama=on_shipyard_llama(spec))


def runtime_request(spec: JobSpec) -> LayoutRequest:
    return from_spec.runtime_request(spec, on_llama=on_shipyard_llama(spec))


def runtime_layout(plan: TrainingPlan) -> PlannedLayout:
    """The plan's layout as the job spec's fields (what a launch fills in for ``auto``)."""
    layout = plan.layout
    sharded = layout.zero >= 1 and layout.dp > 1
    if layout.recompute == "full" and layout.recompute_every > 1:
        checkpointing = PlannedCheckpointing(
            mode="selective", selective="blocks", every=layout.recompute_every
        )
    else:
        checkpointing = PlannedCheckpointing(mode=layout.recompute)
    parallelism = PlannedParallelism(
        tp=layout.tp, dp_shard=layout.dp if sharded else 1, dp_replicate=1 if sharded else layout.dp
    )
    return PlannedLayout(parallelism=parallelism, activation_checkpointing=checkpointing)


def _plan_for_type(
    workload: TrainingWorkload,
    spec: JobSpec,
    accelerator: AcceleratorSpec,
    devices: int,
    calibration: Calibration = CALIBRATION,
) -> TrainingPlan:
    nodes = spec.resources.nodes
    cluster = cluster_of(accelerator, devices * nodes, devices_per_node=devices)
    fused = replace(workload, fused_norm=accelerator.vendor in FUSED_NORM_VENDORS)
    return plan_training(fused, cluster, runtime_request(spec), calibration=calibration)


_MEMO_SIZE = 512
_memo: dict[Hashable, Estimate | None] = {}


def estimate_job(
    spec: JobSpec, nodes: Sequence[NodeInventory], catalog: Catalog, calibration: Calibration = CALIBRATION
) -> Estimate | None:
    """The fastest fitting accelerator type among those the job may use on these nodes, planned
    with ``calibration`` (this cluster's: :func:`shipyard.services.estimates.calibrate.cluster_calibration`)
    and with the hosts the nodes measured.

    None where no node here has any of its types; raises ``Unschedulable`` with the memory
    needed and the largest memory here when none fits. Remembered per shape of job (a queue
    fills with copies of one spec, each asking again).
    """
    if spec.model.path:  # the config.json behind a path can change: read it each time
        return _estimate(spec, nodes, catalog, calibration)
    accelerators = tuple(spec.resources.accelerator)
    key = (
        spec.model,
        spec.data.tokenizer,
        spec.training,
        spec.resources.devices,
        spec.resources.cpus_per_device,
        accelerators,
        tuple((node.devices, node.host) for node in nodes),
        tuple(catalog.get(a) for a in accelerators),
        tuple(sorted(calibration.device_efficiency.items())),
    )
    if key in _memo:
        return _memo[key]
    found = _estimate(spec, nodes, catalog, calibration)
    if len(_memo) >= _MEMO_SIZE:
        _memo.clear()
    _memo[key] = found
    return found


def _plans(
    workload: TrainingWorkload,
    spec: JobSpec,
    nodes: Sequence[NodeInventory],
    catalog: Catalog,
    calibration: Calibration = CALIBRATION,
) -> list[TrainingPlan]:
    """The job planned on each accelerator type it may use that the nodes have."""
    devices = spec.resources.devices
    plans: list[TrainingPlan] = []
    for accelerator_type in spec.resources.accelerator:
        having = [node for node in nodes if accelerator_type in node.capacity()]
        found = [d for node in having for d in node.devices if d.accelerator_type == accelerator_type]
        if not found or accelerator_type not in catalog:
            continue
        if workload.kind == "qlora" and catalog[accelerator_type].vendor != QLORA_VENDOR:
            continue
        # The memory this node reports; the CPU's is shared by the job's processes.
        memory_gib = min(d.memory_gib for d in found)
        row = catalog[accelerator_type]
        update: dict[str, Any] = {"usable_memory_fraction": 1.0}
        host = _slowest_host(having)
        if host is not None:  # the host that queues a GPU's kernels, or computes on the CPU
            update["op_overhead_us"] = host.op_overhead_us
        planned = workload
        if accelerator_type == "cpu":
            if spec.training.precision == "auto" and not _cpu_has_bf16_tiles(row):
                planned = replace(workload, precision="fp32")  # as the runtime resolves it
            memory_gib /= devices
            # The catalog's CPU is all of its cores; each process computes with its threads only.
            cores = found[0].cores
            threads = Request.of(spec.resources).threads_per_process(cores) if cores else 0
            share = threads / cores if cores else 1.0
            update["tflops"] = row.tflops.model_copy(
                update={k: v * share for k, v in row.tflops.model_dump().items() if v}
            )
            if host is not None:
                update |= _measured_cpu(host, row, planned.precision, threads or 1, cores or 1)
        accelerator = row.model_copy(update={**update, "memory_gib": memory_gib})
        plans.append(_plan_for_type(planned, spec, accelerator, devices, calibration))
    return plans


def _slowest_host(nodes: Sequence[NodeInventory]) -> HostRates | None:
    """The host an estimate for these nodes plans with: the slowest to dispatch an operation, so
    that it holds on whichever of them the job lands (``None`` where none measured its host)."""
    measured = [node.host for node in nodes if node.host is not None]
    return max(measured, key=lambda rates: rates.op_overhead_us, default=None)


def _measured_cpu(
    rates: HostRates, cpu: AcceleratorSpec, precision: str, threads: int, cores: int
) -> dict[str, Any]:
    """A node's CPU as measured (``hardware.probe``) rather than derived: its GEMM rate against the
    derived fp32 peak and its memory bandwidth, for the job's threads."""
    measured: dict[str, Any] = {"memory_bandwidth_gb_per_s": rates.memory_gb_per_s_per_thread * threads}
    peak_per_core = (cpu.tflops.fp32 or 0) / cores
    if precision == "fp32" and peak_per_core:
        measured["gemm_efficiency"] = rates.gemm_gflops_per_thread / 1000 / peak_per_core
    return measured


def _cpu_has_bf16_tiles(cpu: AcceleratorSpec) -> bool:
    """Whether ``precision: auto`` trains in bf16 on this CPU (``resolve_precision``): only with
    AMX, the one unit whose bf16 peak is many times the fp32 one (1,024 against 64 FLOPs per
    cycle; AVX512-BF16 gives 2x)."""
    return (cpu.tflops.bf16 or 0) >= 4 * (cpu.tflops.fp32 or math.inf)


METHOD_WORDS = {"full": "full fine-tuning", "lora": "lora", "qlora": "qlora", "dpo": "dpo"}


def _estimate(
    spec: JobSpec, nodes: Sequence[NodeInventory], catalog: Catalog, calibration: Calibration
) -> Estimate | None:
    workload = job_workload(spec)
    plans = _plans(workload, spec, nodes, catalog, calibration)
    if not plans:
        return None
    fitting = [p for p in plans if p.fits]
    if not fitting:
        raise _fits_nowhere(spec, workload, plans, nodes, catalog)
    best = min(fitting, key=lambda p: p.step.total_s)
    return Estimate(
        accelerator=best.cluster.accelerator.key,
        devices=spec.resources.devices,
        **_figures(best, calibration).model_dump(exclude={"wall_time_s", "wall_time_s_range"}),
        memory=best.memory.to_dict(),
        wall_time_s=best.wall_time_h * 3600,
        wall_time_s_range=best.evidence.spread_of_time(best.wall_time_h * 3600),
        # Each accelerator type the job may land on: the layout a launch there fills in for what
        # the spec leaves to the planner, and what the plan predicts with it.
        by_accelerator={p.cluster.accelerator.key: _figures(p, calibration) for p in fitting},
    )


def _figures(plan: TrainingPlan, calibration: Calibration) -> Figures:
    return Figures(
        memory_gib_per_device=round(plan.memory.total_gib, 3),
        step_time_s=plan.step.total_s,
        tokens_per_s=plan.tokens_per_s,
        layout=runtime_layout(plan),
        peak_tflops=plan.peak_tflops,
        mfu=plan.mfu,
        flops_per_token=plan.model_flops_per_token,
        device_efficiency=calibration.device_efficiency.get(plan.cluster.accelerator.key, 1.0),
        host_op_us=host_op_us(plan.cluster.accelerator, calibration),
        host_bound=plan.step.host_overlaps and plan.step.host_s > plan.step.device_s,
        evidence=_evidence(plan, calibration),
        tokens_per_s_range=plan.evidence.spread(plan.tokens_per_s),
    )


def _evidence(plan: TrainingPlan, calibration: Calibration) -> str:
    """What the planned throughput rests on, and this cluster's measured jobs where they scale it."""
    words = plan.evidence.words
    factor = calibration.device_efficiency.get(plan.cluster.accelerator.key)
    if factor is not None and factor != 1.0:
        shapes = calibration.device_runs.get(plan.cluster.accelerator.key, 0)
        jobs = f"{shapes} shape{'s' if shapes != 1 else ''} of job" if shapes else "the jobs"
        words += f"; scaled x{factor:.2f} by {jobs} this cluster measured on it"
    return words


def planned_layout(spec: JobSpec, estimate: Estimate | None, accelerator_type: str) -> JobSpec:
    """The spec as a launch on ``accelerator_type`` runs it: the parallelism degrees and the
    activation checkpointing it leaves open, as the planner chose them for that type."""
    figures = None if estimate is None else estimate.by_accelerator.get(accelerator_type)
    planned = None if figures is None else figures.layout
    if planned is None:
        return spec
    t = spec.training
    given = t.parallelism.model_dump(exclude_none=True)
    parallelism = ParallelismSection(**{**planned.parallelism.model_dump(), **given})
    checkpointing = t.activation_checkpointing
    if spec.activation_checkpointing.mode == "auto":
        checkpointing = ActivationCheckpointingSection(
            **planned.activation_checkpointing.model_dump(exclude_none=True)
        )
    training = t.model_copy(update={"parallelism": parallelism, "activation_checkpointing": checkpointing})
    return spec.model_copy(update={"training": training})


def _fits_nowhere(
    spec: JobSpec,
    workload: TrainingWorkload,
    plans: list[TrainingPlan],
    nodes: Sequence[NodeInventory],
    catalog: Catalog,
) -> Unschedulable:
    devices = spec.resources.devices
    largest = max(plans, key=lambda p: p.memory.usable_gib)
    need = min(plans, key=lambda p: p.memory.total_gib)
    shared = (
        f", shared by {devices} processes" if largest.cluster.accelerator.key == "cpu" and devices > 1 else ""
    )
    what = f"job {spec.name!r}"
    if spec.method is not None:
        what = f"{METHOD_WORDS[spec.method]} of {workload.model.params / 1e9:.2g} B parameters"
    hint = (
        f"{memory_levers(spec)}lower training.micro_batch_size or training.seq_len, shard the "
        "weights with training.parallelism: fsdp over more resources.devices, or pick a smaller "
        "model; `shipyard plan train` shows what fits where"
    )
    lighter = _lighter_methods(spec, nodes, catalog)
    if lighter:
        hint = f"{', '.join(lighter)} (finetune.method); or {hint}"
    return Unschedulable(
        f"{what} needs {need.memory.total_gib:.1f} GiB per device at best "
        f"({runtime_layout(need).describe()}: {_breakdown(need)}); "
        f"the largest accelerator here has {largest.memory.usable_gib:.1f} GiB "
        f"({largest.cluster.accelerator.key}{shared})",
        hint=hint,
    )


def memory_levers(spec: JobSpec) -> str:
    """The spec's memory savers it leaves unused, as the start of a hint ("" when none)."""
    t = spec.training
    levers = []
    if spec.activation_checkpointing.mode not in ("auto", "full"):
        levers.append("training.activation_checkpointing: full")
    if spec.weights in (None, "full") and t.optimizer.state_dtype != "bf16":  # adapters: state is small
        levers.append("training.optimizer.state_dtype: bf16")
    return f"set {' and '.join(levers)}; " if levers else ""


def _lighter_methods(spec: JobSpec, nodes: Sequence[NodeInventory], catalog: Catalog) -> list[str]:
    """What the fine-tuning methods lighter than the job's would need: "lora fits in 19.3 GiB on
    rtx-4090" where one of the job's accelerator types here holds it, else the memory it needs."""
    if spec.method not in ("full", "lora"):
        return []
    order = ["full", "lora", "qlora"]
    found = []
    for method in order[order.index(spec.method) + 1 :]:
        finetune = (spec.finetune or FinetuneSection()).model_copy(update={"method": method})
        variant = spec.model_copy(update={"finetune": finetune})
        workload = job_workload(variant)
        plans = _plans(workload, variant, nodes, catalog)
        fitting = sorted((p for p in plans if p.fits), key=lambda p: p.memory.total_gib)
        if fitting:
            p = fitting[0]
            found.append(f"{method} fits in {p.memory.total_gib:.1f} GiB on {p.cluster.accelerator.key}")
        elif method == "qlora" and not plans:
            gpu = catalog[next(k for k in catalog if catalog[k].vendor == QLORA_VENDOR)]
            need = _plan_for_type(workload, variant, gpu, spec.resources.devices).memory.total_gib
            found.append(f"qlora needs {need:.1f} GiB on an NVIDIA GPU")
    return found


def _breakdown(plan: TrainingPlan) -> str:
    m = plan.memory
    return (
        f"weights {m.weights_gib:.1f}, gradients {m.gradients_gib:.1f}, optimizer {m.optimizer_gib:.1f}, "
        f"activations {m.activations_gib:.1f}"
    )
