"""What a fine-tuning job's base model folder must be, checked at submit without loading it: a
causal language model, with the layers the adapters name, a chat template for chat data, and the
same weights a checkpoint to resume was trained on."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from shipyard.errors import InvalidSpec, Unschedulable
from shipyard.hardware.catalog import Catalog
from shipyard.schemas.dataset_files import files_of
from shipyard.schemas.jobspec import JobSpec
from shipyard.schemas.launch import CHECKPOINT_BASE_FILE, checkpoint_description
from shipyard.schemas.records import conversation_pairs
from shipyard.storage.digests import folder_digest

CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
"""How ``transformers`` names the classes of decoder models (``Qwen2ForCausalLM``, ``GPT2LMHeadModel``)."""
MAX_HEADER_BYTES = 100 << 20
"""A safetensors header far beyond any real model's (a 405 B model's is a few MB)."""
NOT_ADAPTABLE = ("embed", "lm_head", "wte", "wpe", "norm")
QLORA_VENDOR = "nvidia"
"""bitsandbytes' 4-bit NF4 kernels run on NVIDIA GPUs (CUDA) only."""


def check_base_model(spec: JobSpec, catalog: Catalog) -> None:
    folder = Path(spec.model.path or "")
    config = _config(folder)
    architectures = config.get("architectures") or []
    if architectures and not any(str(a).endswith(CAUSAL_SUFFIXES) for a in architectures):
        raise InvalidSpec(
            f"model.path {folder} holds a {architectures[0]}, not a causal language model",
            hint="fine-tune a decoder model (its config.json names a ...ForCausalLM architecture)",
        )
    if spec.weights == "qlora":
        _refuse_qlora_without_cuda(spec, catalog)
    if spec.finetune and spec.adapters and spec.finetune.lora.target_modules:
        present = linear_layer_names(folder)
        missing = [t for t in spec.finetune.lora.target_modules if t not in present]
        if present and missing:
            raise InvalidSpec(
                f"finetune.lora.target_modules {missing} are not layers of {folder}",
                hint=f"its linear layers are {', '.join(sorted(present))}",
            )
    conversations = spec.data.format == "preference" and conversation_pairs(files_of(spec.data))
    if spec.data.format == "chat" or conversations:
        tokenizer = Path(spec.data.tokenizer.path or folder)
        if not has_chat_template(tokenizer):
            raise InvalidSpec(
                f"data.format chat renders conversations with the model's chat template, and "
                f"{tokenizer} has none",
                hint="fine-tune a chat model (chat_template in tokenizer_config.json), or use "
                "data.format: instruction",
            )


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise InvalidSpec(
            f"model.path {folder} is not a Hugging Face model folder (no config.json)",
            hint="give the folder that save_pretrained or a Shipyard export wrote",
        )
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidSpec(
            f"model.path {folder}: config.json is not JSON ({exc})", hint="restore the file"
        ) from None
    if not isinstance(config, dict):
        raise InvalidSpec(f"model.path {folder}: config.json is not a JSON object", hint="restore the file")
    return config


def _refuse_qlora_without_cuda(spec: JobSpec, catalog: Catalog) -> None:
    if any(catalog[a].vendor == QLORA_VENDOR for a in spec.resources.accelerator if a in catalog):
        return
    raise Unschedulable(
        f"qlora quantizes the base weights with bitsandbytes' NF4 kernels, which need an NVIDIA "
        f"GPU; resources.accelerator {spec.resources.accelerator} lists none",
        hint="use finetune.method: lora on these devices (16-bit base weights), or list an NVIDIA "
        "type (e.g. rtx-4090, a100-80gb, h100-sxm) in resources.accelerator",
    )


def linear_layer_names(folder: Path) -> set[str]:
    """The last names of the layers with 2-D weights in the folder's safetensors files, read from
    their headers (embeddings, norms and the output head aside): what adapters can target."""
    names: set[str] = set()
    for file in sorted(folder.glob("*.safetensors")):
        for key, entry in _header(file).items():
            if key == "__metadata__" or not isinstance(entry, dict) or len(entry.get("shape", [])) != 2:
                continue
            module = key.removesuffix(".weight")
            last = module.rsplit(".", 1)[-1]
            if module != key and not any(word in module for word in NOT_ADAPTABLE):
                names.add(last)
    return names


def _header(file: Path) -> dict[str, object]:
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            return {}
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER_BYTES:
            return {}
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return {}
    return header if isinstance(header, dict) else {}


def has_chat_template(tokenizer: Path) -> bool:
    if (tokenizer / "chat_template.jinja").is_file():
        return True
    config = tokenizer / "tokenizer_config.json"
    try:
        return bool(json.loads(config.read_text()).get("chat_template")) if config.is_file() else False
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def check_resume_base(spec: JobSpec, checkpoint: Path) -> None:
    """A checkpoint resumes only onto the base weights it was trained from: adapters on other
    weights would train on, silently, to a different model."""
    written_on = checkpoint_description(checkpoint).get("base_digest")
    legacy = checkpoint / CHECKPOINT_BASE_FILE  # an earlier Shipyard's
    if written_on is None and legacy.is_file():
        written_on = json.loads(legacy.read_text()).get("base_digest")
    if not spec.model.path or not written_on:
        return
    now = folder_digest(Path(spec.model.path))
    if written_on and written_on != now:
        raise InvalidSpec(
            f"checkpoint {checkpoint} was trained on other weights than {spec.model.path} holds now "
            f"(base digest {written_on[:12]}, now {now[:12]})",
            hint="resume onto the model folder it was trained from, or submit without --resume",
        )
