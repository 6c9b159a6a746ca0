"""Fine-tuning a local Hugging Face causal LM: full, LoRA or QLoRA (PEFT over ``transformers``).

Shipyard's own LLaMA (``model.py``) trains presets and fully fine-tunes plain LLaMA folders, where
it is faster; every other model and method loads through ``AutoModelForCausalLM`` and is wrapped
so that the trainer calls it as it calls its own: ``model(tokens, targets[, positions])`` is the
mean loss over the targets that carry one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from shipyard.errors import InvalidSpec
from shipyard.schemas.finetune_spec import FinetuneSection
from shipyard.schemas.jobspec import JobSpec
from shipyard.schemas.launch import MERGED_DIR
from shipyard.schemas.model_config import model_shape
from shipyard.schemas.runtime import runs_on_shipyard_llama
from shipyard.training._atomic import staged_directory
from shipyard.training.hf import copy_tokenizer, write_weights
from shipyard.training.samples import IGNORE, attention_mask

PROMPT_FORMAT_FILE = "shipyard-data.json"
"""In an export: the data format it was fine-tuned on, so that sampling renders a prompt the same way."""


def builtin_fits(config: dict[str, Any], spec: JobSpec) -> bool:
    """Whether Shipyard's own LLaMA trains this folder (``runs_on_shipyard_llama``)."""
    return runs_on_shipyard_llama(config, spec.method)


class CausalLM(nn.Module):
    """A ``transformers`` causal LM (or a PEFT model around one) behind the trainer's calling
    convention. Packed rows pass ``positions``; the mask then keeps each sample to itself."""

    model: Any
    """The ``transformers`` model, or the PEFT model around it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        config: Any = model.config
        self.max_seq_len = int(getattr(config, "max_position_embeddings", None) or 1 << 20)
        self.shape = model_shape(config.to_dict(), "config.json")
        self.attention = str(getattr(config, "_attn_implementation", None) or "default")

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        extra = (
            {}
            if positions is None
            else {"position_ids": positions, "attention_mask": attention_mask(positions)}
        )
        logits: torch.Tensor = self.model(input_ids=tokens, **extra).logits
        if targets is None:
            return logits
        # A sum over a clamped count: a micro-batch that trains no token (all prompt) is 0, not NaN.
        flat = logits.float().view(-1, logits.shape[-1])
        total = nn.functional.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE, reduction="sum")
        return total / (targets != IGNORE).sum().clamp(min=1)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> float:
        """6 FLOPs per weight and token for a fully trained model; with frozen weights the
        backward pass skips their weight gradients (4 per weight), as the planner counts."""
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        frozen = self.num_params() - trainable
        attention = 12 * self.shape.num_hidden_layers * self.shape.hidden_size * seq_len
        return 6 * trainable + 4 * frozen + attention


def load(folder: Path, spec: JobSpec, device: torch.device, precision: str) -> CausalLM:
    """The model of ``folder`` on ``device``, ready to train with the spec's method."""
    from transformers import AutoConfig

    finetune = spec.finetune or FinetuneSection(method="full")
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InvalidSpec(
            f"model.path {folder} cannot be read as a Hugging Face model: {str(exc).splitlines()[0][:300]}",
            hint="give a folder that save_pretrained wrote (config.json + weights)",
        ) from None
    attention = attention_implementation(config)
    weights = spec.weights or "full"
    if causal_lm_class(config) is None:
        raise InvalidSpec(
            f"model.path {folder} holds a {config.model_type} model, which transformers has no "
            f"causal language model class for ({type(config).__name__})",
            hint="fine-tune a decoder model (Llama, Qwen2, Mistral, Gemma, Phi, GPT-2, Falcon, ...)",
        )
    model = _pretrained(folder, config, attention, weights, device, precision)
    if weights in ("lora", "qlora"):
        model = _with_adapters(model, finetune, qlora=weights == "qlora")
    if weights != "qlora":
        model = model.to(device)
    if spec.method != "dpo":
        return CausalLM(model)
    from shipyard.training.preference import PreferenceModel

    # The reference: under adapters, the base with them switched off (no second copy); for every
    # weight trained, a frozen copy of the starting ones; SimPO needs none.
    settings = finetune.dpo
    needs_copy = weights == "full" and settings.loss != "simpo"
    reference = _pretrained(folder, config, attention, "reference", device, precision) if needs_copy else None
    return PreferenceModel(model, settings, reference)


