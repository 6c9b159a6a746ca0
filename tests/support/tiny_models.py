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
FAMILIES = ("llama", "qwen2", "mistral")
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
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    shape: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    }
    shape.update(overrides)
    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}
    return classes[family](**shape)


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
