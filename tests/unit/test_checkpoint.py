from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import torch

from shipyard.errors import CheckpointError
from shipyard.training import checkpoint


def state(step: int) -> dict[str, Any]:
    return {"model": {"w": torch.full((4,), float(step))}, "step": step}


def save(directory: Path, step: int, keep: int = 2) -> Path:
    return checkpoint.save(directory, step, state(step), [checkpoint.rng_state()], keep=keep)


def test_latest_names_the_newest_and_old_ones_are_pruned(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        save(tmp_path, step)
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000030"
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000020", "step_000030"]
    assert checkpoint.load(tmp_path / "step_000030")["step"] == 30


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
    assert checkpoint.load(tmp_path / "step_000010")["model"]["w"].tolist() == [10.0] * 4


def test_a_crash_before_the_pointer_moves_leaves_the_old_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save(tmp_path, 10)

    def killed(directory: Path, name: str) -> None:
        raise KeyboardInterrupt  # the process dies between rename and pointer update

    monkeypatch.setattr(checkpoint, "_write_latest", killed)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 20)
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000010"


def test_without_a_pointer_the_highest_complete_step_is_latest(tmp_path: Path) -> None:
    save(tmp_path, 10)
    save(tmp_path, 20)
    (tmp_path / "latest").unlink()
    (tmp_path / "step_000030.tmp-123").mkdir()  # a crashed write
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000020"


def test_rng_state_round_trips() -> None:
    saved = checkpoint.rng_state()
    first = torch.rand(3)
    checkpoint.set_rng_state(saved)
    assert torch.equal(torch.rand(3), first)


def test_loading_a_non_checkpoint_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        checkpoint.load(tmp_path)
