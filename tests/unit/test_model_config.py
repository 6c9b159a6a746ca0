"""The shape of a model read from its config.json as ``transformers`` itself reads it, for every
family the fine-tuning tests build (and the spellings each family uses)."""

from __future__ import annotations

import pytest

from shipyard.errors import InvalidSpec
from shipyard.schemas.model_config import model_shape
from tests.support import tiny_models


@pytest.mark.parametrize("family", tiny_models.FAMILIES)
def test_each_familys_shape_is_what_transformers_builds(family: str) -> None:
    from transformers import AutoModelForCausalLM

    config = tiny_models.config(family, tiny_models.VOCAB)
    shape = model_shape(config.to_dict(), "config.json")
    # transformers' attribute maps give every family the same names.
    assert shape.hidden_size == config.hidden_size
    assert shape.num_hidden_layers == config.num_hidden_layers
    assert shape.num_attention_heads == config.num_attention_heads
    assert shape.vocab_size == config.vocab_size

    model = AutoModelForCausalLM.from_config(config)
    dims = {d for p in model.parameters() if p.dim() == 2 for d in p.shape}
    assert shape.intermediate_size in dims  # the MLP's inner width (4 x hidden where unsaid)
    head_dim = shape.hidden_size // shape.num_attention_heads
    kv = shape.num_key_value_heads * head_dim
    fused = (shape.num_attention_heads + 2 * shape.num_key_value_heads) * head_dim
    assert kv in dims or fused in dims or family in ("gemma", "gemma2", "qwen3")
    assert model.get_input_embeddings().weight.shape == (shape.vocab_size, shape.hidden_size)


def test_falcons_multi_query_shares_one_key_value_head() -> None:
    config = tiny_models.config("falcon", tiny_models.VOCAB).to_dict()
    assert model_shape(config, "c").num_key_value_heads == 1
    config.pop("num_key_value_heads")  # as configs without transformers' derived figure read
    assert model_shape(config, "c").num_key_value_heads == 1
    config["new_decoder_architecture"] = True
    config["num_kv_heads"] = 2
    assert model_shape(config, "c").num_key_value_heads == 2


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "bert-ish", "dim": 8}, "names no hidden_size (hidden_size, n_embd"),
        ({"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": -1}, "`vocab_size`: Input should be"),
        ({"n_embd": 64, "n_layer": 2, "n_head": "4", "vocab_size": 9}, "`num_attention_heads`"),
        ([1], "Input should be an object"),
    ],
)
def test_a_config_that_describes_no_decoder_is_refused_with_the_reason(config: object, message: str) -> None:
    with pytest.raises(InvalidSpec, match=message.replace("(", r"\(")):
        model_shape(config, "config.json")
