"""Memory per device: weights, gradients, optimizer state, activations, KV cache.

Bytes per parameter follow Rajbhandari et al., "ZeRO" (2020): mixed-precision Adam keeps 2 bytes
of 16-bit weights, 2 of gradients and 12 of fp32 master weights, momentum and variance (16 in all).
Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (2022), Table 2, in bytes per layer for a micro-batch of b sequences of s tokens:

    no parallelism                  s*b*h * (34 + 5*a*s/h)
    tensor parallel t               s*b*h * (10 + 24/t + 5*a*s/(h*t))
    tensor + sequence parallel      s*b*h/t * (34 + 5*a*s/h)
    selective recomputation         drops the 5*a*s/h attention term
    full recomputation              2*s*b*h per layer (its input), /t with sequence parallelism

That is what Megatron's GPT blocks keep. Shipyard's own runtime (``activations: shipyard``) is
counted from what its LLaMA blocks hand autograd, tensor by tensor (``runtime_bytes_per_token``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from shipyard.planner.calibration import Calibration
from shipyard.planner.shapes import ModelShape
from shipyard.planner.workload import Layout, Optimizer, TrainingWorkload
from shipyard.schemas.runtime import loss_chunk_tokens

GIB = 1024**3

WEIGHT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2, "fp32": 4}
"""fp8 training (Transformer Engine, torchao) keeps 16-bit weights and casts per matmul."""
GRADIENT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2, "fp32": 4}
OPTIMIZER_BYTES: dict[Optimizer, dict[bool, float]] = {
    # {mixed precision: bytes, fp32: bytes}; mixed precision adds a 4-byte fp32 master copy.
    "adamw": {True: 12, False: 8},
    "adam8bit": {True: 6, False: 2},
    "adamw-bf16": {True: 8, False: 4},  # bf16 moments (Shipyard's optimizer.state_dtype: bf16)
    "sgd": {True: 8, False: 4},
}
QLORA_BYTES_PER_PARAM = 4.127 / 8
"""NF4 with double quantization (Dettmers et al., "QLoRA", 2023): 4.127 bits per parameter."""
ACTIVATION_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2, "fp32": 4}


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """GiB per device (the most loaded one: the first pipeline stage)."""

    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    kv_cache_gib: float
    buffers_gib: float
    reserve_gib: float
    usable_gib: float

    @property
    def total_gib(self) -> float:
        return (
            self.weights_gib
            + self.gradients_gib
            + self.optimizer_gib
            + self.activations_gib
            + self.kv_cache_gib
            + self.buffers_gib
            + self.reserve_gib
        )

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.usable_gib

    def to_dict(self) -> dict[str, Any]:
        out = {name: round(value, 3) for name, value in asdict(self).items()}
        out["total_gib"] = round(self.total_gib, 3)
        return out


def lora_parameters(model: ModelShape, rank: int) -> float:
    """Adapter parameters with rank-r adapters on every linear layer (q, k, v, o, gate, up, down)."""
    h, f = model.hidden, model.ffn_hidden
    kv_width = model.kv_heads * model.head_dim
    per_layer = rank * (2 * h + 2 * (h + kv_width) + 2 * h + 3 * (h + f))
    return per_layer * model.layers


def trainable_parameters(workload: TrainingWorkload) -> float:
    if workload.kind in ("lora", "qlora"):
        return lora_parameters(workload.model, workload.lora_rank)
    return workload.model.params


def training_memory(
    workload: TrainingWorkload,
    layout: Layout,
    usable_gib: float,
    calibration: Calibration,
    accelerator: str = "",
) -> MemoryBreakdown:
    model = workload.model
    shard = layout.tp * layout.pp
    mixed = workload.precision != "fp32"
    trainable = trainable_parameters(workload) / shard
    if workload.kind == "qlora":
        embeddings = 2 * model.vocab * model.hidden
        frozen_bytes = (model.params - embeddings) * QLORA_BYTES_PER_PARAM + embeddings * 2
    elif workload.kind == "lora":
        frozen_bytes = model.params * WEIGHT_BYTES[workload.precision]
    else:
        frozen_bytes = 0.0
    if workload.reference_weights:
        frozen_bytes += model.params * WEIGHT_BYTES[workload.precision]
    weights = frozen_bytes / shard + trainable * WEIGHT_BYTES[workload.precision]
    gradients = trainable * GRADIENT_BYTES[workload.precision]
    optimizer = trainable * OPTIMIZER_BYTES[workload.optimizer][mixed]
    dp = layout.dp
    if layout.zero >= 1:
        optimizer /= dp
    if layout.zero >= 2:
        gradients /= dp
    buffers = 0.0
    if layout.zero >= 3:
        weights /= dp
        # Two layers gathered at a time (the one running and the one prefetched).
        buffers = 2 * (model.params / model.layers / layout.tp) * WEIGHT_BYTES[workload.precision]
    return MemoryBreakdown(
        weights_gib=weights / GIB,
        gradients_gib=gradients / GIB,
        optimizer_gib=optimizer / GIB,
        activations_gib=activation_bytes(workload, layout) / GIB,
        kv_cache_gib=0.0,
        buffers_gib=buffers / GIB,
        reserve_gib=calibration.reserve(accelerator),
        usable_gib=usable_gib,
    )


def activation_bytes_per_layer(
    *,
    seq: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    tp: int,
    sequence_parallel: bool,
    recompute: str,
    flash_attention: bool = False,
) -> float:
    """Korthikanti et al. (2022), Table 2, for 16-bit activations.

    A fused attention kernel stores no scores: the 5*a*s/h term drops as under selective recomputation.
    """
    sbh = seq * micro_batch * hidden
    attention = 0.0 if flash_attention else 5 * heads * seq / hidden
    split = sequence_parallel or tp == 1
    if recompute == "full":
        return 2 * sbh / (tp if sequence_parallel else 1)
    if recompute == "selective":
        return 34 * sbh / tp if split else sbh * (10 + 24 / tp)
    if split:
        return sbh * (34 + attention) / tp
    return sbh * (10 + 24 / tp + attention / tp)


ADAPTER_INPUT_COPIES = {True: 3.0, False: 1.0}
"""16-bit copies of each adapted layer's input that LoRA holds until the backward pass: with
dropout, the dropped-out input the down-projection saves, its mask and the sum's temporary; without,
the temporary alone. Measured on CPU with PEFT 0.21: 11.7 bytes per fp32 input element with
dropout (the model counts 12)."""


def adapter_bytes_per_layer(workload: TrainingWorkload, layout: Layout) -> float:
    """What LoRA adds to a layer's activations: its adapters read the inputs of the attention
    projections (q, k, v and o: 4 of width h) and of the MLP's (gate and up: h; down: f)."""
    model = workload.model
    inputs = (6 * model.hidden + model.ffn_hidden) * workload.seq_len * layout.micro_batch / layout.tp
    return 2 * ADAPTER_INPUT_COPIES[workload.lora_dropout] * inputs


