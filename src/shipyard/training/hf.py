"""Hugging Face format: export a trained model, and load one (a Shipyard export or any local
LLaMA-architecture directory) to fine-tune or sample from."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import torch

from shipyard.errors import InvalidSpec
from shipyard.schemas.presets import ModelArch
from shipyard.training._atomic import staged_directory
from shipyard.training.data import EOS
from shipyard.training.model import Transformer

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
)


def hf_config(arch: ModelArch, eos_id: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.dim,
        "intermediate_size": arch.ffn_dim,
        "num_hidden_layers": arch.n_layers,
        "num_attention_heads": arch.n_heads,
        "num_key_value_heads": arch.n_kv_heads,
        "head_dim": arch.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": arch.max_seq_len,
        "rms_norm_eps": arch.norm_eps,
        # Both spellings: older transformers read rope_theta, newer rope_parameters.
        "rope_theta": arch.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope_theta},
        "tie_word_embeddings": arch.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


EXPORT_SHARD_BYTES = 2 * 2**30
"""Weights per safetensors file of an export: what one process holds while writing it."""


def write_weights(
    tensors: Iterable[tuple[str, torch.Tensor]], folder: Path, skip: Iterable[str] = ()
) -> None:
    """Tensors into safetensors files of at most ``EXPORT_SHARD_BYTES`` each, as they arrive, in
    fp32: ``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` with the index
    ``transformers`` reads. Nothing but the file being filled is held in memory."""
    from safetensors.torch import save_file

    skipped = set(skip)
    batch: dict[str, torch.Tensor] = {}
    files: list[tuple[str, list[str]]] = []
    weight_map: dict[str, str] = {}
    size = total = 0

    def flush() -> None:
        nonlocal batch, size
        if batch:
            name = f"part-{len(files):05d}.safetensors"
            save_file(batch, str(folder / name), metadata={"format": "pt"})
            files.append((name, list(batch)))
            batch, size = {}, 0

    for name, tensor in tensors:
        if name in skipped:
            continue
        value = tensor.detach().to("cpu", torch.float32).contiguous()
        if size and size + value.nbytes > EXPORT_SHARD_BYTES:
            flush()
        batch[name] = value
        size += value.nbytes
        total += value.nbytes
    flush()
    if len(files) == 1:
        (folder / files[0][0]).rename(folder / "model.safetensors")
        return
    for index, (name, names) in enumerate(files, start=1):
        final = f"model-{index:05d}-of-{len(files):05d}.safetensors"
        (folder / name).rename(folder / final)
        weight_map.update(dict.fromkeys(names, final))
    _write_json(
        folder / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map}
    )


def export(
    tensors: Iterable[tuple[str, torch.Tensor]],
    arch: ModelArch,
    tokenizer_file: Path,
    eos_id: int,
    out: Path,
    tokenizer_dir: Path | None = None,
) -> Path:
    """Write ``out`` as a Hugging Face model directory, atomically (staging dir + rename), from
    the model's tensors as they are gathered one by one. ``tokenizer_dir``: the fine-tuned
    model's own tokenizer files, copied as they are (its special tokens and chat template); else
    the trained tokenizer with a config written for it."""
    with staged_directory(out) as staging:
        # A tied head is the embedding: the loader ties it again (safetensors refuses shared storage).
        write_weights(tensors, staging, skip=["lm_head.weight"] if arch.tie_embeddings else [])
        _write_json(staging / "config.json", hf_config(arch, eos_id))
        _write_json(
            staging / "generation_config.json",
            {"bos_token_id": eos_id, "eos_token_id": eos_id, "do_sample": True},
        )
        if tokenizer_dir is not None:
            copy_tokenizer(tokenizer_dir, staging)
            return out
        shutil.copyfile(tokenizer_file, staging / "tokenizer.json")
        _write_json(
            staging / "tokenizer_config.json",
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": EOS,
                "bos_token": EOS,
                "unk_token": EOS,
                "model_max_length": arch.max_seq_len,
                "clean_up_tokenization_spaces": False,
            },
        )
        _write_json(staging / "special_tokens_map.json", {"eos_token": EOS, "bos_token": EOS})
    return out


def copy_tokenizer(source: Path, target: Path) -> None:
    """A Hugging Face tokenizer's files, as they are (special tokens and chat template included)."""
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)


def _write_json(path: Path, payload: object) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n")


def arch_from_hf(directory: Path) -> ModelArch:
    """The architecture of a local Hugging Face LLaMA directory."""
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise InvalidSpec(
            f"model.path {directory} has no config.json",
            hint="give the folder of a Hugging Face-format model (config.json + model.safetensors)",
        )
    config = json.loads(config_path.read_text())
    if config.get("model_type") != "llama":
        raise InvalidSpec(
            f"model.path {directory} holds a {config.get('model_type')!r} model; "
            "Shipyard trains the LLaMA architecture",
            hint="use a LLaMA-family checkpoint or a preset",
        )
    rope = config.get("rope_parameters") or {}
    n_heads = config["num_attention_heads"]
    return ModelArch(
        dim=config["hidden_size"],
        n_layers=config["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads") or n_heads,
        ffn_dim=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        max_seq_len=config.get("max_position_embeddings", 2048),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        norm_eps=config.get("rms_norm_eps", 1e-5),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def load_model(directory: Path) -> Transformer:
    """A ``Transformer`` with the weights of a Hugging Face LLaMA directory."""
    from safetensors.torch import load_file

    arch = arch_from_hf(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise InvalidSpec(
            f"model.path {directory} has no .safetensors weights",
            hint="save the model with safe_serialization (the default of save_pretrained)",
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    model = Transformer(arch)
    if arch.tie_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (arch.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise InvalidSpec(
            f"weights in {directory} do not match a LLaMA model of its config "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})",
            hint="check that config.json belongs to these weights",
        )
    return model
