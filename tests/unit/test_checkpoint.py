"""The checkpointer in one process: atomic folders, the ``latest`` pointer, pruning, the
description beside the shards, and checkpoints of an earlier Shipyard."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from shipyard.errors import CheckpointError
from shipyard.schemas.launch import latest_checkpoint
from shipyard.schemas.training_spec import ParallelismSection
from shipyard.training import checkpoint
from shipyard.training.parallel import Dist
from tests.support.checkpoints import checkpoint_tensors

ALONE = Dist(
    rank=0,
    world_size=1,
    local_rank=0,
    device=torch.device("cpu"),
    layout=ParallelismSection(tp=1, dp_shard=1, dp_replicate=1),
)


def trained(value: float) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Linear(4, 2)
    with torch.no_grad():
        model.weight.fill_(value)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def save(directory: Path, step: int, keep: int = 2, *, background: bool = False) -> Path:
    model, optimizer = trained(float(step))
    saver = checkpoint.Checkpointer(directory, ALONE, keep)
    path = saver.save(step, model, optimizer, {"scheduler": {}}, {"format": "dcp"}, background=background)
    saver.wait()
    return path


def test_latest_names_the_newest_and_old_ones_are_pruned(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        save(tmp_path, step, background=step == 20)
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000030"
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000020", "step_000030"]
    description = json.loads((tmp_path / "step_000030" / "checkpoint.json").read_text())
    assert description["step"] == 30 and description["layout"] == {"tp": 1, "dp_shard": 1, "dp_replicate": 1}
    assert not list(tmp_path.glob("step_000030/.owner"))


def test_a_checkpoint_reads_back_into_a_fresh_model_and_optimizer(tmp_path: Path) -> None:
    path = save(tmp_path, 10)
    model, optimizer = trained(0.0)
    state = checkpoint.Checkpointer(tmp_path, ALONE, keep=2).load(path, model, optimizer)
    assert state["step"] == 10 and state["scheduler"] == {}
    expected = checkpoint_tensors(path)
    assert torch.equal(model.weight, expected["weight"])
    moments = checkpoint_tensors(path, "optimizer")
    assert torch.equal(optimizer.state[model.weight]["exp_avg"], moments["state.weight.exp_avg"])


def test_a_full_disk_mid_write_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save(tmp_path, 10)

    def disk_full(obj: object, f: Any) -> None:
        f.write(b"partial bytes")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device") as err:
        save(tmp_path, 20)
    assert "previous checkpoint is intact" in (err.value.hint or "")
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000010"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("step_")] == ["step_000010"]


def test_a_failed_background_write_is_raised_by_the_next_save_and_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save(tmp_path, 10)
    model, optimizer = trained(20.0)
    saver = checkpoint.Checkpointer(tmp_path, ALONE, keep=2)

    def killed(directory: Path, name: str) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(checkpoint, "_write_latest", killed)
    saver.save(20, model, optimizer, {}, {}, background=True)
    with pytest.raises(CheckpointError, match="Input/output error"):
        saver.wait()
    assert (tmp_path / "latest").read_text().strip() == "step_000010"
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000010"


def test_without_a_pointer_the_highest_complete_step_is_latest(tmp_path: Path) -> None:
    save(tmp_path, 10)
    save(tmp_path, 20)
    (tmp_path / "latest").unlink()
    (tmp_path / "step_000030.tmp").mkdir()  # a crashed write
    (tmp_path / "step_000040").mkdir()  # shards of another node, no description
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000020"


def test_an_earlier_shipyard_checkpoint_still_loads(tmp_path: Path) -> None:
    model, optimizer = trained(3.0)
    folder = tmp_path / "step_000003"
    folder.mkdir()
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 3, "scheduler": {}},
        folder / "state.pt",
    )
    fresh, fresh_optimizer = trained(0.0)
    state = checkpoint.Checkpointer(tmp_path, ALONE, keep=2).load(folder, fresh, fresh_optimizer)
    assert state["step"] == 3 and torch.equal(fresh.weight, model.weight)
    assert checkpoint.latest(tmp_path) == folder


def test_rng_state_round_trips() -> None:
    saved = checkpoint.rng_state()
    first = torch.rand(3)
    checkpoint.set_rng_state(saved)
    assert torch.equal(torch.rand(3), first)


def test_loading_a_non_checkpoint_says_what_to_give(tmp_path: Path) -> None:
    model, optimizer = trained(0.0)
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        checkpoint.Checkpointer(tmp_path, ALONE, keep=2).load(tmp_path, model, optimizer)