def runtime_bytes_per_token(
    model: ModelShape, *, tp: int, recompute: str, activation: int, residual: int, fused_norm: bool
) -> float:
    """Bytes one token leaves for the backward pass in one block of Shipyard's LLaMA runtime, by
    what each operation keeps (``activation``: bytes of a 16- or 32-bit activation; ``residual``:
    of the residual stream, fp32 under autocast, 16-bit when FSDP casts the weights):

    - each RMSNorm computes in fp32: its input as fp32 (4h) and the inverse RMS, plus the
      normalised input (4h) where the norm is not one fused kernel; its output (a*h), which the
      projections share; under tensor parallelism the norms run on sequence shards (/t) and the
      projections keep the gathered full sequence instead (a*h each);
    - attention (SDPA, flash): q, k, v, its output and the log-sum-exp per head (4 bytes);
    - the SwiGLU MLP: gate, up, silu(gate) and their product (4 * a*f).

    ``full``: only the block's input (the residual, on sequence shards); ``selective``: the
    attention is recomputed, everything else kept.
    """
    h, f, t, a = model.hidden, model.ffn_hidden, tp, activation
    kv = model.kv_heads * model.head_dim
    if recompute == "full":
        return residual * h / t
    kept_by_norm = (4 if fused_norm else 8) * h + 4
    norms = 2 * (kept_by_norm + a * h) if t == 1 else 2 * kept_by_norm / t + 2 * a * h
    attention = (2 * a * h + 2 * a * kv + 4 * model.heads) / t
    mlp = 4 * a * f / t
    return norms + mlp + (0.0 if recompute == "selective" else attention)


