"""Cross-entropy over the vocabulary without the logits: the output head and the loss in chunks
of tokens, each chunk's gradients computed as it goes (as Liger-Kernel's fused linear
cross-entropy does, Hsu et al. 2024).

A 128 K-token vocabulary makes the logits of a micro-batch of 8 x 4096 tokens 16 GiB in fp32 (and
their gradient as much again), more than the model's weights. Here only one chunk's logits exist at
a time: the memory is ``chunk_tokens x vocab`` whatever the batch, and the backward pass scales the
gradients the forward pass already computed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from shipyard.schemas.runtime import loss_chunk_tokens
from shipyard.training.samples import IGNORE as IGNORE_INDEX


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        counted = (targets != IGNORE_INDEX).sum()
        denominator = counted.clamp(min=1).float()
        compute_dtype = torch.get_autocast_dtype(hidden.device.type)
        autocast = torch.is_autocast_enabled(hidden.device.type)
        w = weight.to(compute_dtype) if autocast else weight
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk):
                h = hidden[start : start + chunk]
                h_c = h.to(w.dtype)
                t = targets[start : start + chunk]
                logits = (h_c @ w.t()).float()
                # log-softmax's gradient is softmax minus the one-hot target; ignored rows get none.
                log_z = torch.logsumexp(logits, dim=-1, keepdim=True)
                kept = (t != IGNORE_INDEX).unsqueeze(-1)
                safe = t.clamp(min=0).unsqueeze(-1)
                loss += ((log_z - logits.gather(-1, safe)) * kept).sum()
                grad_logits = torch.exp_(logits.sub_(log_z))
                grad_logits.scatter_add_(-1, safe, -torch.ones_like(log_z))
                grad_logits.mul_(kept / denominator)
                g = grad_logits.to(w.dtype)
                grad_hidden[start : start + chunk] = (g @ w).to(hidden.dtype)
                grad_weight += g.t() @ h_c  # a 16-bit matmul under autocast, summed in fp32
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return loss / denominator

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        grad_hidden, grad_weight = ctx.saved_tensors
        return (
            grad_hidden * grad_loss.to(grad_hidden.dtype),
            grad_weight * grad_loss.to(grad_weight.dtype),
            None,
            None,
        )


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int | None = None
) -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T, targets)`` (mean over the targets that are not -100),
    never holding more than ``chunk`` tokens' logits. ``hidden``: (tokens, dim); ``weight``:
    (vocab, dim)."""
    chunk = chunk or loss_chunk_tokens(weight.shape[0])
    if not torch.is_grad_enabled() or not (hidden.requires_grad or weight.requires_grad):
        return _plain(hidden, weight, targets, chunk)
    loss: torch.Tensor = _LinearCrossEntropy.apply(hidden, weight, targets, chunk)  # type: ignore[no-untyped-call]
    return loss


def _plain(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """Evaluation: the same loss, chunk by chunk, with nothing kept for a backward pass."""
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk):
        logits = F.linear(hidden[start : start + chunk], weight).float()
        total += F.cross_entropy(logits, targets[start : start + chunk], reduction="sum")
    return total / (targets != IGNORE_INDEX).sum().clamp(min=1)
