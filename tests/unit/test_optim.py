"""AdamW with bf16 moments follows AdamW with fp32 ones, at half their memory."""

from __future__ import annotations

import torch
from torch import nn

from shipyard.training.optim import AdamWBf16Moments


def test_bf16_moments_follow_adamw_and_take_half_the_memory() -> None:
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
    ours = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
    ours.load_state_dict(reference.state_dict())
    settings = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    adamw = torch.optim.AdamW(reference.parameters(), **settings)  # type: ignore[arg-type]
    bf16 = AdamWBf16Moments(ours.parameters(), **settings)  # type: ignore[arg-type]
    data = torch.randn(64, 32)
    for _ in range(30):
        for model, optimizer in ((reference, adamw), (ours, bf16)):
            optimizer.zero_grad()
            model(data).pow(2).mean().backward()
            optimizer.step()
    for a, b in zip(reference.parameters(), ours.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=2e-2, atol=2e-3)
    moments = [t for state in bf16.state.values() for k, t in state.items() if k != "step"]
    assert {t.dtype for t in moments} == {torch.bfloat16}
    fp32 = sum(t.nbytes for state in adamw.state.values() for k, t in state.items() if k != "step")
    assert sum(t.nbytes for t in moments) == fp32 // 2
