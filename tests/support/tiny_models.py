"""Tiny Hugging Face models of real families, built offline: a config from ``transformers``, random
weights, and a byte-level BPE tokenizer trained on local text, with a ChatML chat template (the
one Qwen2 ships). Saved as folders, exactly as ``save_pretrained`` writes a downloaded model."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tests.builders import STDLIB

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
FAMILY_SHAPES: dict[str, dict[str, Any]] = {
    "llama": LLAMA_SHAPE,
    "qwen2": LLAMA_SHAPE,
    "mistral": LLAMA_SHAPE,
    "gemma": {**LLAMA_SHAPE, "head_dim": 16},
    "gemma2": {**LLAMA_SHAPE, "head_dim": 16},
    "phi3": LLAMA_SHAPE,
    "gpt_neox": {**LLAMA_SHAPE, "num_key_value_heads": None},
    "olmo": LLAMA_SHAPE,
    "stablelm": LLAMA_SHAPE,
    "qwen3": {**LLAMA_SHAPE, "head_dim": 16},
    # Their own spellings: no intermediate size (4 x hidden), GPT-2's Conv1D projections, Falcon's
    # one shared key/value head.
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256, "tie_word_embeddings": False},
    "falcon": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    },
    "opt": {
        "hidden_size": 64,
        "ffn_dim": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "word_embed_proj_dim": 64,
        "max_position_embeddings": 256,
    },
}
FAMILIES = tuple(FAMILY_SHAPES)
"""Every family fine-tuned through ``jobs submit``: those users bring most, and two (GPT-2,
Falcon) whose configs spell their shape otherwise."""
VOCAB = 512


def tokenizer(folder: Path) -> Any:
    """A 512-token BPE tokenizer with end, padding and chat-turn tokens, saved in ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    texts = [p.read_text(errors="replace") for p in sorted((STDLIB / "json").glob("*.py"))]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|pad|>", unk_token="<|endoftext|>"
    )
    fast.chat_template = CHATML
    fast.save_pretrained(str(folder))
    return fast


def config(family: str, vocab_size: int, **overrides: Any) -> Any:
    from transformers import AutoConfig

    shape = {key: value for key, value in FAMILY_SHAPES[family].items() if value is not None}
    # A tiny vocabulary holds none of the family's own special token ids.
    specials = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    return AutoConfig.for_model(family, vocab_size=vocab_size, **specials, **{**shape, **overrides})


def build(folder: Path, family: str, seed: int = 0, **overrides: Any) -> Path:
    """A randomly initialised ``family`` model and its tokenizer, saved in ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(folder)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(family, len(tok), **overrides))
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


COLORS = {
    "apple": "red",
    "banana": "yellow",
    "grass": "green",
    "sky": "blue",
    "coal": "black",
    "snow": "white",
}


def instruction_records(count: int, seed: int = 0) -> list[dict[str, str]]:
    """``{prompt, response}`` records with a pattern a tiny model learns in a few steps."""
    rng = random.Random(seed)
    things = sorted(COLORS)
    out = []
    for _ in range(count):
        a, b = rng.sample(things, 2)
        out.append({"prompt": f"What colors are {a} and {b}?", "response": f"{COLORS[a]} and {COLORS[b]}"})
    return out


def preference_records(count: int, seed: int = 0) -> list[dict[str, str]]:
    """``{prompt, chosen, rejected}`` pairs: the right colors chosen over two others."""
    rng = random.Random(seed)
    colors = sorted(set(COLORS.values()))
    pairs = []
    for r in instruction_records(count, seed):
        wrong = " and ".join(rng.sample(colors, 2))
        pairs.append({"prompt": r["prompt"] + "\n", "chosen": r["response"], "rejected": wrong})
    return pairs


def chat_records(count: int, seed: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "system", "content": "Answer with colors."},
                {"role": "user", "content": r["prompt"]},
                {"role": "assistant", "content": r["response"]},
            ]
        }
        for r in instruction_records(count, seed)
    ]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
