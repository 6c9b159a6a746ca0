"""What is being planned: a training workload, a cluster of one accelerator type, a parallel layout."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from shipyard.errors import InvalidSpec
from shipyard.hardware.catalog import AcceleratorSpec
from shipyard.planner.shapes import ModelShape, positive

WorkloadKind = Literal["pretrain", "finetune", "lora", "qlora"]
TrainPrecision = Literal["bf16", "fp16", "fp8", "fp32"]
Recompute = Literal["none", "selective", "full"]
Optimizer = Literal["adamw", "adamw-bf16", "adam8bit", "sgd"]
ActivationModel = Literal["megatron", "shipyard"]

RECOMPUTE_CHOICES: tuple[Recompute, ...] = ("none", "selective", "full")

NETWORKS_GBIT_PER_S = {
    "ib-ndr": 400.0,
    "ib-hdr": 200.0,
    "ib-edr": 100.0,
    "roce-400": 400.0,
    "roce-200": 200.0,
    "roce-100": 100.0,
    "eth-100": 100.0,
    "eth-25": 25.0,
    "eth-10": 10.0,
}
"""Named scale-out links, per device. ``--network`` also takes a number of Gbit/s."""

LINKS_GB_PER_S = {
    "nvlink-4": 450.0,
    "nvlink-3": 300.0,
    "nvlink-2": 150.0,
    "pcie-gen5": 64.0,
    "pcie-gen4": 32.0,
    "pcie-gen3": 16.0,
}
"""Named intra-node links, per direction per device. ``--interconnect`` also takes GB/s."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingWorkload:
    model: ModelShape
    kind: WorkloadKind = "pretrain"
    seq_len: int = 2048
    global_batch_tokens: int = 2**20
    tokens: float | None = None
    """Training budget; ``None`` plans a default (Chinchilla's 20 tokens per parameter for
    pre-training, 100 M tokens for fine-tuning) and says so."""
    precision: TrainPrecision = "bf16"
    optimizer: Optimizer = "adamw"
    lora_rank: int = 16
    lora_dropout: bool = True
    """Dropout on the adapters' inputs (PEFT's default setting keeps a copy of each)."""
    reference_weights: bool = False
    """Preference tuning of every weight: a frozen copy of the starting weights is the reference
    (under LoRA the reference is the base with the adapters off, which costs nothing)."""
    reference_forward: bool = False
    """Preference tuning against a reference (DPO, IPO; not SimPO): every step also runs the
    reference forward, 2 FLOPs per parameter per token, counted as the runtime counts it."""
    flash_attention: bool = True
    """Attention kernels that never store the s x s scores (FlashAttention, SDPA, xformers; since
    2022). Without them Korthikanti's 5*a*s/h term is stored and the scores cost memory traffic."""
    activations: ActivationModel = "megatron"
    """Whose activations are counted: ``megatron`` (Korthikanti et al. 2022: GPT blocks with 16-bit
    residuals, as the published runs trained) or ``shipyard`` (what Shipyard's LLaMA runtime keeps
    for its backward pass: fp32 norms, SwiGLU, the loss in chunks; see ``memory.py``)."""
    fused_norm: bool = True
    """``shipyard``: RMSNorm keeps only its input and inverse RMS (one kernel, on GPUs)."""
    eval_every_steps: int = 1000
    """Steps between evaluations (0: none); Megatron-LM's default ``--eval-interval``."""
    eval_steps: float = 100
    """Global batches each evaluation runs forward; Megatron-LM's default ``--eval-iters``."""
    checkpoint_every_h: float | None = None
    """Hours between checkpoints; ``None``: Young's interval, the one that loses least (``run.py``)."""

    def __post_init__(self) -> None:
        for flag, value in (("--seq-len", self.seq_len), ("--global-batch-tokens", self.global_batch_tokens)):
            positive(flag, value)
        if self.global_batch_tokens < self.seq_len:
            raise InvalidSpec(
                f"--global-batch-tokens {self.global_batch_tokens} is smaller than one sequence "
                f"({self.seq_len})",
                hint="give at least --seq-len tokens per step",
            )
        if self.tokens is not None:
            positive("--tokens", self.tokens)
        if self.checkpoint_every_h is not None:
            positive("--checkpoint-every", self.checkpoint_every_h, at_most=1e6)
        if not (0 <= self.eval_every_steps <= 1e9 and 0 <= self.eval_steps <= 1e9):
            raise InvalidSpec(
                f"--eval-every {self.eval_every_steps} and --eval-steps {self.eval_steps:g} must be "
                "zero or more",
                hint="give --eval-every 0 for a run that never evaluates",
            )

    @property
    def sequences_per_step(self) -> int:
        return max(1, self.global_batch_tokens // self.seq_len)

    @property
    def budget_tokens(self) -> float:
        if self.tokens is not None:
            return self.tokens
        return 20 * self.model.params if self.kind == "pretrain" else 1e8


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """``count`` devices of one accelerator type and the links between them."""

    accelerator: AcceleratorSpec
    count: int
    devices_per_node: int
    link: str
    link_gb_per_s: float
    network: str
    network_gbit_per_s: float
    oversubscription: float = 1.0
    """Of the fabric above its leaf switches: 2 where a leaf has half the bandwidth up to the spine
    that its nodes have down to it."""
    leaf_nodes: int | None = None
    """Nodes under one leaf switch; None: every node under one (no oversubscription felt)."""

    @property
    def nodes(self) -> int:
        return -(-self.count // self.devices_per_node)

    @property
    def fabric_gbit_per_s(self) -> float:
        """What a device's collectives get between nodes: its network card's rate, divided by the
        fabric's oversubscription once the job spans more than one leaf (every data-parallel ring
        then crosses the spine at once)."""
        if self.leaf_nodes is None or self.nodes <= self.leaf_nodes:
            return self.network_gbit_per_s
        return self.network_gbit_per_s / self.oversubscription


def cluster_of(
    accelerator: AcceleratorSpec,
    count: int,
    *,
    interconnect: str | None = None,
    network: str | None = None,
    devices_per_node: int | None = None,
    fabric: str | None = None,
) -> Cluster:
    """A cluster with the accelerator's default links unless ``interconnect``/``network`` name others;
    ``fabric`` is ``OVERSUBSCRIPTION:LEAF_NODES`` (``2:16``: 2:1 above leaf switches of 16 nodes)."""
    positive("--count", count, at_most=1e7)
    per_node = devices_per_node or accelerator.devices_per_node
    positive("--devices-per-node", per_node, at_most=1e4)
    link, link_bw = _named_rate(
        interconnect,
        LINKS_GB_PER_S,
        "--interconnect",
        "GB/s",
        accelerator.interconnect.link,
        accelerator.interconnect.gb_per_s,
    )
    if link_bw == 0:
        # No device-to-device link: traffic inside a node goes through the host.
        per_node = 1 if devices_per_node is None else per_node
    net, net_bw = _named_rate(
        network, NETWORKS_GBIT_PER_S, "--network", "Gbit/s", "catalog default", accelerator.network_gbit_per_s
    )
    return Cluster(
        accelerator=accelerator,
        count=count,
        devices_per_node=min(per_node, count),
        link=link,
        link_gb_per_s=link_bw,
        network=net,
        network_gbit_per_s=net_bw,
        **_fabric(fabric),
    )


def _fabric(value: str | None) -> dict[str, Any]:
    if value is None:
        return {}
    ratio, _, leaf = value.partition(":")
    try:
        oversubscription, leaf_nodes = float(ratio), int(leaf)
    except ValueError:
        raise InvalidSpec(
            f"--fabric {value!r} is not OVERSUBSCRIPTION:LEAF_NODES",
            hint="e.g. --fabric 2:16 for a fabric 2:1 oversubscribed above leaf switches of 16 nodes",
        ) from None
    if not (1 <= oversubscription <= 64 and 1 <= leaf_nodes <= 100_000):
        raise InvalidSpec(
            f"--fabric {value!r}: the oversubscription must be 1 to 64 and a leaf 1 to 100000 nodes",
            hint="1:N is a non-blocking fabric; 2:16 halves the bandwidth above leaves of 16 nodes",
        )
    return {"oversubscription": oversubscription, "leaf_nodes": leaf_nodes}


def _named_rate(
    value: str | None, table: dict[str, float], flag: str, unit: str, default_name: str, default_rate: float
) -> tuple[str, float]:
    if value is None:
        return default_name, default_rate
    if value in table:
        return value, table[value]
    try:
        rate = float(value)
    except ValueError:
        raise InvalidSpec(
            f"{flag} {value!r} is neither a known link nor a number of {unit}",
            hint=f"use one of {', '.join(table)} or a number such as 200",
        ) from None
    positive(flag, rate, at_most=1e9)
    return f"{rate:g} {unit}", rate


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """How a training job is split: tensor x pipeline x data parallel, sharding and recomputation."""

    tp: int
    pp: int
    dp: int
    zero: int
    """ZeRO stage: 0 plain data parallel, 1 optimizer state sharded, 2 plus gradients, 3 plus
    weights (what FSDP's FULL_SHARD does)."""
    recompute: Recompute
    micro_batch: int
    """Sequences per device per forward pass."""
    sequence_parallel: bool
    interleave: int = 1
    """Virtual pipeline stages per device (Megatron's interleaved 1F1B)."""
    recompute_every: int = 1
    """With ``recompute: full``: one block in this many is recomputed, the others keep everything
    (torchtitan's and Shipyard's selective checkpointing of whole blocks)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutRequest:
    """What the user pinned; ``None`` leaves the choice to the search."""

    tp: int | None = None
    pp: int | None = None
    zero: int | None = None
    recompute: Recompute | None = None
    micro_batch: int | None = None
    sequence_parallel: bool | None = None
    interleave: int | None = None
    """Virtual pipeline stages per device; ``None`` searches 1, 2, 4, 8."""
    recompute_every: int = 1
    zero_choices: tuple[int, ...] = (1, 2, 3)
    """ZeRO stages the search tries when ``zero`` is open (a runtime without ZeRO-1/2 gives (0, 3))."""

    def __post_init__(self) -> None:
        for flag, value in (("--tp", self.tp), ("--pp", self.pp), ("--micro-batch", self.micro_batch)):
            if value is not None:
                positive(flag, value, at_most=1e7)
        if self.zero is not None and self.zero not in (0, 1, 2, 3):
            raise InvalidSpec(
                f"--zero must be 0, 1, 2 or 3, got {self.zero}", hint="3 shards weights too (FSDP)"
            )
        if self.interleave is not None:
            positive("--interleave", self.interleave, at_most=1e4)

    @property
    def pinned(self) -> bool:
        return None not in (self.tp, self.pp, self.zero, self.recompute)
