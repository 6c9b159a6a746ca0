"""The shape of a Hugging Face causal LM, read from its ``config.json`` whatever its family calls
each figure: GPT-2 says ``n_embd`` and ``n_layer``, Falcon ``ffn_hidden_size`` and ``num_kv_heads``,
Llama ``hidden_size`` and ``intermediate_size``. The names are those ``transformers``' config
classes map onto one another (their ``attribute_map``); the unit test checks the reading against
``transformers`` for every family it builds. No torch, no ``transformers``: the server reads this
at submit, and the file is the caller's, so every figure is typed and bounded."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shipyard.errors import InvalidSpec
from shipyard.schemas.documents import describe_error
from shipyard.schemas.presets import ModelArch

Size = Annotated[int, Field(strict=True, gt=0, le=1 << 24)]

SPELLINGS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "model_dim"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    # Absent or null in GPT-2, GPT-J and Falcon configs: their MLP is then 4 x hidden.
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim", "d_ff"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv"),
}
REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


class ModelShape(BaseModel):
    """The figures the planner and the checkpoint description need, under one spelling."""

    model_config = ConfigDict(extra="forbid")

    hidden_size: Size
    num_hidden_layers: Size
    num_attention_heads: Size
    num_key_value_heads: Size
    intermediate_size: Size
    vocab_size: Size
    tie_word_embeddings: bool

    def arch(self) -> ModelArch:
        return ModelArch(
            dim=self.hidden_size,
            n_layers=self.num_hidden_layers,
            n_heads=self.num_attention_heads,
            n_kv_heads=self.num_key_value_heads,
            ffn_dim=self.intermediate_size,
            vocab_size=self.vocab_size,
            tie_embeddings=self.tie_word_embeddings,
        )


def _first(config: dict[str, Any], key: str) -> Any:
    return next((config[name] for name in SPELLINGS[key] if config.get(name) is not None), None)


def model_shape(config: object, where: str) -> ModelShape:
    """The shape ``config`` (a parsed ``config.json``) describes; ``where`` names the file in errors."""
    if not isinstance(config, dict):
        raise InvalidSpec(f"{where}: Input should be an object", hint="restore the model's config.json")
    kind = config.get("model_type") or "model"
    missing = [key for key in REQUIRED if _first(config, key) is None]
    if missing:
        looked = "; ".join(f"{key} ({', '.join(SPELLINGS[key])})" for key in missing)
        raise InvalidSpec(
            f"{where} of this {kind} names no {looked}: it does not describe a decoder's shape",
            hint="give the folder of a causal language model as save_pretrained writes it",
        )
    heads = _first(config, "num_attention_heads")
    kv_heads = _first(config, "num_key_value_heads")
    # Falcon's and GPT-BigCode's multi-query attention shares one key/value head, whatever
    # num_kv_heads says, unless Falcon's new decoder (grouped queries) is on.
    if config.get("multi_query") and not config.get("new_decoder_architecture"):
        kv_heads = 1
    hidden = _first(config, "hidden_size")
    ffn = _first(config, "intermediate_size")
    found = {
        "hidden_size": hidden,
        "num_hidden_layers": _first(config, "num_hidden_layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": heads if kv_heads is None else kv_heads,
        "intermediate_size": 4 * hidden if ffn is None and isinstance(hidden, int) else ffn,
        "vocab_size": _first(config, "vocab_size"),
        # transformers' own default, which configs that tie their head leave unsaid.
        "tie_word_embeddings": config.get("tie_word_embeddings", True),
    }
    try:
        return ModelShape.model_validate(found)
    except ValidationError as exc:
        problems = "; ".join(describe_error(error, ModelShape) for error in exc.errors())
        raise InvalidSpec(f"{where} {problems}", hint="restore the model's config.json") from None
