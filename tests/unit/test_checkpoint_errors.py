"""A checkpoint that cannot be loaded says why: another model's (with what to resume onto), or
files that cannot be read (with where else to resume from). torch.distributed.checkpoint raises a
``CheckpointException``, a ``BaseException``, carrying each rank's own error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from shipyard.errors import CheckpointError
from shipyard.schemas.training_spec import ParallelismSection
from shipyard.training import checkpoint, parallel


def _saved(tmp_path: Path) -> tuple[checkpoint.Checkpointer, Path]:
    d = parallel.init(torch.device("cpu"), ParallelismSection())
    model = nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    keeper = checkpoint.Checkpointer(tmp_path / "checkpoints", d, keep=2)
    path = keeper.save(1, model, optimizer, {"scheduler": {}}, {"format": "dcp"}, background=False)
    keeper.close()
    return keeper, path


def test_another_models_checkpoint_is_said_not_to_fit(tmp_path: Path) -> None:
    keeper, path = _saved(tmp_path)
    wider = nn.Linear(4, 8)
    with pytest.raises(CheckpointError, match=r"does not fit this model: Size mismatch") as refused:
        keeper.load(path, wider, torch.optim.AdamW(wider.parameters()))
    assert "resume onto the model" in (refused.value.hint or "")


def test_damaged_files_are_said_unreadable(tmp_path: Path) -> None:
    keeper, path = _saved(tmp_path)
    for shard in path.glob("*.distcp"):
        shard.write_bytes(b"not a checkpoint")
    model = nn.Linear(4, 4)
    with pytest.raises(CheckpointError, match="cannot be read") as refused:
        keeper.load(path, model, torch.optim.AdamW(model.parameters()))
    assert "damaged or incomplete" in (refused.value.hint or "")
