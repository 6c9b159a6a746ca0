"""Model shapes: what the planner needs to know about a decoder-only transformer."""

from __future__ import annotations

import math
from dataclasses import dataclass

from shipyard.errors import InvalidSpec
from shipyard.schemas.presets import ModelArch

HEAD_DIM = 128
"""Standard head width of GPT-3, LLaMA and most models since."""
WIDTH_PER_LAYER = 128
"""hidden / layers of GPT-3 175B and LLaMA 7B: the aspect ratio used when only a size is given."""
DEFAULT_VOCAB = 32000


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    params: float
    """Total parameters, embeddings included (what model cards quote)."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    ffn_hidden: int
    derived: tuple[str, ...] = ()
    """Which of the fields above were derived rather than given (shown as assumptions)."""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def shape_of(arch: ModelArch) -> ModelShape:
    """The shape of a model Shipyard builds (a preset, or a fine-tuned folder's config)."""
    return ModelShape(
        params=float(arch.num_params()),
        layers=arch.n_layers,
        hidden=arch.dim,
        heads=arch.n_heads,
        kv_heads=arch.n_kv_heads,
        vocab=arch.vocab_size,
        ffn_hidden=arch.ffn_dim,
    )


def model_shape(
    params: float,
    *,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    vocab: int | None = None,
) -> ModelShape:
    """A shape from the parameter count, filling what is not given with standard aspect ratios.

    A dense decoder has about 12 * layers * hidden**2 parameters outside the embeddings; with
    hidden = 128 * layers that gives layers = (params / 196608) ** (1/3).
    """
    positive("--params", params, at_most=1e15)
    for flag, value in (
        ("--layers", layers),
        ("--hidden", hidden),
        ("--heads", heads),
        ("--kv-heads", kv_heads),
    ):
        if value is not None:
            positive(flag, value, at_most=1e9)
    derived: list[str] = []
    vocab_size = vocab if vocab is not None else DEFAULT_VOCAB
    if vocab is None:
        derived.append("vocab")
    positive("--vocab", vocab_size, at_most=1e9)
    if layers is None and hidden is None:
        layers = _round_to(
            max(1.0, (params / (12 * WIDTH_PER_LAYER**2)) ** (1 / 3)), 4 if params > 1e9 else 1
        )
        derived.append("layers")
    if hidden is None:
        assert layers is not None
        # Solve params = 12*L*h^2 + 2*V*h (untied embeddings) for h.
        a, b = 12 * layers, 2 * vocab_size
        width = (-b + math.sqrt(b * b + 4 * a * params)) / (2 * a)
        hidden = max(HEAD_DIM, _round_to(width, 2 * HEAD_DIM if width > 1024 else HEAD_DIM))
        derived.append("hidden")
    if layers is None:
        layers = max(1, round((params - 2 * vocab_size * hidden) / (12 * hidden**2)))
        derived.append("layers")
    if heads is None:
        heads = max(1, hidden // HEAD_DIM)
        derived.append("heads")
    if hidden % heads:
        raise InvalidSpec(
            f"--heads {heads} does not divide --hidden {hidden}",
            hint=f"pick a head count that divides {hidden}, e.g. {hidden // HEAD_DIM or 1}",
        )
    kv = heads if kv_heads is None else kv_heads
    if heads % kv:
        raise InvalidSpec(
            f"--kv-heads {kv} does not divide --heads {heads}",
            hint="grouped-query attention needs heads to be a multiple of kv-heads",
        )
    return ModelShape(
        params=float(params),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv,
        vocab=vocab_size,
        ffn_hidden=4 * hidden,
        derived=tuple(derived),
    )


def _round_to(value: float, multiple: int) -> int:
    return max(multiple, round(value / multiple) * multiple)


LARGEST = 1e18
"""Beyond any real model, cluster or budget, and far inside a float: a bound on every figure."""


def positive(flag: str, value: float, at_most: float = LARGEST) -> None:
    """Refuse a figure that is not a finite number above zero and at most ``at_most``."""
    if not 0 < value <= at_most:  # NaN fails both comparisons
        raise InvalidSpec(
            f"{flag} must be above zero and at most {at_most:g}, got {value:g}",
            hint=f"give {flag} a finite number above zero",
        )
