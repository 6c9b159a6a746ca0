"""What Shipyard's training runtime does, as plain numbers the planner counts with (the runtime
itself, ``shipyard.training``, is not importable from the planner)."""

from __future__ import annotations

from typing import Any

LOSS_CHUNK_BYTES = 256 * 2**20
"""The loss is computed over the vocabulary one chunk of tokens at a time (``training/loss.py``):
the logits of one chunk, fp32, are at most this large."""


def loss_chunk_tokens(vocab: int) -> int:
    """Tokens per chunk of the loss: 2,048 of a 32 K vocabulary, 512 of 128 K."""
    return max(1, LOSS_CHUNK_BYTES // (4 * vocab))


FUSED_NORM_VENDORS = ("nvidia", "amd")
"""Where ``F.rms_norm`` runs as one kernel that keeps only its input and the inverse RMS for the
backward pass; elsewhere (the CPU) it also keeps the normalised input."""


def runs_on_shipyard_llama(config: dict[str, Any], method: str | None) -> bool:
    """Whether Shipyard's own LLaMA trains a model of this ``config.json``: full fine-tuning of a
    plain LLaMA (no rope scaling, biases or other activation), which it does faster than
    ``transformers`` and can split with tensor parallelism. Presets always do."""
    return (
        method == "full"
        and config.get("model_type") == "llama"
        and not config.get("rope_scaling")
        and not config.get("attention_bias")
        and not config.get("mlp_bias")
        and config.get("hidden_act", "silu") == "silu"
    )
