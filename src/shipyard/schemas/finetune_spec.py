"""The job spec's ``finetune`` section: the method (full, LoRA, QLoRA, DPO) and its settings."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from shipyard.schemas.spec_base import (
    FieldName,
    Section,
)


class LoraSection(Section):
    """Low-rank adapters (Hu et al. 2021)."""

    rank: Annotated[int, Field(gt=0, le=4096)] = 16
    """The adapters' rank r: trainable parameters grow with it."""
    alpha: Annotated[int, Field(gt=0, le=1 << 20)] = 32
    """The scale of the adapters' update is alpha / rank."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.05
    """Dropout on the adapters' input."""
    target_modules: list[FieldName] | None = Field(default=None, min_length=1, max_length=64)
    """Names of the linear layers that get adapters; default: every attention and MLP projection
    of the model's family (``q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj`` for
    Llama, Qwen2, Mistral and Gemma)."""
    dora: bool = False
    """Weight-decomposed adapters (DoRA, Liu et al. 2024): a learned magnitude per output."""


FinetuneMethod = Literal["full", "lora", "qlora", "dpo"]
TrainedWeights = Literal["full", "lora", "qlora"]
PreferenceLoss = Literal["sigmoid", "ipo", "simpo"]


class DpoSection(Section):
    """Preference tuning on ``{prompt, chosen, rejected}`` pairs (``data.format: preference``)."""

    weights: TrainedWeights = "lora"
    """What is trained: ``lora`` adapters (the reference is the base with them switched off, as
    TRL does, with no second copy in memory), ``qlora``, or ``full`` (with a frozen copy of the
    starting weights as the reference)."""
    beta: Annotated[float, Field(gt=0, le=100)] = 0.1
    """How far the policy may move from the reference (DPO's β; IPO's τ)."""
    loss: PreferenceLoss = "sigmoid"
    """``sigmoid``: DPO (Rafailov et al. 2023); ``ipo``: IPO's squared loss on per-token log
    ratios (Azar et al. 2023, as TRL computes it); ``simpo``: SimPO's reference-free loss on
    length-normalized log-likelihoods with a margin (Meng et al. 2024), which loads no reference."""
    simpo_gamma: Annotated[float, Field(ge=0, le=100)] = 0.5
    """``simpo``: the target margin γ between chosen and rejected rewards."""


class FinetuneSection(Section):
    """How an existing model is adapted."""

    method: FinetuneMethod = "lora"
    """``full`` trains every weight; ``lora`` trains low-rank adapters beside frozen weights;
    ``qlora`` does so over 4-bit NF4 weights (bitsandbytes, NVIDIA GPUs); ``dpo`` tunes on
    preference pairs, training what ``dpo.weights`` says."""
    dpo: DpoSection = DpoSection()
    """``dpo``: the weights it trains, β and the loss."""
    lora: LoraSection = LoraSection()
    """The adapters of ``lora`` and ``qlora``."""
    gradient_checkpointing: bool = False
    """The older spelling of ``training.activation_checkpointing: full``."""
    merge: bool = False
    """``lora``/``qlora``: also export the base model with the adapters merged in (``export/merged``)."""