def _pretrained(
    folder: Path, config: Any, attention: str, weights: str, device: torch.device, precision: str
) -> Any:
    """The folder's model as ``weights`` trains it: fp32 master weights (autocast computes in 16
    bits), bf16 frozen weights under LoRA, 4-bit ones under QLoRA; a frozen reference in the
    precision it computes in."""
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"local_files_only": True, "attn_implementation": attention}
    if weights == "qlora":
        kwargs["quantization_config"] = _nf4(precision)
        kwargs["device_map"] = {"": device}
    else:
        frozen_16 = weights in ("lora", "reference") and precision == "bf16"
        kwargs["dtype"] = torch.bfloat16 if frozen_16 else torch.float32
    model: Any = AutoModelForCausalLM.from_pretrained(str(folder), config=config, **kwargs)
    # Activation checkpointing is applied to the decoder's blocks as to Shipyard's own (parallelize.py).
    model.config.use_cache = False
    if weights == "reference":
        model.requires_grad_(False)
        model.eval()
        model.to(device)
    return model


def causal_lm_class(config: Any) -> type[nn.Module] | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    found: Any = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    return found if isinstance(found, type) else None


def attention_implementation(config: Any) -> str:
    """PyTorch's fused attention where the model's class supports it, else the model's own
    eager attention (Gemma 2's soft-capped logits have no fused kernel)."""
    found = causal_lm_class(config)
    return "sdpa" if found is not None and getattr(found, "_supports_sdpa", False) else "eager"


def _nf4(precision: str) -> Any:
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16 if precision == "bf16" else torch.float16,
    )


def projections(model: nn.Module) -> dict[str, type[nn.Module]]:
    """The distinct last names of the model's projections, the output head aside, with their
    kind: what ``lora.target_modules`` may name. GPT-2's are ``transformers``' ``Conv1D`` (a linear
    layer with its weight transposed), everyone else's ``nn.Linear``."""
    from transformers.pytorch_utils import Conv1D

    found: dict[str, type[nn.Module]] = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, Conv1D)) and not name.endswith("lm_head"):
            found[name.rsplit(".", 1)[-1]] = Conv1D if isinstance(module, Conv1D) else nn.Linear
    return dict(sorted(found.items()))


def _with_adapters(model: nn.Module, finetune: FinetuneSection, qlora: bool) -> nn.Module:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    present = projections(model)
    targets = finetune.lora.target_modules or list(present)
    missing = [t for t in targets if t not in present]
    if missing:
        raise InvalidSpec(
            f"finetune.lora.target_modules {missing} are not layers of this model",
            hint=f"its linear layers are {', '.join(present)}",
        )
    if qlora:
        model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
            model, use_gradient_checkpointing=False
        )
    lora = finetune.lora
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(targets),
        # Conv1D keeps its weight as (in, out): PEFT must transpose what it adds to it.
        fan_in_fan_out=any(present[t] is not nn.Linear for t in targets),
        use_dora=lora.dora,
        bias="none",
        task_type="CAUSAL_LM",
    )
    peft_model: nn.Module = get_peft_model(model, config)
    return peft_model


def trainable_state(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The part of a state dict that training changes (all of it for full fine-tuning)."""
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in state.items() if k in trainable}


def export(
    model: CausalLM,
    tensors: Iterable[tuple[str, torch.Tensor]],
    spec: JobSpec,
    base_dir: Path,
    tokenizer_dir: Path,
    out: Path,
) -> Path:
    """Write ``out``: the adapter folder PEFT loads (and, with ``merge``, the merged model in
    ``out/merged``), or the full fine-tuned model, with the tokenizer; atomically. A full model's
    weights go to disk as they are gathered, one file's worth at a time."""
    adapters, finetune = spec.adapters, spec.finetune
    with staged_directory(out) as staging:
        if adapters:
            model.model.save_pretrained(str(staging), state_dict=dict(tensors), safe_serialization=True)
        else:
            config = model.model.config
            tied = ["lm_head.weight"] if getattr(config, "tie_word_embeddings", False) else []
            write_weights(tensors, staging, skip=tied)
            config.save_pretrained(str(staging))
            if getattr(model.model, "generation_config", None) is not None:
                model.model.generation_config.save_pretrained(str(staging))
        copy_tokenizer(tokenizer_dir, staging)
        if adapters and finetune is not None and finetune.merge:
            merge(base_dir, staging, staging / MERGED_DIR)
            copy_tokenizer(tokenizer_dir, staging / MERGED_DIR)
    return out


def merge(base_dir: Path, adapter_dir: Path, out: Path) -> None:
    """The base model with the adapters folded into its weights, in full precision (a QLoRA
    job's adapters merge into the unquantized base), as a plain ``transformers`` folder."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), local_files_only=True, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(out), safe_serialization=True)


def read_config(folder: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return config