def _runtime_activation_bytes(workload: TrainingWorkload, layout: Layout) -> float:
    """Shipyard's runtime: every layer's kept tensors, one recomputed layer's whole set while it
    runs its backward, and the loss's: the final norm's output and its gradient, the head's
    weight gradient, and one chunk of logits (all of them, sharded, under tensor parallelism)."""
    model = workload.model
    a = ACTIVATION_BYTES[workload.precision]
    # FSDP2 casts the weights to 16 bits, and the residual stream with them; autocast keeps it fp32.
    residual = 2 if layout.zero >= 3 and workload.precision != "fp32" else 4

    def per_token(recompute: str) -> float:
        return runtime_bytes_per_token(
            model,
            tp=layout.tp,
            recompute=recompute,
            activation=a,
            residual=residual,
            fused_norm=workload.fused_norm,
        )

    tokens = workload.seq_len * layout.micro_batch
    layers = model.layers / layout.pp
    if layout.recompute == "full":
        recomputed = math.ceil(layers / layout.recompute_every)
        kept = recomputed * per_token("full") + (layers - recomputed) * per_token("none")
        kept += per_token("none")  # the block being recomputed, during its backward
    else:
        kept = layers * per_token(layout.recompute)
    if layout.tp > 1:
        loss = 6 * tokens * model.vocab / layout.tp  # 16-bit logits and their fp32 copy
    else:
        loss = 8 * min(tokens, loss_chunk_tokens(model.vocab)) * model.vocab + 4 * model.vocab * model.hidden
    return tokens * kept + 2 * a * tokens * model.hidden + loss


def activation_bytes(workload: TrainingWorkload, layout: Layout) -> float:
    """The first pipeline stage: with 1F1B it holds pp micro-batches of its layers/pp layers."""
    if workload.activations == "shipyard":
        return _runtime_activation_bytes(workload, layout)
    model = workload.model

    def per_layer_with(recompute: str) -> float:
        return activation_bytes_per_layer(
            seq=workload.seq_len,
            micro_batch=layout.micro_batch,
            hidden=model.hidden,
            heads=model.heads,
            tp=layout.tp,
            sequence_parallel=layout.sequence_parallel,
            recompute=recompute,
            flash_attention=workload.flash_attention,
        )

    per_layer = per_layer_with(layout.recompute)
    if workload.kind in ("lora", "qlora") and layout.recompute != "full":
        per_layer += adapter_bytes_per_layer(workload, layout)
    in_flight_layers: float = model.layers
    if layout.pp > 1 and layout.interleave > 1:
        in_flight_layers *= 1 + (layout.pp - 1) / (layout.pp * layout.interleave)
    stored = per_layer * in_flight_layers
    if layout.recompute == "full" and layout.recompute_every > 1:
        recomputed = math.ceil(in_flight_layers / layout.recompute_every)
        stored += (in_flight_layers - recomputed) * (per_layer_with("none") - per_layer)
    if layout.recompute == "full":
        # The layer being recomputed holds its full activations during its backward.
        stored += per_layer_with("none")
    sb = workload.seq_len * layout.micro_batch
    # Embedding dropout masks for pp micro-batches, and fp32 logits for the cross-entropy.
    edges = sb * model.hidden * layout.pp / layout.tp + 4 * sb * model.vocab / layout.tp
    scale = ACTIVATION_BYTES[workload.precision] / 2
    return (stored + edges) * scale
