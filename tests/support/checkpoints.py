"""Reading a run's checkpoints back whole, in the test process (for comparisons only)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from shipyard.training.checkpoint import read_whole


def checkpoint_tensors(checkpoint: Path, part: str = "model") -> dict[str, torch.Tensor]:
    """Every tensor of ``part`` (``model`` or ``optimizer``) of a checkpoint, whole, by name."""
    return read_whole(checkpoint, part)


def final_checkpoint(run_dir: Path) -> Path:
    return Path(json.loads((run_dir / "result.json").read_text())["checkpoint"])
