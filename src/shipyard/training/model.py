"""A LLaMA-style decoder: RMSNorm, rotary position embeddings, SwiGLU, grouped-query attention.

Module names follow Hugging Face's ``LlamaForCausalLM`` one for one, so the export to Hugging Face
format is a file write, not a rename table. References: Touvron et al. 2023 (LLaMA), Su et al. 2021
(RoPE), Shazeer 2020 (SwiGLU), Ainslie et al. 2023 (GQA). Single-device code only: parallelism is
applied from outside (see ``parallel.py``).
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from shipyard.schemas.presets import ModelArch
from shipyard.training.loss import linear_cross_entropy
from shipyard.training.samples import attention_mask


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as LLaMA does (one fused kernel on CUDA). Under autocast the result is
        # cast to the 16-bit type here, once: the projections that read it then share one copy
        # instead of each keeping its own for the backward pass.
        out = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        device = x.device.type
        return (
            out.to(torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else out.type_as(x)
        )


class RotaryEmbedding(nn.Module):
    """cos/sin tables for the "rotate half" RoPE layout that Hugging Face's LLaMA uses."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.max_seq_len, self.theta = head_dim, max_seq_len, theta
        # Not persistent: derived from the config, so checkpoints and exports stay small.
        self.register_buffer("cos", torch.empty(max_seq_len, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_seq_len, head_dim), persistent=False)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        """Compute the tables where the buffers are (again after ``to_empty`` off the meta device)."""
        if self.cos.is_meta:
            return
        device = self.cos.device
        dims = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device)
        inv_freq = 1.0 / (self.theta ** (dims / self.head_dim))
        freqs = torch.outer(torch.arange(self.max_seq_len, dtype=torch.float32, device=device), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        with torch.no_grad():
            self.cos.copy_(angles.cos())
            self.sin.copy_(angles.sin())

    def forward(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[:seq_len], self.sin[:seq_len]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos.to(x.dtype) + _rotate_half(x) * sin.to(x.dtype)


_NATIVE_GQA_DEVICES = ("cpu", "cuda")


class Attention(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = arch.n_heads, arch.n_kv_heads, arch.head_dim
        self.q_proj = nn.Linear(arch.dim, arch.n_heads * arch.head_dim, bias=False)
        self.k_proj = nn.Linear(arch.dim, arch.n_kv_heads * arch.head_dim, bias=False)
        self.v_proj = nn.Linear(arch.dim, arch.n_kv_heads * arch.head_dim, bias=False)
        self.o_proj = nn.Linear(arch.n_heads * arch.head_dim, arch.dim, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        # Heads as -1: under tensor parallelism each rank holds n_heads / tp of them.
        q = self.q_proj(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # Each key/value head serves n_heads / n_kv_heads query heads (GQA). CPU and CUDA kernels
        # take the groups as they are; elsewhere the shared heads are copied out first.
        native_gqa = x.device.type in _NATIVE_GQA_DEVICES
        if self.n_kv_heads != self.n_heads and not native_gqa:
            repeat = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=native_gqa
        )
        projected: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))
        return projected


class MLP(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(arch.dim, arch.ffn_dim, bias=False)
        self.up_proj = nn.Linear(arch.dim, arch.ffn_dim, bias=False)
        self.down_proj = nn.Linear(arch.ffn_dim, arch.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        down: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return down


class Block(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.dim, arch.norm_eps)
        self.self_attn = Attention(arch)
        self.post_attention_layernorm = RMSNorm(arch.dim, arch.norm_eps)
        self.mlp = MLP(arch)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        mlp_out: torch.Tensor = self.mlp(self.post_attention_layernorm(x))
        return x + mlp_out


class Decoder(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.dim)
        self.layers = nn.ModuleList(Block(arch) for _ in range(arch.n_layers))
        self.norm = RMSNorm(arch.dim, arch.norm_eps)
        self.rotary = RotaryEmbedding(arch.head_dim, arch.max_seq_len, arch.rope_theta)


class Transformer(nn.Module):
    """``model.*`` + ``lm_head``, the layout of ``LlamaForCausalLM``."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.arch = arch
        self.model = Decoder(arch)
        self.lm_head = nn.Linear(arch.dim, arch.vocab_size, bias=False)
        if arch.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.fused_loss = True
        """Compute the loss chunk by chunk without the logits (``loss.py``); tensor parallelism
        turns it off and computes it on the vocabulary shards instead."""
        self.reset_parameters()

    def reset_parameters(self, seed: int = 0) -> None:
        """Every weight drawn from its own generator, seeded by ``seed`` and its name: the same
        model however it is later split over devices (``initial_value``)."""
        with torch.no_grad():
            for name, param in self.named_parameters():
                if not param.is_meta:
                    param.copy_(self.initial_value(name, param.shape, seed, param.device))

    def initial_value(self, name: str, shape: torch.Size, seed: int, device: torch.device) -> torch.Tensor:
        """The full initial tensor of parameter ``name``: norms at one; every other weight normal
        with std 0.02, GPT-2's residual projections shrunk with depth."""
        if len(shape) < 2:
            return torch.ones(shape, device=device)
        scale = (
            1 / math.sqrt(2 * self.arch.n_layers)
            if name.endswith(("o_proj.weight", "down_proj.weight"))
            else 1.0
        )
        generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        return torch.randn(shape, generator=generator, device=device) * (0.02 * scale)

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits for ``tokens``, or the mean cross-entropy loss over the targets that are not
        -100 when ``targets`` are given. ``positions`` (packed samples): each token's position in
        its sample; attention then stays within each sample."""
        seq = tokens.shape[1]
        if seq > self.arch.max_seq_len:
            raise ValueError(f"sequence of {seq} tokens exceeds max_seq_len {self.arch.max_seq_len}")
        mask = None
        if positions is None:
            cos, sin = self.model.rotary(seq)
        else:
            cos, sin = self.model.rotary.cos[positions][:, None], self.model.rotary.sin[positions][:, None]
            mask = attention_mask(positions)
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        hidden = self.model.norm(x)
        if targets is not None and self.fused_loss:
            return linear_cross_entropy(hidden.flatten(0, 1), self.lm_head.weight, targets.reshape(-1))
        logits: torch.Tensor = self.lm_head(hidden)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.reshape(-1))

    def num_params(self) -> int:
        return self.arch.num_params()

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per matmul weight (forward + backward) plus attention
        scores, as in PaLM appendix B. The embedding lookup does no matmul; the head does."""
        arch = self.arch
        matmul_params = arch.num_params(include_embedding=False) + arch.vocab_size * arch.dim
        attention = 12 * arch.n_layers * arch.n_heads * arch.head_dim * seq_len
        return 6 * matmul_params + attention
