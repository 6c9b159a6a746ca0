"""Activation checkpointing changes what the backward pass keeps, not what it computes; what it
keeps is what the planner counts for Shipyard's runtime."""

from __future__ import annotations

import pytest
import torch

from shipyard.planner.memory import runtime_bytes_per_token
from shipyard.planner.shapes import shape_of
from shipyard.schemas.presets import ModelArch
from shipyard.schemas.training_spec import ActivationCheckpointingSection
from shipyard.training.model import Transformer
from shipyard.training.parallelize import _checkpoint_activations, clean_name

ARCH = ModelArch(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=352, vocab_size=256, max_seq_len=128)
SHAPE = shape_of(ARCH)
BATCH, SEQ = 3, 96
"""Odd sizes: a kept tensor whose first dimension is 3 or 288 is an activation, not a weight."""

MODES = {
    "none": ActivationCheckpointingSection(mode="none"),
    "selective": ActivationCheckpointingSection(mode="selective"),
    "blocks": ActivationCheckpointingSection(mode="selective", selective="blocks", every=2),
    "full": ActivationCheckpointingSection(mode="full"),
}


def kept_bytes(model: Transformer, tokens: torch.Tensor) -> int:
    """Bytes of the activations autograd keeps for the backward pass (each storage once)."""
    seen: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        if t.dim() and t.shape[0] in (BATCH, BATCH * SEQ):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    blocks_input = model.model.embed_tokens(tokens).detach().requires_grad_()
    cos, sin = model.model.rotary(SEQ)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t), torch.autocast("cpu", torch.bfloat16):
        x = blocks_input
        for block in model.model.layers:
            x = block(x, cos, sin)
    seen.pop(blocks_input.untyped_storage().data_ptr(), None)  # the input, kept by its owner
    return sum(seen.values())


def checkpointed(mode: str) -> Transformer:
    model = Transformer(ARCH)
    _checkpoint_activations(model, MODES[mode])
    return model


@pytest.mark.parametrize("mode", list(MODES))
def test_what_each_mode_keeps_is_what_the_planner_counts(mode: str) -> None:
    tokens = torch.randint(0, ARCH.vocab_size, (BATCH, SEQ))
    measured = kept_bytes(checkpointed(mode), tokens)

    def planned(recompute: str) -> float:
        per_token = runtime_bytes_per_token(
            SHAPE, tp=1, recompute=recompute, activation=2, residual=4, fused_norm=False
        )
        return per_token * BATCH * SEQ

    layers = ARCH.n_layers
    expected = {
        "none": layers * planned("none"),
        "selective": layers * planned("selective"),
        # A recomputed block keeps its input alone; the first block's input is the embedding's
        # output, which the caller keeps.
        "blocks": layers // 2 * planned("none") + (layers // 2 - 1) * planned("full"),
        "full": (layers - 1) * planned("full"),
    }[mode]
    assert measured == pytest.approx(expected, rel=0.03)


def test_checkpointing_saves_memory_in_the_order_of_its_modes() -> None:
    tokens = torch.randint(0, ARCH.vocab_size, (BATCH, SEQ))
    kept = [kept_bytes(checkpointed(mode), tokens) for mode in ("none", "selective", "blocks", "full")]
    assert kept == sorted(kept, reverse=True) and kept[-1] < kept[0] / 10


def test_checkpointing_changes_no_loss_and_no_gradient() -> None:
    tokens = torch.randint(0, ARCH.vocab_size, (BATCH, SEQ))
    reference = Transformer(ARCH)
    expected_loss = reference(tokens, tokens)
    expected_loss.backward()
    for mode in ("selective", "blocks", "full"):
        model = checkpointed(mode)
        loss = model(tokens, tokens)
        loss.backward()
        assert loss.item() == expected_loss.item(), mode
        grads = {clean_name(name): p.grad for name, p in model.named_parameters()}
        for name, param in reference.named_parameters():
            assert torch.equal(grads[name], param.grad), (mode, name)
