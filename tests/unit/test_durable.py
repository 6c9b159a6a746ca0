"""The one durable-write helper: a reader sees the old file or the whole new one, and a write that
fails midway leaves the old file and no temporary one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shipyard.durable import write_json_atomic, write_text_atomic


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "state.json"
    write_json_atomic(target, {"step": 1})
    write_json_atomic(target, {"step": 2})
    assert json.loads(target.read_text()) == {"step": 2}
    assert [p.name for p in target.parent.iterdir()] == ["state.json"]


def test_a_write_that_fails_before_the_rename_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "pointer"
    write_text_atomic(target, "step_000010")

    def full_disk(_descriptor: int) -> None:  # the disk filling up as the data is flushed
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(target, "step_000020")
    assert target.read_text() == "step_000010"
    assert [p.name for p in tmp_path.iterdir()] == ["pointer"]
