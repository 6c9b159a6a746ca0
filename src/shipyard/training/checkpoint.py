"""Atomic, resumable checkpoints.

A checkpoint is a directory ``step_000123`` holding the model, optimizer, LR scheduler, data
position and every rank's RNG state. It is written as ``step_000123.tmp-PID``, fsynced, renamed,
and only then named in the ``latest`` file (itself replaced atomically). A crash or a full disk at
any point leaves the previous checkpoint as ``latest`` and no half-written directory under a
final name.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shipyard.errors import CheckpointError
from shipyard.schemas.launch import CHECKPOINT_BASE_FILE as BASE_FILE
from shipyard.schemas.launch import CHECKPOINT_POINTER as LATEST
from shipyard.schemas.launch import CHECKPOINT_STATE_FILE as STATE_FILE
from shipyard.schemas.launch import latest_checkpoint
from shipyard.training._atomic import fsync_dir, staged_directory

__all__ = ["latest", "load", "rng_state", "save", "set_rng_state", "step_dir_name"]


def latest(directory: Path) -> Path | None:
    """The newest complete checkpoint under ``directory``, or None."""
    return latest_checkpoint(directory)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def save(
    directory: Path, step: int, state: dict[str, Any], rng_by_rank: list[dict[str, Any]], keep: int
) -> Path:
    """Write one checkpoint atomically and prune all but the ``keep`` newest. Returns its path."""
    final = directory / step_dir_name(step)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with staged_directory(final) as staging:
            with open(staging / STATE_FILE, "wb") as f:
                torch.save({**state, "rng_by_rank": rng_by_rank}, f)
            if state.get("base_digest"):  # read at submit, where no torch is loaded
                (staging / BASE_FILE).write_text(json.dumps({"base_digest": state["base_digest"]}))
        _write_latest(directory, final.name)
    except OSError as exc:
        raise CheckpointError(
            f"could not write checkpoint {final}: {exc.strerror or exc}",
            hint="free disk space under the job's run directory; the previous checkpoint is intact",
        ) from exc
    _prune(directory, keep)
    return final


def _write_latest(directory: Path, name: str) -> None:
    tmp = directory / f".{LATEST}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / LATEST)
    fsync_dir(directory)


def load(path: Path) -> dict[str, Any]:
    target = path / STATE_FILE
    if not target.is_file():
        raise CheckpointError(
            f"{path} is not a checkpoint (no {STATE_FILE})",
            hint="resume from a job's checkpoint directory, e.g. RUN_DIR/checkpoints/step_000100",
        )
    try:
        state: dict[str, Any] = torch.load(target, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read: {exc}") from exc
    return state


def _prune(directory: Path, keep: int) -> None:
    steps = sorted(p for p in directory.glob("step_*") if ".tmp-" not in p.name)
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in directory.glob("step_*.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
