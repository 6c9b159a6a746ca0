"""The planner's efficiency parameters, in one place, each with where it comes from.

Ampere and Hopper figures are fitted by ``benchmarks/planner_calibrate.py`` on the published runs
of ``training-runs-dev.csv`` (Megatron-LM, Korthikanti et al., LLaMA, BLOOM, MosaicML LLM Foundry,
torchtitan, NeMo, llm.c) and of ``benchmarks/data/mlperf-gpt3-runs.csv`` (MLPerf Training's GPT-3
175B on 512 to 11,616 H100s, read from the submissions' logs and configs): a handful of physical
constants shared by every row, never one per row.
Hopper's large-GEMM efficiency is measured on an H200 instead, and held out of the fit.
Other generations have too few published runs to fit; their figures are taken from the sources
named beside them, relative to the fitted ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shipyard.hardware.catalog import AcceleratorSpec


def _frozen(values: dict[str, float]) -> Mapping[str, float]:
    return MappingProxyType(values)


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    gemm_efficiency: Mapping[str, float] = field(
        default_factory=lambda: _frozen(
            {
                # Fitted (see module docstring).
                "ampere": 0.762,
                # Measured: a transformer layer's four projections on an H200 at widths of 4,096
                # and 8,192 over 8,192-32,768 tokens reach 65-69 % of the dense peak
                # (benchmarks/kernel_efficiency.py, docs/benchmarks.md).
                "hopper": 0.68,
                # MosaicML measured 166 TFLOP/s per MI250 on MPT-7B (46 % of 362) where an A100
                # reached ~57 % on the same code: 0.8 of Ampere.
                "cdna2": 0.59,
                # MI300X training reports (Databricks, AMD ROCm blogs) land at 35-45 % MFU.
                "cdna3": 0.5,
                # Megatron-LM (2019) sustained 30 % of V100 fp16 peak with model parallelism.
                "volta": 0.55,
                # Ada consumer/workstation parts reach 60-70 % of the fp32-accumulate peak on GEMMs.
                "ada": 0.65,
                # Fitted on Intel's five MLPerf GPT-3 175B results (256-1,024 cards, bf16 and
                # fp8, benchmarks/data/mlperf-gpt3-runs.csv) alone, the shared constants held:
                # it also carries what the planner gets wrong of Gaudi 2's in-node RoCE. Read from
                # Intel's reports as ~50 % MFU before those runs were in the files: 0.55.
                "gaudi2": 0.804,
                # No published Gaudi 3 training run: Intel's ~50 % of the bf16 MME peak, as Gaudi 2
                # was read before its runs (which then showed Gaudi 2 faster than read: kept as read
                # until Gaudi 3's own runs are published, the range says how far off it may be).
                "gaudi3": 0.5,
                # MLX matmul benchmarks on M-series GPUs: 60-70 % of the ALU peak.
                "apple-m2": 0.6,
                "apple-m1": 0.6,
                # Measured by Shipyard's own runtime on an AVX512-BF16 CPU: 56 % MFU.
                "cpu": 0.6,
            }
        )
    )
    """Fraction of the dense peak a large matrix multiply sustains, by generation."""
    default_gemm_efficiency: float = 0.5
    """For a generation not listed above (a device added in a user hardware file)."""
    fp8_gemm_ratio: float = 0.905
    """Share of the bf16 efficiency fp8 GEMMs reach on their doubled peak (fitted: 0.905; what fp8
    runs lose shows up as attention and norms staying 16-bit)."""
    elementwise_bytes_per_hidden: float = 0.640
    """Non-GEMM work per layer, as bytes of memory traffic per unit of hidden width per FLOP of
    GEMM work: layers reach half their GEMM efficiency at hidden/tp = this x peak FLOPs/byte
    (about 120 on an A100, 240 on an H100) (fitted)."""
    micro_batch_tokens_half: float = 365.8
    """Tokens per micro-batch at which efficiency halves for the same reason (fitted)."""
    flash_attention_ratio: float = 0.503
    """Fused attention kernels run at this share of the GEMM efficiency (FlashAttention-2 reaches
    50-70 % of peak where GEMMs reach 70-80 %) (fitted)."""
    score_bytes_per_element: float = 37.1
    """Memory traffic per attention score per forward+backward without a fused kernel: scores,
    softmax, dropout mask and their gradients, each written and read (fitted)."""
    pipeline_send_exposed: float = 0.5
    """Share of pipeline sends between stages not hidden behind compute."""
    link_efficiency: float = 0.777
    """Share of the nominal intra-node link bandwidth a ring all-reduce achieves (fitted; below the
    70-80 % bus bandwidth NCCL tests report for large messages on NVLink)."""
    network_efficiency: float = 0.689
    """Share of the per-device network bandwidth an inter-node all-reduce achieves (fitted)."""
    dp_overlap: float = 0.696
    """Share of the compute that data-parallel traffic hides behind while it may run: the backward
    of the step's last micro-batches, and with ZeRO-1/2 the next step's first forwards (a pipeline's
    cool-down and warm-up span several micro-batches) (fitted)."""
    tp_overlap: Mapping[str, float] = field(default_factory=lambda: _frozen({"hopper": 0.775}))
    """Share of tensor-parallel traffic hidden under the GEMMs it feeds, by generation: with
    sequence parallelism, Transformer Engine splits each all-gather and reduce-scatter into chunks
    that overlap the matrix multiplies (NeMo PR 6362, April 2023; its tuned presets are H100's).
    The Ampere runs in the published data predate it (fitted)."""
    qlora_slowdown: float = 1.35
    """4-bit weights are dequantized before every matmul (bitsandbytes: QLoRA ~1.3-1.4x LoRA)."""
    memory_bandwidth_efficiency: Mapping[str, float] = field(
        default_factory=lambda: _frozen({"apple-m2": 0.6, "apple-m1": 0.6, "cpu": 0.5})
    )
    """Share of peak memory bandwidth decoding reaches: llama.cpp on M2 Ultra 42-77 % of 800 GB/s."""
    default_memory_bandwidth_efficiency: float = 0.7
    """vLLM/TensorRT-LLM batch-1 decode on HBM GPUs: 60-80 % of peak bandwidth."""
    power_clock_exponent: float = 1 / 3
    """Clock (so compute rate) under a power limit below TDP, as (limit / TDP) ** this: dynamic power
    is C V^2 f and in the DVFS range the voltage scales with the clock, so power goes as f^3
    (Hennessy and Patterson, Computer Architecture, 6th ed., section 1.5). Memory clocks stay."""
    training_power_fraction: float = 0.8
    """Average board power while training, as a share of TDP (BLOOM carbon study: ~75-85 %)."""
    inference_power_fraction: float = 0.6
    interruptions_per_device_hour: float = 2.2e-5
    """Llama 3 (arXiv:2407.21783, section 3.3.4): 466 interruptions in 54 days on 16,384 H100s."""
    restart_hours_per_interruption: float = 0.217
    """Detecting the failure, restarting and reloading the last checkpoint (the work redone since
    then is counted from the checkpoint interval); with it and the rate above a run on 16,384 GPUs
    loses 25 min an interruption, which reproduces Meta's >90 % effective training time."""
    checkpoint_write_gb_per_s_per_device: float = 0.122
    """Storage bandwidth for checkpoint writes, per device: Llama 3's Tectonic sustained 2 TB/s
    for 16,384 H100s (arXiv:2407.21783, section 3.3.1)."""
    runtime_reserve_gib: float = 1.0
    """Per device: CUDA/ROCm context, NCCL buffers, allocator slack."""
    host_runtime_reserve_gib: float = 0.42
    """A process training on the CPU, before its model: the interpreter, torch, transformers and
    PEFT resident (measured: 0.40-0.43 GiB peak RSS fine-tuning models of a few M parameters)."""
    gpu_host_op_us: float = 5.42
    """Host time per eager operation (``hardware.probe``) of a GPU node whose host was not measured:
    the Xeon of an H200 node, where Shipyard's compiled 125M-shaped model queues a step's kernels
    slower than the GPU runs them (``benchmarks/host_dispatch.py``)."""
    collective_latency_s: float = 20e-6
    """Per collective call (launch plus one hop), NCCL tests on NVLink/InfiniBand."""

    def reserve(self, accelerator: str) -> float:
        """Memory per device the runtime holds besides the model's own state."""
        return self.host_runtime_reserve_gib if accelerator == "cpu" else self.runtime_reserve_gib

    device_efficiency: Mapping[str, float] = field(default_factory=lambda: _frozen({}))
    """A cluster's own factor on the compute efficiency of an accelerator type (its drivers,
    clocks, cooling, contention), fitted by ``shipyard plan calibrate`` from its finished
    attempts; 1 where it has none."""
    device_runs: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """How many shapes of job this cluster measured on each type for ``device_efficiency``: the
    planner's evidence measured here, beside the published runs."""

    def gemm(self, architecture: str) -> float:
        return self.gemm_efficiency.get(architecture, self.default_gemm_efficiency)

    def compute_efficiency(self, accelerator: str, architecture: str, measured: float | None = None) -> float:
        """Large-GEMM efficiency on one accelerator type: its generation's (or what was ``measured``
        on the device itself), times the cluster's own."""
        own = measured if measured is not None else self.gemm(architecture)
        return own * self.device_efficiency.get(accelerator, 1.0)

    def power_clock(self, spec: AcceleratorSpec) -> float:
        """The share of its nominal clock a device keeps at its power limit: 1 at TDP."""
        return float((spec.board_w / spec.tdp_w) ** self.power_clock_exponent)

    def bandwidth(self, architecture: str) -> float:
        return self.memory_bandwidth_efficiency.get(architecture, self.default_memory_bandwidth_efficiency)


CALIBRATION = Calibration()
