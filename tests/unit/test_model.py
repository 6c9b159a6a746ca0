from __future__ import annotations

import itertools

import pytest
import torch

from shipyard.schemas.presets import PRESETS, ModelArch
from shipyard.schemas.training_spec import ScheduleSection
from shipyard.training.model import Transformer
from shipyard.training.schedule import lr_factor

SMALL = ModelArch(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=97, max_seq_len=64)


@pytest.mark.parametrize("preset", ["llama-tiny", "llama-12m"])
def test_parameter_count_matches_the_built_model(preset: str) -> None:
    arch = PRESETS[preset]
    model = Transformer(arch)
    assert sum(p.numel() for p in model.parameters()) == arch.num_params()


def test_the_7b_preset_has_llama2_7b_shape() -> None:
    # Llama-2-7B has 6,738,415,616 parameters.
    assert PRESETS["llama-7b"].num_params() == 6_738_415_616


def test_quickstart_model_is_10_to_20m_parameters() -> None:
    assert 10e6 <= PRESETS["llama-12m"].with_vocab(4096).num_params() <= 20e6


def test_logits_shape_and_loss_of_a_fresh_model_is_near_uniform() -> None:
    torch.manual_seed(0)
    model = Transformer(SMALL)
    tokens = torch.randint(0, SMALL.vocab_size, (3, 16))
    assert model(tokens).shape == (3, 16, SMALL.vocab_size)
    loss = model(tokens, tokens).detach()
    assert abs(float(loss) - torch.log(torch.tensor(97.0)).item()) < 0.2


def test_attention_is_causal() -> None:
    torch.manual_seed(0)
    model = Transformer(SMALL).eval()
    a = torch.randint(0, SMALL.vocab_size, (1, 12))
    b = a.clone()
    b[0, 8:] = (b[0, 8:] + 1) % SMALL.vocab_size  # change only the future
    with torch.no_grad():
        assert torch.equal(model(a)[0, :8], model(b)[0, :8])
        assert not torch.equal(model(a)[0, 8:], model(b)[0, 8:])


def test_grouped_query_attention_has_fewer_key_value_weights() -> None:
    model = Transformer(SMALL)
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.weight.shape == (32, 32)
    assert attention.k_proj.weight.shape == (16, 32)  # 2 of 4 heads


def test_tied_embeddings_share_storage() -> None:
    model = Transformer(PRESETS["llama-tiny"])
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_too_long_sequences_are_refused() -> None:
    with pytest.raises(ValueError, match="exceeds max_seq_len 64"):
        Transformer(SMALL)(torch.zeros(1, 65, dtype=torch.long))


def test_flops_per_token_is_6n_plus_attention() -> None:
    model = Transformer(SMALL)
    n = SMALL.num_params(include_embedding=False) + SMALL.vocab_size * SMALL.dim
    assert model.flops_per_token(16) == 6 * n + 12 * 2 * 4 * 8 * 16


def test_warmup_then_cosine_to_the_floor() -> None:
    schedule = ScheduleSection(warmup_steps=10, decay="cosine", min_lr_ratio=0.1)
    factors = [lr_factor(s, 100, schedule) for s in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(factors[10:]))


def test_linear_and_constant_decay() -> None:
    linear = ScheduleSection(warmup_steps=0, decay="linear", min_lr_ratio=0.0)
    assert lr_factor(0, 11, linear) == 1.0 and lr_factor(10, 11, linear) == 0.0
    assert lr_factor(5, 11, linear) == pytest.approx(0.5)
    constant = ScheduleSection(warmup_steps=0, decay="constant")
    assert {lr_factor(s, 50, constant) for s in range(50)} == {1.0}
