"""Preference tuning: DPO (Rafailov et al. 2023), IPO (Azar et al. 2023) and SimPO (Meng et al.
2024) on pairs of completions, computed as TRL's ``DPOTrainer`` and ``CPOTrainer`` compute them.

The policy is the fine-tuned model behind the trainer's calling convention: ``model(tokens,
targets)`` is the mean loss over the micro-batch's pairs, whose rows come chosen then rejected
(``[c0, r0, c1, r1, ...]``, see ``SampleRows``). A pair's log-likelihood is the sum of its
completion tokens' log-probabilities. The reference is the base with the adapters switched off
under LoRA (one copy of the weights, as TRL does), a frozen copy of the starting weights when every
weight trains, and none for SimPO.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shipyard.schemas.finetune_spec import DpoSection
from shipyard.training.finetune import CausalLM
from shipyard.training.samples import IGNORE

FIGURES = (
    "reward_chosen",
    "reward_rejected",
    "reward_accuracy",
    "reward_margin",
    "logps_chosen",
    "logps_rejected",
)
"""What a preference step logs beside its loss, each a mean over the step's pairs (TRL's
``rewards/chosen``, ``rewards/accuracies``, ``rewards/margins``, ``logps/chosen``...)."""


class PreferenceModel(CausalLM):
    def __init__(self, model: nn.Module, settings: DpoSection, reference: nn.Module | None) -> None:
        super().__init__(model)
        self.settings = settings
        # Outside the module tree: never trained, checkpointed, exported, or wrapped by DDP/FSDP.
        self._reference = (reference,)
        self._sums: torch.Tensor | None = None
        """Per figure, the sum over the pairs seen since the figures were last taken; then the count."""

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        del positions  # pairs are never packed
        if targets is None:
            return super().forward(tokens)
        beta = self.settings.beta
        logps, counts = completion_logps(self.model, tokens, targets)
        chosen, rejected = logps[0::2], logps[1::2]
        if self.settings.loss == "simpo":
            # Length-normalized log-likelihoods are the rewards; no reference.
            reward_c, reward_r = beta * chosen / counts[0::2], beta * rejected / counts[1::2]
            losses = -F.logsigmoid(reward_c - reward_r - self.settings.simpo_gamma)
        else:
            with torch.no_grad(), self._as_reference():
                reference, _ = completion_logps(self._reference[0] or self.model, tokens, targets)
            ratio_c, ratio_r = chosen - reference[0::2], rejected - reference[1::2]
            if self.settings.loss == "sigmoid":
                losses = -F.logsigmoid(beta * (ratio_c - ratio_r))
            else:  # IPO on per-token log ratios, as TRL (confirmed with the paper's authors)
                losses = (ratio_c / counts[0::2] - ratio_r / counts[1::2] - 1 / (2 * beta)) ** 2
            reward_c, reward_r = beta * ratio_c, beta * ratio_r
        self._note(reward_c.detach(), reward_r.detach(), chosen.detach(), rejected.detach())
        return losses.mean()

    def _as_reference(self) -> AbstractContextManager[Any]:
        """The policy with its adapters switched off, where the reference is not a model of its own."""
        if self._reference[0] is not None:
            return nullcontext()
        switch: AbstractContextManager[Any] = self.model.disable_adapter()
        return switch

    def _note(
        self, reward_c: torch.Tensor, reward_r: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor
    ) -> None:
        margin = reward_c - reward_r
        figures = torch.stack(
            [
                reward_c.sum(),
                reward_r.sum(),
                (margin > 0).float().sum(),
                margin.sum(),
                chosen.sum(),
                rejected.sum(),
            ]
        ).float()
        count = torch.tensor([float(reward_c.numel())], device=figures.device)
        found = torch.cat([figures, count])
        self._sums = found if self._sums is None else self._sums + found

    def take_figures(self) -> list[float]:
        """The sums noted since last taken (the figures, then the pair count), and start again."""
        sums, self._sums = self._sums, None
        return [0.0] * (len(FIGURES) + 1) if sums is None else [float(v) for v in sums.tolist()]

    def flops_per_token(self, seq_len: int) -> float:
        """The policy's forward and backward, and the reference's forward (2 per weight)."""
        reference = 0 if self.settings.loss == "simpo" else 2 * self.num_params()
        return super().flops_per_token(seq_len) + reference


def completion_logps(
    model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the summed log-probability of its targets (the completion) and how many there are."""
    logits = model(input_ids=tokens).logits.float()
    per_token = -F.cross_entropy(
        logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE, reduction="none"
    ).view(targets.shape)
    counts = (targets != IGNORE).sum(dim=1)
    return per_token.sum(dim=1), counts.clamp(min=1).float()


def mean_figures(sums: list[float]) -> dict[str, float]:
    """The logged figures from summed ones (all ranks'): each a mean over the pairs."""
    pairs = max(1.0, sums[-1])
    return {name: value / pairs for name, value in zip(FIGURES, sums[:-1], strict=True)}
