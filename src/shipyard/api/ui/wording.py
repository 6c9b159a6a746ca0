"""Settings in words: what differs between runs (or model versions) said as a person would read
it — "Learning rate: 3e-4 / 1e-3" — not as dotted keys and 16-digit floats."""

from __future__ import annotations

from typing import Any

from shipyard.services.models.models import flatten

LABELS = {
    "model.preset": "Model",
    "model.path": "Model folder",
    "model.name": "Model",
    "data.paths": "Data",
    "data.dataset": "Dataset",
    "data.format": "Data format",
    "training.steps": "Steps",
    "training.tokens": "Tokens to train on",
    "training.global_batch_tokens": "Global batch (tokens)",
    "training.micro_batch_size": "Micro-batch (sequences)",
    "training.seq_len": "Sequence length (tokens)",
    "training.precision": "Precision",
    "training.parallelism": "Parallelism",
    "training.seed": "Seed",
    "training.eval_interval": "Evaluate every (steps)",
    "training.log_interval": "Log every (steps)",
    "training.activation_checkpointing": "Activation checkpointing",
    "training.optimizer.lr": "Learning rate",
    "training.optimizer.min_lr": "Final learning rate",
    "training.optimizer.warmup_steps": "Warm-up (steps)",
    "training.optimizer.schedule": "Learning-rate schedule",
    "training.optimizer.weight_decay": "Weight decay",
    "training.optimizer.grad_clip": "Gradient clipping (norm)",
    "training.optimizer.name": "Optimizer",
    "training.optimizer.beta1": "Adam β1",
    "training.optimizer.beta2": "Adam β2",
    "finetune.method": "Fine-tuning method",
    "finetune.lora.rank": "LoRA rank",
    "finetune.lora.alpha": "LoRA alpha",
    "finetune.lora.dropout": "LoRA dropout",
    "finetune.lora.targets": "LoRA targets",
    "resources.accelerator": "Accelerator",
    "resources.devices": "Devices",
    "resources.nodes": "Nodes",
    "checkpoint.interval": "Checkpoint every (steps)",
    "checkpoint.keep": "Checkpoints kept",
    "queue": "Queue",
    "project": "Project",
    "priority": "Priority",
    "metrics.train_loss_start": "First training loss",
    "metrics.train_loss_end": "Final training loss",
    "metrics.train_loss": "Final training loss",
    "metrics.eval_loss_start": "First eval loss",
    "metrics.eval_loss_end": "Final eval loss",
    "metrics.eval_loss": "Final eval loss",
    "metrics.wall_s": "Training time (s)",
    "metrics.tokens_per_s": "Tokens per second",
    "metrics.mfu": "MFU (fraction of peak)",
    "metrics.memory_gib": "Peak memory (GiB)",
    "metrics.params": "Parameters",
    "path": "Stored as",
}
IGNORED = {"name", "apiVersion", "created_at", "job", "version", "model"}
"""Keys no reader compares runs by (names, references) or shown elsewhere on the page."""
IGNORED_PREFIXES = ("estimate.",)
"""The planner's internals."""


def label(key: str) -> str:
    """A dotted setting in words; an unknown one as its parts (``training › optimizer › eps``)."""
    for prefix in ("spec.", "settings."):
        key = key.removeprefix(prefix)
    return LABELS.get(key) or " › ".join(part.replace("_", " ") for part in key.split("."))


def value(raw: Any) -> str:
    """A setting's value as text: floats to four significant digits, lists joined, none as –."""
    if raw is None:
        return "–"
    if isinstance(raw, bool):
        return "yes" if raw else "no"
    if isinstance(raw, float):
        return f"{raw:.4g}"
    if isinstance(raw, int):
        return f"{raw:,}"
    if isinstance(raw, list):
        return ", ".join(value(item) for item in raw) or "–"
    return str(raw)


def differences(documents: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The settings whose values differ between the documents, in words, in document order."""
    flat = [_flat_settings(document) for document in documents]
    keys = list(dict.fromkeys(key for one in flat for key in one))
    rows = []
    for key in keys:
        if key in IGNORED or key.removeprefix("spec.").startswith(IGNORED_PREFIXES):
            continue
        values = [one.get(key) for one in flat]
        if any(v != values[0] for v in values[1:]):
            rows.append((label(key), [value(v) for v in values]))
    return rows


def _flat_settings(document: dict[str, Any]) -> dict[str, Any]:
    """Flattened, but lists of plain values kept whole (``data.paths`` is one setting)."""
    out: dict[str, Any] = {}
    for key, item in flatten(document).items():
        head, _, last = key.rpartition(".")
        if last.isdigit() and head:
            out.setdefault(head, []).append(item)
        else:
            out[key] = item
    return out
