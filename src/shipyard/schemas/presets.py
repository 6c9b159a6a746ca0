"""LLaMA-style architecture presets: plain data, so the planner and the CLI can read them without
torch. ``vocab_size`` is a default; the tokenizer a job uses decides the real one."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelArch:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int = 32000
    max_seq_len: int = 2048
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def with_vocab(self, vocab_size: int) -> ModelArch:
        return replace(self, vocab_size=vocab_size)

    def num_params(self, *, include_embedding: bool = True) -> int:
        """Exact parameter count of the model this arch builds."""
        kv_dim = self.n_kv_heads * self.head_dim
        attention = self.dim * (2 * self.dim + 2 * kv_dim)
        mlp = 3 * self.dim * self.ffn_dim
        per_layer = attention + mlp + 2 * self.dim
        body = self.n_layers * per_layer + self.dim
        if not include_embedding:
            return body
        embedding = self.vocab_size * self.dim
        head = 0 if self.tie_embeddings else self.vocab_size * self.dim
        return body + embedding + head


PRESETS: dict[str, ModelArch] = {
    # For tests and smoke runs: trains in seconds on one CPU core.
    "llama-tiny": ModelArch(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=192,
        vocab_size=2048,
        max_seq_len=512,
        tie_embeddings=True,
    ),
    # The quickstart model: ~11 M parameters with a 4096-token vocabulary.
    "llama-12m": ModelArch(
        dim=384,
        n_layers=6,
        n_heads=6,
        n_kv_heads=2,
        ffn_dim=1024,
        vocab_size=4096,
        max_seq_len=1024,
        tie_embeddings=True,
    ),
    "llama-25m": ModelArch(
        dim=512,
        n_layers=8,
        n_heads=8,
        n_kv_heads=4,
        ffn_dim=1408,
        vocab_size=8192,
        max_seq_len=1024,
        tie_embeddings=True,
    ),
    "llama-125m": ModelArch(
        dim=768,
        n_layers=12,
        n_heads=12,
        n_kv_heads=4,
        ffn_dim=2048,
        vocab_size=32000,
    ),
    # TinyLlama-1.1B shape.
    "llama-1b": ModelArch(
        dim=2048,
        n_layers=22,
        n_heads=32,
        n_kv_heads=4,
        ffn_dim=5632,
        vocab_size=32000,
    ),
    # Llama-2-7B shape.
    "llama-7b": ModelArch(
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=32,
        ffn_dim=11008,
        vocab_size=32000,
        max_seq_len=4096,
    ),
}
