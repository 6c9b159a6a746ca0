"""What a job trains, built and spread over its devices: the model, its optimizer, the precision.

Shipyard's LLaMA (presets, and full fine-tuning of plain LLaMA folders) is built on the meta device,
split over the mesh, and then each rank fills in its own shards: from each weight's seeded
generator for a fresh model, from the folder's safetensors for a fine-tuned one. Every other
causal LM loads through ``transformers`` and is sharded after.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from shipyard.errors import InvalidSpec
from shipyard.schemas.jobspec import JobSpec
from shipyard.schemas.presets import PRESETS
from shipyard.training import finetune, hf
from shipyard.training.data import TokenizedData
from shipyard.training.model import Transformer
from shipyard.training.optim import AdamWBf16Moments, moments_in_bf16
from shipyard.training.parallel import Dist
from shipyard.training.parallelize import Spread, materialize, parallelize, replicate

TrainedModel = Transformer | finetune.CausalLM

CHECKPOINT_SHAPE_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size")
"""What ``checkpoint.json`` records of the model's shape."""


def resolve_precision(requested: str, device: torch.device) -> str:
    if requested != "auto":
        return requested
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if device.type in ("hpu", "xpu"):
        return "bf16"
    if device.type == "cpu":
        # bf16 pays off only with AMX tiles: with AVX512-BF16 alone (Zen 4) the bf16 run was slower
        # per thread than the fp32 one, and without either they are 7-25x slower.
        amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        return "bf16" if amx else "fp32"
    return "fp32"


def compiles(spec: JobSpec, device: torch.device) -> bool:
    """``compile: auto`` compiles on GPUs, where fusing the norms, SwiGLU and residual adds of
    each block pays for the first step's compile; ``true`` wherever Inductor runs."""
    requested = spec.training.compile
    return device.type == "cuda" if requested == "auto" else bool(requested)


@dataclass
class Built:
    model: TrainedModel
    """The model itself, sharded in place: what checkpoints and exports read."""
    forward: nn.Module
    """What the loop calls: the model, or DDP around it."""
    spread: Spread


def build_model(spec: JobSpec, data: TokenizedData, d: Dist, precision: str) -> Built:
    """A preset from scratch; a plain LLaMA folder to fully fine-tune on Shipyard's own model; any
    other causal LM, or any method with adapters, through ``transformers`` and PEFT."""
    options = {
        "checkpointing": spec.activation_checkpointing,
        "compile_blocks": compiles(spec, d.device),
        "bf16": precision == "bf16",
    }
    model: TrainedModel
    folder = Path(spec.model.path) if spec.model.path else None
    if folder is None or finetune.builtin_fits(finetune.read_config(folder), spec):
        arch = (
            hf.arch_from_hf(folder)
            if folder
            else PRESETS[spec.model.preset or ""].with_vocab(data.vocab_size)
        )
        _check_fit(spec, data, arch.vocab_size, arch.max_seq_len)
        with torch.device("meta"):
            model = Transformer(arch)
        spread = parallelize(model, d, **options)  # type: ignore[arg-type]
        materialize(model, d.device, _weights(model, folder, spec.training.seed, d.device))
    else:
        model = finetune.load(folder, spec, d.device, precision)
        _check_fit(spec, data, int(model.model.config.vocab_size), model.max_seq_len)
        spread = parallelize(model, d, **options)  # type: ignore[arg-type]
    return Built(model=model, forward=replicate(model, d, spread), spread=spread)


def _weights(
    model: Transformer, folder: Path | None, seed: int, device: torch.device
) -> Callable[[str, torch.Size], torch.Tensor | None]:
    """Where each weight comes from: its seeded generator, or the folder's safetensors (read one
    tensor at a time; a tied head is the embedding)."""
    if folder is None:
        return lambda name, shape: model.initial_value(name, shape, seed, device)
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InvalidSpec(
            f"model.path {folder} has no .safetensors weights",
            hint="save the model with safe_serialization (the default of save_pretrained)",
        )
    where: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            where.update(dict.fromkeys(f.keys(), file))
    expected = {name for name, _ in model.named_parameters()}
    missing = sorted(expected - set(where))
    if missing:
        raise InvalidSpec(
            f"weights in {folder} do not match a LLaMA model of its config (missing {missing[:3]})",
            hint="check that config.json belongs to these weights",
        )

    def read(name: str, shape: torch.Size) -> torch.Tensor:
        with safe_open(str(where[name]), framework="pt") as f:
            tensor: torch.Tensor = f.get_tensor(name)
        if tensor.shape != shape:
            raise InvalidSpec(
                f"{name} in {folder} has shape {tuple(tensor.shape)}, its config says {tuple(shape)}",
                hint="check that config.json belongs to these weights",
            )
        return tensor

    return read


def _check_fit(spec: JobSpec, data: TokenizedData, vocab: int, max_seq_len: int) -> None:
    if vocab < data.vocab_size:
        raise InvalidSpec(
            f"the tokenizer has {data.vocab_size} tokens but the model only {vocab}",
            hint="use the model's own tokenizer (leave data.tokenizer.path out, or point it at model.path)",
        )
    if spec.training.seq_len > max_seq_len:
        raise InvalidSpec(
            f"training.seq_len {spec.training.seq_len} exceeds the model's max_seq_len {max_seq_len}",
            hint=f"set training.seq_len to at most {max_seq_len}",
        )


def build_optimizer(
    model: nn.Module, spec: JobSpec, device: torch.device, sharded: bool
) -> torch.optim.Optimizer:
    """AdamW with no weight decay on norms (1-D parameters); its moments in bf16 when asked."""
    o = spec.training.optimizer
    trained = [p for p in model.parameters() if p.requires_grad]  # not a frozen base under adapters
    groups = [
        {"params": [p for p in trained if p.dim() >= 2], "weight_decay": o.weight_decay},
        {"params": [p for p in trained if p.dim() < 2], "weight_decay": 0.0},
    ]
    if o.state_dtype == "bf16":
        optimizer: torch.optim.Optimizer = AdamWBf16Moments(groups, lr=o.lr, betas=o.betas, eps=o.eps)
        moments_in_bf16(optimizer)
        return optimizer
    return torch.optim.AdamW(
        groups,
        lr=o.lr,
        betas=o.betas,
        eps=o.eps,
        # One vectorised kernel instead of a loop over parameters (what HF Trainer defaults to);
        # sharded (DTensor) parameters take the default implementation.
        fused=(device.type in ("cpu", "cuda") and not sharded) or None,
    )


def describe(spec: JobSpec, model: TrainedModel, trainable_only: bool) -> dict[str, object]:
    """What a checkpoint holds, for ``checkpoint.json``: enough to refuse at submit a resume onto
    another model or method, without torch."""
    arch = model.arch if isinstance(model, Transformer) else model.shape.arch()
    shape = {name: getattr(arch, name) for name in CHECKPOINT_SHAPE_FIELDS}
    return {
        "format": "dcp",
        "model": shape,
        "method": spec.method,
        "adapters_only": trainable_only,
        "lora": spec.finetune.lora.model_dump(mode="json") if trainable_only and spec.finetune else None,
    }
