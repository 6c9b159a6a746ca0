"""What a finished attempt leaves behind: the Hugging Face export of its weights and the lineage
that says where they come from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from shipyard.durable import write_json_atomic
from shipyard.schemas.dataset_files import files_of
from shipyard.schemas.jobspec import JobSpec
from shipyard.schemas.records import conversation_pairs
from shipyard.training import finetune, hf
from shipyard.training.build import TrainedModel
from shipyard.training.data import TokenizedData
from shipyard.training.model import Transformer


def export(
    model: TrainedModel,
    tensors: Iterator[tuple[str, torch.Tensor]],
    spec: JobSpec,
    data: TokenizedData,
    tokenizer_dir: Path | None,
    out: Path,
) -> None:
    """Write ``tensors`` (the whole model's or its adapters') as a Hugging Face folder at ``out``."""
    if isinstance(model, Transformer):
        hf.export(tensors, model.arch, data.tokenizer_path, data.eos_id, out, tokenizer_dir)
    else:
        # The names are the wrapper's (``model.``...); PEFT and transformers name from within.
        inner = ((name.removeprefix("model."), value) for name, value in tensors)
        assert tokenizer_dir is not None and spec.model.path is not None
        finetune.export(model, inner, spec, Path(spec.model.path), tokenizer_dir, out)
    if spec.method is not None:
        fmt = {"data_format": spec.data.format}
        if spec.data.format == "preference":  # prompts as text, or through the chat template
            fmt["data_format"] = "chat" if conversation_pairs(files_of(spec.data)) else "text"
        write_json_atomic(out / finetune.PROMPT_FORMAT_FILE, fmt)


def lineage(spec: JobSpec, data: TokenizedData, base_digest: str | None, adapters: bool) -> dict[str, Any]:
    """Where the result comes from, beside the job's spec: the content of the base weights and
    of the data, and how the one was trained on the other."""
    found: dict[str, Any] = {"dataset_digest": data.digest, "data_format": spec.data.format}
    if spec.method is not None:
        found.update(base_model=spec.model.path, base_digest=base_digest, method=spec.method)
    if adapters and spec.finetune is not None:
        found["adapter"] = spec.finetune.lora.model_dump(mode="json")
    return found
